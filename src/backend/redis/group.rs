//! **Redlock as a quorum combinator** over single-server stores ([`Server`]),
//! after redis.io's "Distributed locks with Redis"
//! (<https://redis.io/docs/latest/develop/use/patterns/distributed-locks/>).
//! One server is a group of one (quorum 1), so every caller speaks to a
//! [`Group`] whatever the set-up.
//!
//! - A key is **granted** ([`Group::grant`], the one grant rule of the
//!   election and of the coordination API) only when a quorum (N/2 + 1) of
//!   servers granted it and the validity, TTL − elapsed − [`drift`], is still
//!   positive, and then a quorum confirms the fencing token (below); a failed
//!   acquisition is given back on every server that took it.
//! - A **renew** succeeds only on a quorum; a **release** goes to all; both
//!   answer by one verdict of the servers' answers ([`super::verdict`]).
//! - **Fencing tokens of successive grants of one name strictly grow**, even
//!   when the granting quorums differ: per-server counters alone do not (with
//!   counters 5, 5, 3, grant A from servers 1 and 2 gives 6, grant B from 2
//!   and 3 gives 7, grant C from 1 and 3 gives 7 again). So a grant takes the
//!   largest counter of its quorum, F, and a second round ([`Lua::Raise`])
//!   raises the counter on every server that answers to at least F before the
//!   grant is handed out; unless a quorum confirms, the grant is released and
//!   refused. Any later quorum shares a server with the confirming one, whose
//!   counter is at least F, and `INCR` there gives more than F: tokens only
//!   grow while servers keep their data.
//! - With `--redis-min-replicas`, a server's grant, renewal or raise counts
//!   only once its replicas acknowledged it ([`Server::eval`]); a grant they
//!   did not is an error of that server, and is given back with the rest of
//!   a failed acquisition ([`Round::taken`]).

use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;
use tokio::time::Instant;

use super::lua::{Lua, Stored};
use super::server::{Server, uint_of};
use super::{BACKEND, is_unreplicated};
use crate::backend::{BackendError, Result};

/// The Redlock spec's clock drift allowance: 1 % of the TTL plus 2 ms.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// One server or a Redlock group of independent servers.
pub struct Group {
    servers: Vec<Server>,
    quorum: usize,
}

/// What one server answered to an acquisition script (`{1, fencing}`, ...).
#[derive(Debug)]
pub enum Step {
    /// Granted with this server's fencing counter.
    Granted(u64),
    /// Refused; the rest of the answer (held value, live count, ...).
    Refused(Vec<Value>),
}

/// One acquisition, as the grant rule ([`Group::grant`]) needs it.
pub struct Acquisition<'a> {
    /// The key to hold.
    pub key: &'a str,
    /// Its fencing counter (same hash tag).
    pub counter: &'a str,
    /// The grant's random token, which proves ownership.
    pub token: &'a str,
    /// The candidate's identity or the client's owner label.
    pub owner: &'a str,
    /// The TTL asked for (and set on the key).
    pub ttl: Duration,
    /// The script, and its arguments, that give the key back (`KEYS[1]` =
    /// `key`) where a refused acquisition took it.
    pub give_back: (Lua, &'a [&'a str]),
}

/// What the grant rule ([`Group::grant`]) decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Granting {
    /// Granted on a quorum that confirmed the fencing token.
    Granted {
        /// The fencing token: the largest counter of the granting quorum.
        fencing: u64,
        /// Servers that granted.
        by: usize,
        /// What was left of the validity (TTL − elapsed − [`drift`]) when
        /// the quorum had answered.
        validity: Duration,
    },
    /// Fewer than a quorum granted, or the validity was used up; given back.
    Refused,
    /// A quorum granted, but fewer confirmed the raised fencing token; given back.
    Unconfirmed {
        /// Servers that confirmed.
        confirmed: usize,
    },
}

/// What a group answered to one acquisition round.
pub struct Round {
    /// Per server (by index): its answer.
    pub answers: Vec<Result<Step>>,
    /// When the first request was sent.
    pub start: Instant,
}

