//! Every Lua script the Redis backend runs, election and coordination alike,
//! each under a name, and the one codec of the stored value
//! `<token>|<fencing>|<identity or owner>`.
//!
//! Scripts validate first and write last, so a refusal leaves no trace.
//! Answers are documented per script; the Rust side reads them in
//! the election ([`super::RedisBackend`]) and [`super::coord`].

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::coord::promoted::HOLD;
use super::lua_campaign::CAMPAIGN;
use super::lua_ops::{CANDIDATE_LIST, CANDIDATE_PUBLISH, CANDIDATE_WITHDRAW};
use super::lua_rw::{RW, RW_GIVE_UP, RW_READ, RW_READ_RENEW, RW_UNREAD, RW_WRITE};
use super::lua_sem::{SEM_ACQUIRE, SEM_LIVE, SEM_RELEASE, SEM_RENEW, SIZE, SLOT_LOCK, SLOTS};
use super::lua_shards::{
    SHARD_ACQUIRE, SHARD_CLOSE, SHARD_OPEN, SHARD_READ, SHARD_RELEASE, SHARD_RENEW, SHARDS,
};
use super::roster::{ROSTER_APPLICANTS, ROSTER_APPLY, ROSTER_READ, ROSTER_WITHDRAW};

/// Most digits a fencing counter may have, in every script. Redis runs Lua
/// 5.1, whose numbers are doubles: integers are exact up to 2^53
/// (9 007 199 254 740 992, 16 digits), so every integer of at most 15 digits
/// and its successor are exact, and a script never rounds a counter it
/// compares, raises or counts past. A counter of more digits (or not a
/// non-negative integer) was written by someone else: refused, never wrapped
/// or rounded. Counters start at the server's clock in milliseconds (13
/// digits), so the limit is never reached by counting.
pub const COUNTER_DIGITS: usize = 15;

/// Shared prelude of every script (after `COUNTER_DIGITS`, set from the
/// constant of that name): `now_ms()` is the server's clock in milliseconds;
/// `counter_ok(c)` accepts a counter value that is absent (`false`) or a
/// non-negative integer of at most `COUNTER_DIGITS` digits; `fence_ok(fkey)`
/// answers `true` for a usable counter at `fkey`, else `false, value`;
/// `fence_next(fkey)` sets the counter to max(counter + 1, `now_ms()`) and
/// answers it (the election's rule: across a restart without persistence
/// or a failover to a replica that missed the last raise, the next token
/// is still larger than the lost ones while those were not ahead of this
/// server's clock); `mine(value,
/// token)` is whether a stored value carries `token`.
const FENCE: &str = r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function counter_ok(c)
  return c == false or (string.match(c, '^%d+$') ~= nil and string.len(c) <= COUNTER_DIGITS)
end
local function fence_ok(fkey)
  local c = redis.call('GET', fkey)
  if counter_ok(c) then return true, nil end
  return false, c
end
local function fence_next(fkey)
  local n = math.max(tonumber(redis.call('GET', fkey) or '0') + 1, now_ms())
  redis.call('SET', fkey, string.format('%.0f', n))
  return n
end
local function mine(value, token)
  return value and string.sub(value, 1, string.len(token) + 1) == token .. '|'
end
";

/// Election renew. KEYS: key, 2 the pause marker and 3 the switchover
/// request (read by [`RENEW_TAIL`]), and with failsafe 4 the fencing
/// counter, 5 the roster key. ARGV: 1 token, 2 TTL in ms, 3 the value to put back
/// where the key is gone (never over someone else's; '' none: one server
/// without failsafe), and with failsafe ([`super::roster`]) 4 our fencing
/// token: put back only while the counter still holds it, so no term began
/// since ('' unguarded: Redlock's put-back), 5 the roster JSON written with
/// the renewal ('' none). Answers 1 renewed, 2 put back, 0 gone, -1
/// someone else's.
const ELECTION_RENEW: &str = r"
local function failsafe_roster()
  if ARGV[5] and ARGV[5] ~= '' then redis.call('SET', KEYS[5], ARGV[5]) end
end
local current = redis.call('GET', KEYS[1])
if not current then
  local guard = ARGV[4] and ARGV[4] ~= ''
  if ARGV[3] ~= '' and (not guard or redis.call('GET', KEYS[4]) == ARGV[4]) then
    redis.call('SET', KEYS[1], ARGV[3], 'NX', 'PX', ARGV[2])
    failsafe_roster()
    return 2
  end
  return 0
