//! The promotion hold-off of coordination grants (locks, semaphore permits,
//! read-write locks, job claims) on Redis with replicas: Sentinel, Cluster,
//! or any primary that was promoted from a replica.
//!
//! Replication is asynchronous: a replica promoted after its primary died
//! or froze may lack a grant the old primary made, and would grant the
//! object again at once (two holders). So every grant script first runs
//! [`HOLD`] on a **promotion marker** `<replid>|<since ms>|<last end ms>`:
//! - the marker is per server (one key, `<prefix>coord-promoted`) on a
//!   single server, a Sentinel primary or a Redlock member, and **per slot**
//!   on a Cluster (`<prefix>{coord~<n>}:coord-promoted`, `n` chosen so the
//!   tag hashes to the object's slot: a script may touch one slot only). Not
//!   per object: an object's first grant never waits on a server whose
//!   marker is current;
//! - a primary never promoted (`master_replid2` all zeros) writes
//!   `<replid>|0|<TTL>` at its first grant and never waits;
//! - a primary whose `master_replid` differs from the marker's (it was
//!   promoted since: every promotion makes a new id), or that has no marker
//!   but was promoted, records `since` = now at the first grant attempt on
//!   it and refuses grants until the latest end of any grant recorded (the
//!   marker's `last end`, replicated from the old primary) or `since` + the
//!   TTL asked, whichever is later, + 1 s: by then every grant the old
//!   primary made that reached the replica has run out, and so has a lost
//!   one made just before the failover with a TTL up to the ones recorded
//!   or asked (clients ask one object for one TTL);
//! - every grant raises `last end` to its own end (now + TTL) when that is
//!   later: a write inside the grant script, which writes anyway. The end
//!   of a grant, not the longest TTL ever asked, so a 24 h job claim made
//!   last month does not hold every grant off for 24 h after a failover.
//!
//! The Rust side passes the marker as the script's last key, so the cost at
//! rest is nil in round trips: one `INFO replication` and one `GET` inside
//! the grant script (+16–24 µs p50 per grant with `redis-benchmark`, see
//! the book's Redis with Sentinel or Cluster page). Chosen over a
//! candidate-side hold-off on each sidecar's clock (the election's second
//! guard): a coordination client may ask any sidecar, and a sidecar that
//! never saw the old primary would not wait; the marker makes every client
//! wait on the server that matters. What it does not cover: a lost grant
//! that would end later than every grant that reached the replica and than
//! the asked TTL from the promotion, a jump of
//! the promoted server's clock, and a restart without persistence (no
//! replica promoted: no new id recorded against an old marker).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use crate::backend::coordination::CoordError;
use crate::backend::redis::conn::slot;
use crate::backend::redis::group::Round;

/// The marker's suffix; [`HOLD`] refuses any other last key.
const SUFFIX: &str = "coord-promoted";

/// Lua prelude of every coordination grant script, run first with
/// `KEYS[#KEYS]` = the marker and `ARGV[3]` = the TTL asked (ms). Answers
/// `{3, wait_ms}` (nothing granted) while the hold-off runs.
pub(in crate::backend::redis) const HOLD: &str = r"
local function held_off(mkey, ttl)
  if string.sub(mkey, -14) ~= 'coord-promoted' then
    error({err = 'ERR the last key of a grant must be its promotion marker, not ' .. mkey})
  end
  local repl = redis.call('INFO', 'replication')
  if string.match(repl, 'role:(%a+)') ~= 'master' then return 0 end
  local replid = string.match(repl, 'master_replid:(%x+)') or ''
  local now = now_ms()
  local mark = redis.call('GET', mkey)
  local id, since, last
  if mark then id, since, last = string.match(mark, '^(%x+)|(%d+)|(%d+)$') end
  last = tonumber(last or '0') or 0
  if id == replid and since then
    since = tonumber(since)
  elseif not mark and string.match(repl, 'master_replid2:0+[\r\n]') then
    since = 0
  else
    since = now
  end
  local hold = 0
  if since > 0 then hold = math.max(math.max(last, since + ttl) + 1000 - now, 0) end
  -- Only a grant that may go ahead raises the last end: a refused attempt
  -- that did would push the end of the hold-off out at every retry.
  local ends = now + ttl
  if hold > 0 then ends = last end
  if id ~= replid or ends > last then
    redis.call('SET', mkey, replid .. '|' .. string.format('%.0f', since) .. '|' .. string.format('%.0f', math.max(last, ends)))
  end
  return hold
end
local hold = held_off(KEYS[#KEYS], tonumber(ARGV[3]))
if hold > 0 then return {3, hold} end
";

/// For each cluster slot, the smallest `n` whose tag `coord~<n>` hashes to it.
static TAGS: LazyLock<Vec<u32>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; 16384];
    let (mut left, mut n) = (tags.len(), 0u32);
    while left > 0 {
        let s = usize::from(slot(format!("coord~{n}").as_bytes()));
        if tags[s] == u32::MAX {
            tags[s] = n;
            left -= 1;
        }
        n += 1;
    }
    tags
});

/// The promotion marker for the object at `key`: one per server, or (on a
/// cluster) one per slot, in `key`'s slot.
pub(super) fn marker(prefix: &str, key: &str, cluster: bool) -> String {
    if cluster {
        let n = TAGS[usize::from(slot(key.as_bytes()))];
        format!("{prefix}{{coord~{n}}}:{SUFFIX}")
    } else {
        format!("{prefix}{SUFFIX}")
    }
}

/// The hold-off a refused round reports (`{3, wait_ms}`), the longest.
pub(super) fn held_off(round: &Round) -> Option<CoordError> {
    round
        .refusals()
        .filter_map(|r| match r.as_slice() {
            [Value::Int(3), Value::Int(ms)] => Some(*ms),
            _ => None,
        })
        .max()
        .map(|ms| CoordError::HoldOff {
            retry_after: Duration::from_millis(ms.max(1) as u64),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_marker_shares_the_object_slot_and_a_server_has_one() {
        for name in ["{lock:L}", "{sem:x}", "{job:q/j}", "{rw:a}", "{lock:}"] {
            let key = format!("le:{name}");
            let m = marker("le:", &key, true);
            assert_eq!(slot(m.as_bytes()), slot(key.as_bytes()), "{m}");
            assert!(m.ends_with(SUFFIX));
        }
        assert!(TAGS.iter().all(|n| *n != u32::MAX));
        assert_eq!(marker("le:", "le:{lock:a}", false), "le:coord-promoted");
        assert_eq!(marker("le:", "le:{lock:b}", false), "le:coord-promoted");
    }
}
