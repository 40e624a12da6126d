//! The Redis backend's failsafe roster ([`RosterStore`]).
//!
//! - **The roster**: the key `<prefix>{<election>}:failsafe:roster`, JSON,
//!   **without a TTL** (it outlives the term: the model's first
//!   counterexample, see [`crate::failsafe`]). Written by the leader in the
//!   same script as the term: the campaign script at its grant
//!   ([`super::lua_campaign`]) and the renew script at every renewal
//!   ([`super::lua`]'s `ELECTION_RENEW`), on each server of a Redlock group
//!   by that server's own script.
//! - **Reading it** (the gate before every campaign): a quorum of servers
//!   must answer, each with persistence on (`INFO persistence`:
//!   `aof_enabled:1`; a server without it answers an error, below). The
//!   value a quorum agrees on is the roster; when no quorum agrees (a
//!   Redlock campaign that won only a minority wrote its roster there),
//!   a candidate may campaign only if every answering server's roster lets
//!   it (their intersection), and not at all when that is empty. A value
//!   that is not a roster's JSON (a hand edit) is an error: the caller then
//!   does not campaign.
//! - **Applications**: one hash `<base>:failsafe:applications`, a field per
//!   member, `<expiry ms by the server's clock>|<member JSON>`; lapsed
//!   fields are pruned by the next application and never listed; the hash
//!   itself expires with its longest application. One key (one Cluster slot,
//!   no `SCAN`), one round trip to list; Redis 7.0 has no per-field TTL
//!   (`HPEXPIRE` is 7.4). On Redlock an application is written to every
//!   server (a quorum must take it) and the list is the union of a quorum's.
//!
//! **Why persistence is required.** A Redis restarted without persistence
//! forgets the roster; a candidate never admitted would then find no roster
//! and campaign (after the campaign script's one-TTL uptime wait) while a
//! failsafe leader that cannot reach Redis still claims: its claim has no
//! time bound while every member confirms it. Nothing but the roster tells
//! that candidate to stay out, so the roster must survive a restart:
//! failsafe on Redis requires `appendonly yes` on every server, and a
//! server without it is refused for the roster read (nobody campaigns;
//! one WARN per server names the fix).
//!
//! **A term that outlives its key.** Redis expires the key by its own clock
//! during an outage longer than the TTL (and a restart loads it expired).
//! After a renewal of the term that did not succeed, the next renewal puts
//! the key back if the fencing counter still holds the term's token: any
//! campaign since would have raised it, and while the leader claims past
//! its lease every roster member promised not to campaign and non-members
//! are kept out by the roster. So the term and its token continue.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use redis::Value;
use tracing::warn;

use super::answered::Answers;
use super::group::unexpected;
use super::lua::{Lua, Stored, ms};
use super::server::text_of;
use super::{BACKEND, RedisBackend};
use crate::backend::roster::{Member, Roster, RosterStore};
use crate::backend::{BackendError, Result, Term};

/// The code (and metric reason) of a roster read refused by a server
/// without persistence.
pub const NO_PERSISTENCE: &str = "persistence";

/// Read the roster and whether the server persists. KEYS: roster. Answers
/// `{aof_enabled, roster or false}`.
pub(super) const ROSTER_READ: &str = r"
local p = redis.call('INFO', 'persistence')
local aof = tonumber(string.match(p, 'aof_enabled:(%d)') or '0')
return {aof, redis.call('GET', KEYS[1])}
";

/// Write or renew an application. KEYS: applications. ARGV: identity,
/// member JSON, TTL in ms. Prunes lapsed fields. Answers 1.
pub(super) const ROSTER_APPLY: &str = r"
local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + ttl) .. '|' .. ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local until_ms = tonumber(string.match(all[i + 1], '^(%d+)|'))
  if not until_ms or until_ms <= now then redis.call('HDEL', KEYS[1], all[i]) end
end
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
";