end
if not mine(current, ARGV[1]) then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
failsafe_roster()
return 1
";

/// The election renew's answer carries the operator controls: the source
/// runs [`ELECTION_RENEW`] as a function and answers `{code, paused,
/// switchover}` — its 1 / 2 / 0 / -1, 1 when the pause marker (KEYS[2])
/// exists else 0, and the switchover request (KEYS[3]; nil: none). A hand
/// edit of a control key publishes nothing; the leader sees it in its next
/// renewal's answer ([`super::controls`]).
const RENEW_HEAD: &str = "local function renew()\n";
/// See [`RENEW_HEAD`].
const RENEW_TAIL: &str = "
end
local code = renew()
return {code, redis.call('EXISTS', KEYS[2]), redis.call('GET', KEYS[3])}
";

/// Redlock, after a quorum granted: raise the fencing counter (KEYS[2]) to at
/// least ARGV[1] and write ARGV[3] over our value of KEYS[1] (token ARGV[2]),
/// keeping its TTL. Answers 1, or -1 for a counter that is not ours to raise.
const RAISE: &str = r"
local c = redis.call('GET', KEYS[2])
if not counter_ok(c) then return -1 end
if tonumber(c or '0') < tonumber(ARGV[1]) then redis.call('SET', KEYS[2], ARGV[1]) end
if mine(redis.call('GET', KEYS[1]), ARGV[2]) then
  redis.call('SET', KEYS[1], ARGV[3], 'XX', 'KEEPTTL')
end
return 1
";

/// Release. KEYS: key, successor marker (election only). ARGV: 1 token,
/// 2 channel, 3 message, 4 successor ('' or absent: none), 5 its wait in
/// ms. Deletes the key when it carries the token, sets the successor
/// marker (same step: no campaign sees the key free without it), and
/// publishes `ARGV[3]` (or the old value when empty) on the channel.
/// Answers 1 released, 0 gone, -1 someone else's.
const RELEASE: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
if not mine(current, ARGV[1]) then return -1 end
if ARGV[4] and ARGV[4] ~= '' then redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5]) end
redis.call('DEL', KEYS[1])
if ARGV[3] == '' then
  redis.call('PUBLISH', ARGV[2], current)
else
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
";