impl Round {
    /// Indices of the servers that granted, with their counters.
    pub fn granted(&self) -> Vec<(usize, u64)> {
        self.answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Ok(Step::Granted(f)) => Some((i, *f)),
                _ => None,
            })
            .collect()
    }

    /// The refusals' payloads.
    pub fn refusals(&self) -> impl Iterator<Item = &Vec<Value>> {
        self.answers.iter().filter_map(|a| match a {
            Ok(Step::Refused(v)) => Some(v),
            _ => None,
        })
    }

    /// Indices of the servers that hold the key after this round: those that
    /// granted, and those whose grant too few replicas acknowledged. A failed
    /// acquisition gives it back on each of them.
    pub fn taken(&self) -> Vec<usize> {
        self.answers
            .iter()
            .enumerate()
            .filter(|(_, a)| match a {
                Ok(Step::Granted(_)) => true,
                Err(e) => is_unreplicated(e),
                _ => false,
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Servers that answered at all.
    pub fn answered(&self) -> usize {
        self.answers.iter().filter(|a| a.is_ok()).count()
    }

    /// The first error, taken out.
    pub fn first_error(&mut self) -> Option<BackendError> {
        self.answers.iter_mut().find_map(|a| match a {
            Err(_) => std::mem::replace(a, Ok(Step::Refused(Vec::new()))).err(),
            _ => None,
        })
    }
}

impl Group {
    /// A group over `servers` (at least one); the quorum is N/2 + 1.
    pub fn new(servers: Vec<Server>) -> Group {
        let quorum = servers.len() / 2 + 1;
        Group { servers, quorum }
    }

    /// The servers, in the configured order.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// Servers that must agree (N/2 + 1).
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Whether this is a Redlock group (more than one server).
    pub fn is_redlock(&self) -> bool {
        self.servers.len() > 1
    }

    /// The configured endpoints (redacted), comma-separated.
    pub fn endpoints(&self) -> String {
        let labels: Vec<&str> = self.servers.iter().map(Server::label).collect();
        labels.join(",")
    }

    /// Run `lua` on every server at once.
    pub async fn eval_all(&self, lua: Lua, keys: &[&str], args: &[&str]) -> Vec<Result<Value>> {
        join_all(self.servers.iter().map(|s| s.eval(lua, keys, args))).await
    }

    /// Run an acquisition script on every server at once and read the
    /// answers: `{1, fencing, ...}` granted, anything else refused; a
    /// `{-2, counter}` refusal is left to the caller.
    pub async fn acquire_round(&self, lua: Lua, keys: &[&str], args: &[&str]) -> Round {
        let start = Instant::now();
        let answers = self
            .eval_all(lua, keys, args)
            .await
            .into_iter()
            .map(|r| r.and_then(step))
            .collect();
        Round { answers, start }
    }

    /// The validity left of a grant of `ttl` whose round started at `start`:
    /// TTL − elapsed − drift (zero when used up).
    pub fn validity(&self, ttl: Duration, start: Instant) -> Duration {
        ttl.saturating_sub(drift(ttl))
            .saturating_sub(start.elapsed())
    }

    /// **The grant rule**, for every acquisition of the election and of the
    /// coordination API, after a round in which the servers `granted` (with
    /// their counters) and `taken` hold the key (see [`Round::taken`]), the
    /// round started at `start`: a quorum granted and the validity is left
    /// → raise the counter to the largest of the quorum → a quorum confirms;
    /// at any step short of that, give back on `taken` and refuse.
    pub async fn grant(
        &self,
        ask: &Acquisition<'_>,
        granted: &[(usize, u64)],
        taken: &[usize],
        start: Instant,
    ) -> Granting {
        let validity = self.validity(ask.ttl, start);
        if granted.len() < self.quorum || validity.is_zero() {
            self.give_back(ask, taken).await;
            return Granting::Refused;
        }
        let value = Stored {
            token: ask.token.to_owned(),
            fencing: granted.iter().map(|(_, f)| *f).max().unwrap_or(0),
            owner: ask.owner.to_owned(),
        };
        let confirmed = self.raise(ask.key, ask.counter, &value).await;
        if confirmed < self.quorum {
            self.give_back(ask, taken).await;
            return Granting::Unconfirmed { confirmed };
        }
        Granting::Granted {
            fencing: value.fencing,
            by: granted.len(),
            validity,
        }
    }

    /// Give back `ask`'s key on the servers with these indices, by its script.
    async fn give_back(&self, ask: &Acquisition<'_>, servers: &[usize]) {
        let (lua, args) = ask.give_back;
        self.eval_on(servers, lua, &[ask.key], args).await;
    }

    /// Redlock's second round after a quorum granted `key` to `value.token`:
    /// raise the counter `fkey` to at least `value.fencing` on every server
    /// and write `value` over our copies (see the module docs). Returns how
    /// many servers confirmed; a single server confirms without a round (its
    /// own `INCR` already counted past every earlier grant).
    async fn raise(&self, key: &str, fkey: &str, value: &Stored) -> usize {
        if !self.is_redlock() {
            return 1;
        }
        let fencing = value.fencing.to_string();
        let encoded = value.encode();
        self.eval_all(
            Lua::Raise,
            &[key, fkey],
            &[&fencing, &value.token, &encoded],
        )
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Value::Int(1))))
        .count()
    }

    /// Run `lua` on the servers with these indices, at once.
    async fn eval_on(
        &self,
        servers: &[usize],
        lua: Lua,
        keys: &[&str],
        args: &[&str],
    ) -> Vec<Result<Value>> {
        join_all(
            servers
                .iter()
                .map(|i| self.servers[*i].eval(lua, keys, args)),
        )
        .await
    }
}