/// The live applications' member JSON. KEYS: applications. Read-only.
pub(super) const ROSTER_APPLICANTS: &str = r"
local now = now_ms()
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local until_ms, member = string.match(all[i + 1], '^(%d+)|(.*)$')
  if until_ms and tonumber(until_ms) > now then out[#out + 1] = member end
end
return out
";

/// Withdraw an application. KEYS: applications. ARGV: identity. Answers 1.
pub(super) const ROSTER_WITHDRAW: &str = r"
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
";

/// This process's failsafe state on the backend.
#[derive(Default)]
pub(super) struct FailsafeState {
    /// The roster JSON written with every campaign and renewal (`None`:
    /// failsafe off).
    roster: std::sync::Mutex<Option<String>>,
    /// The last renewal of the term did not succeed (set when one is sent,
    /// cleared by its success): the next may put the key back.
    unsure: AtomicBool,
    /// Servers (by index) already warned of their missing persistence.
    warned: std::sync::Mutex<std::collections::BTreeSet<usize>>,
}

impl RedisBackend {
    pub(super) fn roster_key(&self) -> String {
        format!("{}:failsafe:roster", self.key)
    }

    fn applications_key(&self) -> String {
        format!("{}:failsafe:applications", self.key)
    }

    /// The roster JSON staged for the campaign script ('' when failsafe is
    /// off), and its key.
    pub(super) fn campaign_roster(&self) -> (String, String) {
        let staged = self.failsafe.roster.lock().expect("the staged roster");
        (staged.clone().unwrap_or_default(), self.roster_key())
    }

    /// A new term began: its first renewal renews, never puts back.
    pub(super) fn failsafe_term_began(&self) {
        self.failsafe.unsure.store(false, Ordering::SeqCst);
    }

    /// The renew script's keys after the key and the two control keys
    /// (with failsafe: the counter, the roster) and its arguments for `term`, the renewal about
    /// to be sent (see the module docs); `recreate` is Redlock's put-back
    /// value ('' on one server).
    pub(super) fn renew_call(&self, term: &Term, recreate: String) -> (Vec<String>, Vec<String>) {
        let ttl_ms = ms(term.granted);
        let token = term.holder.term_id.as_str().to_owned();
        let staged = self.failsafe.roster.lock().expect("the staged roster");
        let Some(roster) = staged.clone() else {
            return (Vec::new(), vec![token, ttl_ms, recreate]);
        };
        let unsure = self.failsafe.unsure.swap(true, Ordering::SeqCst);
        let (value, guard) = if unsure {
            let value = Stored {
                token: token.clone(),
                fencing: term.holder.fencing_token,
                owner: term.holder.identity.clone(),
            };
            (value.encode(), term.holder.fencing_token.to_string())
        } else {
            (recreate, String::new())
        };
        let keys = vec![self.counter_key.clone(), self.roster_key()];
        (keys, vec![token, ttl_ms, value, guard, roster])
    }

    /// A renewal succeeded: the next one renews, never puts back.
    pub(super) fn failsafe_renewed(&self) {
        self.failsafe.unsure.store(false, Ordering::SeqCst);
    }

    /// One server's roster answer: `Some(json)`, `None` (no roster), or an
    /// error for a server without persistence.
    fn read_roster_answer(&self, i: usize, v: Value) -> Result<Option<String>> {
        let Value::Array(items) = &v else {
            return Err(unexpected(&v));
        };
        let (aof, roster) = match items.as_slice() {
            [Value::Int(aof)] => (*aof, None),
            [Value::Int(aof), Value::Nil] => (*aof, None),
            [Value::Int(aof), r] => (*aof, Some(text_of(r).ok_or_else(|| unexpected(&v))?)),
            _ => return Err(unexpected(&v)),
        };
        if aof != 1 {
            let server = self.group.servers()[i].label().to_owned();
            if self.failsafe.warned.lock().expect("warned").insert(i) {
                warn!(server = %server, "failsafe on Redis needs persistence: this server runs without appendonly, so a restart would forget the failsafe roster and let a candidate never admitted campaign while a failsafe leader still claims; nobody campaigns until every server runs with appendonly yes");
            }
            return Err(BackendError::Rejected {
                backend: BACKEND,
                code: NO_PERSISTENCE,
                source: format!(
                    "{server} runs without appendonly (INFO persistence: aof_enabled:0)"
                )
                .into(),
            });
        }
        Ok(roster)
    }
}

/// The roster a quorum of `answers` shows (see the module docs).
///
/// # Errors
/// A value that is not a roster, or rosters that agree on no member.
pub(super) fn roster_of(answers: &[Option<String>], quorum: usize) -> Result<Option<Roster>> {
    let parse = |text: &String| {
        Roster::from_json(text).map_err(|e| BackendError::Rejected {
            backend: BACKEND,
            code: "roster",
            source: format!("the failsafe roster is not a roster's JSON ({e}): {text:?}").into(),
        })
    };
    let mut counts: BTreeMap<&Option<String>, usize> = BTreeMap::new();
    for a in answers {
        *counts.entry(a).or_default() += 1;
    }
    if let Some((agreed, _)) = counts.iter().find(|(_, n)| **n >= quorum) {
        return agreed.as_ref().map(parse).transpose();
    }
    let rosters = answers
        .iter()
        .flatten()
        .map(parse)
        .collect::<Result<Vec<Roster>>>()?;
    let Some((first, rest)) = rosters.split_first() else {
        return Ok(None);
    };
    let common = first
        .members
        .iter()
        .filter(|m| rest.iter().all(|r| r.contains(&m.identity)))
        .cloned();
    let common = Roster::new(common);
    if common.members.is_empty() {
        return Err(BackendError::Rejected {
            backend: BACKEND,
            code: "roster",
            source: "the servers' failsafe rosters disagree and share no member; the leader's next renewal writes one roster on every server".into(),
        });
    }
    Ok(Some(common))
}

#[async_trait]
impl RosterStore for RedisBackend {
    async fn roster(&self) -> Result<Option<Roster>> {
        let key = self.roster_key();
        let answers = self.group.eval_all(Lua::RosterRead, &[&key], &[]).await;
        let answers = answers
            .into_iter()
            .enumerate()
            .map(|(i, a)| a.and_then(|v| self.read_roster_answer(i, v)));
        let read = Answers::of(answers).on_quorum(&self.group, "read the failsafe roster")?;
        roster_of(&read, self.quorum())
    }

    async fn apply(&self, member: &Member, ttl: Duration) -> Result<()> {
        let key = self.applications_key();
        let json = serde_json::to_string(member).expect("a member serializes");
        let args = [member.identity.as_str(), &json, &ms(ttl)];
        self.on_quorum(Lua::RosterApply, &[&key], &args, "took the application")
            .await
            .map(|_| ())
    }

    async fn withdraw(&self, identity: &str) -> Result<()> {
        let key = self.applications_key();
        self.on_quorum(
            Lua::RosterWithdraw,
            &[&key],
            &[identity],
            "withdrew the application",
        )
        .await
        .map(|_| ())
    }

    async fn applicants(&self) -> Result<Vec<Member>> {
        let key = self.applications_key();
        let answers = self
            .on_quorum(
                Lua::RosterApplicants,
                &[&key],
                &[],
                "listed the applications",
            )
            .await?;
        let mut all: BTreeMap<String, Member> = BTreeMap::new();
        for a in answers {
            let Value::Array(items) = &a else {
                return Err(unexpected(&a));
            };
            let members = items.iter().filter_map(text_of);
            for m in members.filter_map(|t| serde_json::from_str::<Member>(&t).ok()) {
                all.insert(m.identity.clone(), m);
            }
        }
        Ok(all.into_values().collect())
    }

    fn stage(&self, _identity: &str, roster: Roster) {
        *self.failsafe.roster.lock().expect("the staged roster") = Some(roster.to_json());
    }
}

#[cfg(test)]
#[path = "roster_tests.rs"]
mod tests;