/// Lock (and Redlock semaphore slot). KEYS: key, counter. ARGV: token, owner,
/// TTL in ms. Answers `{1, fencing}`, `{0, value}` held, `{-2, counter}` bad.
const LOCK: &str = r"
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local f = fence_next(KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
return {1, f}
";

/// Renew of a lock, slot or claim. KEYS: key. ARGV: token, TTL in ms.
/// Answers 1 renewed, 0 gone, -1 someone else's; never re-creates.
const RENEW: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
if not mine(current, ARGV[1]) then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// Job claim: [`LOCK`] on the claim unless the job is done. KEYS: claim,
/// counter, done. ARGV: token, owner, TTL in ms. Answers as [`LOCK`], or
/// `{2}` completed.
const CLAIM: &str = r"
if redis.call('EXISTS', KEYS[3]) == 1 then return {2} end
";

/// Job completion. KEYS: claim, done. ARGV: token, retention in ms. Answers
/// 1 completed (now or before), -1 someone else's, 0 gone.
const COMPLETE: &str = r"
local current = redis.call('GET', KEYS[1])
if mine(current, ARGV[1]) then
  redis.call('SET', KEYS[2], current, 'PX', ARGV[2])
  redis.call('DEL', KEYS[1])
  return 1
end
local done = redis.call('GET', KEYS[2])
if mine(done, ARGV[1]) then return 1 end
if current or done then return -1 end
return 0
";

/// The scripts by name. Each is loaded once per process (`EVALSHA`, falling
/// back to `EVAL` on a server that does not know it yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lua {
    /// The election's campaign (`CAMPAIGN`).
    Campaign,
    /// The election's renewal, which puts a Redlock copy back (`ELECTION_RENEW`).
    ElectionRenew,
    /// Redlock's raise of the fencing counter after a grant (`RAISE`).
    Raise,
    /// A check-and-delete release that publishes on a channel (`RELEASE`).
    Release,
    /// A lock, or a slot of a Redlock semaphore without its size (`LOCK`).
    Lock,
    /// The renewal of a lock, slot or claim (`RENEW`).
    Renew,
    /// The live permits of a one-server semaphore (`SEM_LIVE`).
    SemLive,
    /// A permit of a one-server semaphore (`SEM_ACQUIRE`).
    SemAcquire,
    /// The renewal of a one-server permit (`SEM_RENEW`).
    SemRenew,
    /// The release of a one-server permit (`SEM_RELEASE`).
    SemRelease,
    /// The taken slots of a Redlock semaphore (`SLOTS`).
    Slots,
    /// A slot of a Redlock semaphore (`SLOT_LOCK`).
    SlotLock,
    /// A job claim (`CLAIM`).
    Claim,
    /// A job's completion (`COMPLETE`).
    Complete,
    /// A reader of a read-write lock (`RW_READ`).
    RwRead,
    /// The writer of a read-write lock (`RW_WRITE`).
    RwWrite,
    /// A reader's renewal (`RW_READ_RENEW`).
    RwReadRenew,
    /// A reader's release (`RW_UNREAD`).
    RwUnread,
    /// A waiting writer's intent removed (`RW_GIVE_UP`).
    RwGiveUp,
    /// A candidate record written or renewed (`CANDIDATE_PUBLISH`).
    CandidatePublish,
    /// A candidate record removed (`CANDIDATE_WITHDRAW`).
    CandidateWithdraw,
    /// The candidate records (`CANDIDATE_LIST`).
    CandidateList,
    /// The failsafe roster and the server's persistence (`ROSTER_READ`).
    RosterRead,
    /// A failsafe application written or renewed (`ROSTER_APPLY`).
    RosterApply,
    /// The live failsafe applications (`ROSTER_APPLICANTS`).
    RosterApplicants,
    /// A failsafe application withdrawn (`ROSTER_WITHDRAW`).
    RosterWithdraw,
    /// A shard session opened (`SHARD_OPEN`).
    ShardOpen,
    /// A shard session and its records renewed (`SHARD_RENEW`).
    ShardRenew,
    /// A shard taken (`SHARD_ACQUIRE`).
    ShardAcquire,
    /// A shard given back (`SHARD_RELEASE`).
    ShardRelease,
    /// A shard session ended (`SHARD_CLOSE`).
    ShardClose,
    /// The shard members and records (`SHARD_READ`).
    ShardRead,
}

const ALL: [Lua; 32] = [
    Lua::Campaign,
    Lua::ElectionRenew,
    Lua::Raise,
    Lua::Release,
    Lua::Lock,
    Lua::Renew,
    Lua::SemLive,
    Lua::SemAcquire,
    Lua::SemRenew,
    Lua::SemRelease,
    Lua::Slots,
    Lua::SlotLock,
    Lua::Claim,
    Lua::Complete,
    Lua::RwRead,
    Lua::RwWrite,
    Lua::RwReadRenew,
    Lua::RwUnread,
    Lua::RwGiveUp,
    Lua::CandidatePublish,
    Lua::CandidateWithdraw,
    Lua::CandidateList,
    Lua::RosterRead,
    Lua::RosterApply,
    Lua::RosterApplicants,
    Lua::RosterWithdraw,
    Lua::ShardOpen,
    Lua::ShardRenew,
    Lua::ShardAcquire,
    Lua::ShardRelease,
    Lua::ShardClose,
    Lua::ShardRead,
];

static SCRIPTS: LazyLock<Vec<Script>> =
    LazyLock::new(|| ALL.iter().map(|s| Script::new(&s.source())).collect());