/// Read one acquisition answer.
fn step(v: Value) -> Result<Step> {
    let Value::Array(items) = v else {
        return Err(unexpected(&v));
    };
    match items.as_slice() {
        [Value::Int(1), f, ..] => uint_of(f)
            .map(Step::Granted)
            .ok_or_else(|| unexpected(&Value::Array(items.clone()))),
        _ => Ok(Step::Refused(items)),
    }
}

/// A script answer of an unexpected shape.
pub fn unexpected(v: &Value) -> BackendError {
    BackendError::Server {
        backend: BACKEND,
        source: format!("unexpected script answer: {v:?}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_answer_carries_the_counter_and_a_refusal_its_payload() {
        let granted = step(Value::Array(vec![Value::Int(1), Value::Int(42)])).unwrap();
        assert!(matches!(granted, Step::Granted(42)));
        let held = step(Value::Array(vec![Value::Int(0), Value::Int(3)])).unwrap();
        assert!(matches!(held, Step::Refused(v) if v.len() == 2));
        assert!(step(Value::Int(1)).is_err());
    }

    fn ask(ttl: Duration) -> Acquisition<'static> {
        Acquisition {
            key: "k",
            counter: "k:fencing",
            token: "t",
            owner: "o",
            ttl,
            give_back: (Lua::Release, &["t", "k", ""]),
        }
    }

    /// The grant rule without a round trip: what nobody took needs no give
    /// back, and one server confirms its own counter. Safety: fewer than a
    /// quorum, or no validity left, grants nothing; liveness twin: a quorum
    /// within the validity is granted the largest counter.
    #[tokio::test]
    async fn a_grant_needs_a_quorum_and_validity_and_carries_the_largest_counter() {
        let ttl = Duration::from_secs(10);
        let one = super::super::verdict::group_of(1);
        let granted = one.grant(&ask(ttl), &[(0, 7)], &[], Instant::now()).await;
        assert!(
            matches!(granted, Granting::Granted { fencing: 7, by: 1, validity } if validity <= ttl - drift(ttl)),
            "{granted:?}"
        );
        let late = Instant::now() - ttl;
        let expired = one.grant(&ask(ttl), &[(0, 7)], &[], late).await;
        assert_eq!(expired, Granting::Refused);
        let three = super::super::verdict::group_of(3);
        let minority = three.grant(&ask(ttl), &[(1, 9)], &[], Instant::now()).await;
        assert_eq!(minority, Granting::Refused);
    }

    #[test]
    fn the_quorum_is_a_strict_majority() {
        let group = super::super::verdict::group_of;
        assert_eq!(group(1).quorum(), 1);
        assert_eq!(group(3).quorum(), 2);
        assert_eq!(group(4).quorum(), 3);
        assert_eq!(group(5).quorum(), 3);
        assert!(!group(1).is_redlock());
    }
}