impl Lua {
    fn body(self) -> &'static str {
        match self {
            Lua::Campaign => CAMPAIGN,
            Lua::ElectionRenew => ELECTION_RENEW,
            Lua::Raise => RAISE,
            Lua::Release => RELEASE,
            Lua::Lock => LOCK,
            Lua::Renew => RENEW,
            Lua::SemLive => SEM_LIVE,
            Lua::SemAcquire => SEM_ACQUIRE,
            Lua::SemRenew => SEM_RENEW,
            Lua::SemRelease => SEM_RELEASE,
            Lua::Slots => SLOTS,
            Lua::SlotLock => SLOT_LOCK,
            Lua::Claim => CLAIM,
            Lua::Complete => COMPLETE,
            Lua::RwRead => RW_READ,
            Lua::RwWrite => RW_WRITE,
            Lua::RwReadRenew => RW_READ_RENEW,
            Lua::RwUnread => RW_UNREAD,
            Lua::RwGiveUp => RW_GIVE_UP,
            Lua::CandidatePublish => CANDIDATE_PUBLISH,
            Lua::CandidateWithdraw => CANDIDATE_WITHDRAW,
            Lua::CandidateList => CANDIDATE_LIST,
            Lua::RosterRead => ROSTER_READ,
            Lua::RosterApply => ROSTER_APPLY,
            Lua::RosterApplicants => ROSTER_APPLICANTS,
            Lua::RosterWithdraw => ROSTER_WITHDRAW,
            Lua::ShardOpen => SHARD_OPEN,
            Lua::ShardRenew => SHARD_RENEW,
            Lua::ShardAcquire => SHARD_ACQUIRE,
            Lua::ShardRelease => SHARD_RELEASE,
            Lua::ShardClose => SHARD_CLOSE,
            Lua::ShardRead => SHARD_READ,
        }
    }

    /// Whether `answer` reports a write that a grant, a renewal or a
    /// fencing-counter raise rests on: with `--redis-min-replicas` it counts
    /// only once that many replicas acknowledged it (`WAIT`). Refusals,
    /// releases, completions and reads wait for nobody.
    pub fn grants(self, answer: &Value) -> bool {
        let first_is_1 =
            || matches!(answer, Value::Array(v) if matches!(v.first(), Some(Value::Int(1))));
        match self {
            Lua::Campaign
            | Lua::Lock
            | Lua::SlotLock
            | Lua::Claim
            | Lua::SemAcquire
            | Lua::RwRead
            | Lua::RwWrite
            | Lua::ShardAcquire => first_is_1(),
            // 2: put back on a Redlock server that had lost the key; the
            // code comes first, the controls after it (`RENEW_TAIL`).
            Lua::ElectionRenew => {
                matches!(answer, Value::Array(v) if matches!(v.first(), Some(Value::Int(1 | 2))))
            }
            Lua::Raise | Lua::Renew | Lua::SemRenew | Lua::RwReadRenew | Lua::ShardRenew => {
                matches!(answer, Value::Int(1))
            }
            Lua::Release
            | Lua::SemRelease
            | Lua::SemLive
            | Lua::Slots
            | Lua::Complete
            | Lua::RwUnread
            | Lua::RwGiveUp
            | Lua::CandidatePublish
            | Lua::CandidateWithdraw
            | Lua::CandidateList
            | Lua::RosterRead
            | Lua::RosterApply
            | Lua::RosterApplicants
            | Lua::RosterWithdraw
            | Lua::ShardOpen
            | Lua::ShardRelease
            | Lua::ShardClose
            | Lua::ShardRead => false,
        }
    }

    /// Whether the script can write a grant, a renewal or a raise (some
    /// answer of it [`Lua::grants`]).
    pub fn may_grant(self) -> bool {
        !matches!(
            self,
            Lua::Release
                | Lua::SemRelease
                | Lua::SemLive
                | Lua::Slots
                | Lua::Complete
                | Lua::RwUnread
                | Lua::RwGiveUp
                | Lua::CandidatePublish
                | Lua::CandidateWithdraw
                | Lua::CandidateList
                | Lua::RosterRead
                | Lua::RosterApply
                | Lua::RosterApplicants
                | Lua::RosterWithdraw
                | Lua::ShardOpen
                | Lua::ShardRelease
                | Lua::ShardClose
                | Lua::ShardRead
        )
    }

    /// The script's source (the shared prelude plus the body), for `EVAL`
    /// inside a pipeline.
    pub fn source(self) -> String {
        let prelude = format!("local COUNTER_DIGITS = {COUNTER_DIGITS}\n{FENCE}");
        // Coordination grants wait out a promotion first (`HOLD`).
        let hold = if self.holds_off() { HOLD } else { "" };
        match self {
            Lua::Claim => format!("{prelude}{hold}{CLAIM}{LOCK}"),
            Lua::Slots | Lua::SlotLock => format!("{prelude}{SIZE}{hold}{}", self.body()),
            Lua::RwRead | Lua::RwWrite | Lua::RwReadRenew | Lua::RwUnread | Lua::RwGiveUp => {
                format!("{prelude}{RW}{hold}{}", self.body())
            }
            Lua::ElectionRenew => format!("{prelude}{RENEW_HEAD}{}{RENEW_TAIL}", self.body()),
            Lua::ShardOpen
            | Lua::ShardRenew
            | Lua::ShardAcquire
            | Lua::ShardRelease
            | Lua::ShardClose
            | Lua::ShardRead => format!("{prelude}{SHARDS}{}", self.body()),
            _ => format!("{prelude}{hold}{}", self.body()),
        }
    }

    /// Whether the script is a coordination grant, which takes the
    /// promotion marker as its last key (`super::coord::promoted`).
    pub fn holds_off(self) -> bool {
        matches!(
            self,
            Lua::Lock | Lua::SlotLock | Lua::Claim | Lua::SemAcquire | Lua::RwRead | Lua::RwWrite
        )
    }

    /// The compiled script (the shared prelude plus the body).
    pub fn script(self) -> &'static Script {
        &SCRIPTS[self as usize]
    }
}

/// The value stored under an election or coordination key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Random per term or grant; proves ownership.
    pub token: String,
    /// The fencing token of the term or grant.
    pub fencing: u64,
    /// The candidate's identity, or the client's owner label (may hold `|`).
    pub owner: String,
}

impl Stored {
    /// Encode as `<token>|<fencing>|<owner>`.
    pub fn encode(&self) -> String {
        format!("{}|{}|{}", self.token, self.fencing, self.owner)
    }

    /// Parse `<token>|<fencing>|<owner>`; missing parts are empty (fencing 0).
    pub fn parse(value: &str) -> Stored {
        let mut parts = value.splitn(3, '|');
        Stored {
            token: parts.next().unwrap_or("").to_owned(),
            fencing: parts.next().and_then(|f| f.parse().ok()).unwrap_or(0),
            owner: parts.next().unwrap_or("").to_owned(),
        }
    }
}

/// A duration as a script's millisecond argument (at least 1).
pub fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_with_pipes_in_the_owner() {
        let s = Stored::parse("abc|42|pod|x");
        assert_eq!(s.token, "abc");
        assert_eq!(s.fencing, 42);
        assert_eq!(s.owner, "pod|x");
        assert_eq!(s.encode(), "abc|42|pod|x");
    }

    #[test]
    fn only_grants_renewals_and_raises_wait_for_replicas() {
        let granted = Value::Array(vec![Value::Int(1), Value::Int(42)]);
        let held = Value::Array(vec![Value::Int(0), Value::Int(3)]);
        assert!(Lua::Campaign.grants(&granted) && Lua::Lock.grants(&granted));
        assert!(!Lua::Campaign.grants(&held) && !Lua::SemAcquire.grants(&held));
        let put_back = Value::Array(vec![Value::Int(2), Value::Int(0), Value::Nil]);
        assert!(Lua::ElectionRenew.grants(&put_back));
        assert!(!Lua::ElectionRenew.grants(&Value::Array(vec![Value::Int(0)])));
        assert!(!Lua::Renew.grants(&Value::Int(0)) && !Lua::Renew.grants(&Value::Int(-1)));
        assert!(Lua::Raise.grants(&Value::Int(1)));
        assert!(!Lua::Release.grants(&Value::Int(1)) && !Lua::Complete.grants(&Value::Int(1)));
        for s in ALL.iter().filter(|s| !s.may_grant()) {
            assert!(!s.grants(&granted) && !s.grants(&Value::Int(1)), "{s:?}");
        }
    }

    #[test]
    fn one_counter_rule_holds_exactly_in_a_lua_number() {
        // The largest accepted counter and its successor are exact doubles.
        let largest = 10u64.pow(COUNTER_DIGITS as u32) - 1;
        assert!(largest < 1 << 53);
        assert_eq!((largest + 1) as f64 as u64, largest + 1);
        for s in ALL {
            let src = s.source();
            assert!(src.starts_with(&format!("local COUNTER_DIGITS = {COUNTER_DIGITS}\n")));
            // No script checks a counter's length on its own.
            assert_eq!(src.matches("string.len(c)").count(), 1, "{s:?}");
        }
    }

    #[test]
    fn every_script_has_its_own_body() {
        for (i, s) in ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
        }
    }
}
