//! **The renew and release verdicts** of a [`Group`], written once for its
//! two clients: the election ([`super::RedisBackend`]) and the coordination
//! API. Each server answers a renew, release or completion script with 1
//! (done), 2 (put back, election renew only), 0 (gone), -1 (someone else's)
//! or fails; the [`Tally`] of those answers gives one [`Verdict`], and each
//! client only maps it to its own answer type.
//!
//! The verdict says only what the answers prove about the key, with a quorum
//! q = N/2 + 1 of N servers. The servers that may still hold our key are
//! those that put it back and those that did not answer (a failed answer is a
//! lost answer, not a lost key: servers keep their data):
//! - **renew**: [`Verdict::Done`] when a quorum renewed; **over** ([`Verdict::Gone`]
//!   or [`Verdict::Taken`]) when the servers that renewed or may hold it are
//!   fewer than a quorum: then no quorum can hold our key any more, and
//!   another candidate can take it as soon as the unanswered copies expire;
//!   else [`Verdict::Failed`]: a quorum may still hold it, so neither "ours"
//!   nor "over" is proven. So 1 renewed, 1 gone and 1 failed on three servers
//!   is a failure, not "gone": the failed server and the renewed one may
//!   still be a quorum holding our key, nobody else can be granted it until
//!   they let it go, and a retry may renew it. Saying "gone" there would step
//!   a leader down (or tell a lock's client to stop) while nobody else can
//!   take over, and the client's last validity still runs either way;
//! - **release**: [`Verdict::Failed`] when the servers that may still hold
//!   our key are a quorum; else released ([`Verdict::Done`]) when a server
//!   deleted it, or over as it was found (gone or someone else's).
//!
//! Over is gone or taken by the majority of the refusals (a tie is gone).
//! Safety rests on "done" needing a quorum for a renewal and on "released"
//! and "over" needing that no quorum may hold the key; liveness on every
//! tally that proves either getting it (never a failure forever).

use redis::Value;

use super::group::{Group, unexpected};
use crate::backend::{BackendError, Result};

/// How the servers answered a verb that each answers 1 (done), 2 (put
/// back), 0 (gone) or -1 (someone else's).
#[derive(Debug, Default)]
pub struct Tally {
    /// Servers that answered 1.
    pub ok: usize,
    /// Servers that answered 0.
    pub gone: usize,
    /// Servers that answered -1.
    pub taken: usize,
    /// Servers that answered 2 (put back; election renew only).
    pub restored: usize,
    /// Servers that failed or answered something else.
    pub failed: usize,
    /// The first error, if any server failed.
    pub error: Option<BackendError>,
}

impl Tally {
    /// Count 1 / 2 / 0 / -1 answers and failures, keeping the first error.
    pub fn of(answers: Vec<Result<Value>>) -> Tally {
        let mut t = Tally::default();
        for a in answers {
            match a {
                Ok(Value::Int(1)) => t.ok += 1,
                Ok(Value::Int(2)) => t.restored += 1,
                Ok(Value::Int(0)) => t.gone += 1,
                Ok(Value::Int(-1)) => t.taken += 1,
                Ok(other) => {
                    t.failed += 1;
                    t.error.get_or_insert(unexpected(&other));
                }
                Err(e) => {
                    t.failed += 1;
                    t.error.get_or_insert(e);
                }
            }
        }
        t
    }

    /// Servers that may still hold our key whatever else they did: put back,
    /// or not answered.
    fn may_hold(&self) -> usize {
        self.restored + self.failed
    }

    /// Over, by the majority of the refusals.
    fn over(&self) -> Verdict {
        if self.taken > self.gone {
            Verdict::Taken
        } else {
            Verdict::Gone
        }
    }
}

/// What a renew, release or completion came to on a group (see the module
/// docs for the rule).
#[derive(Debug)]
pub enum Verdict {
    /// Renewed or completed on a quorum, or released.
    Done {
        /// Servers that answered 1.
        by: usize,
    },
    /// Over: no quorum can hold our key; most refusals found it gone.
    Gone,
    /// Over: no quorum can hold our key; most refusals found someone else's.
    Taken,
    /// Unknown: a quorum may still hold our key. The first server error, or
    /// [`Group::no_quorum`]'s when every server answered.
    Failed(BackendError),
}

impl Group {
    /// The verdict of a renewal (or completion, `what` naming it) tallied `t`.
    pub fn renew_verdict(&self, t: Tally, what: &str) -> Verdict {
        let quorum = self.quorum();
        if t.ok >= quorum {
            return Verdict::Done { by: t.ok };
        }
        if t.ok + t.may_hold() < quorum {
            return t.over();
        }
        Verdict::Failed(self.no_quorum(t.error, t.ok, what))
    }

    /// The verdict of a release tallied `t`.
    pub fn release_verdict(&self, t: Tally) -> Verdict {
        if t.may_hold() >= self.quorum() {
            let answered = self.servers().len() - t.failed;
            return Verdict::Failed(self.no_quorum(t.error, answered, "answered"));
        }
        if t.ok > 0 {
            return Verdict::Done { by: t.ok };
        }
        t.over()
    }

    /// Run a renewal script (`lua`, answering 1 / 2 / 0 / -1) on every server
    /// and judge it.
    pub async fn renew(&self, lua: super::lua::Lua, keys: &[&str], args: &[&str]) -> Verdict {
        let t = Tally::of(self.eval_all(lua, keys, args).await);
        self.renew_verdict(t, "renewed")
    }

    /// Run a release script (`lua`, answering 1 / 0 / -1) on every server
    /// and judge it.
    pub async fn release(&self, lua: super::lua::Lua, keys: &[&str], args: &[&str]) -> Verdict {
        self.release_verdict(Tally::of(self.eval_all(lua, keys, args).await))
    }
}

/// Every tally of `n` servers: (ok, gone, taken, restored, failed), for
/// table tests of the verdicts and of their users.
#[cfg(test)]
pub(crate) fn every_tally(n: usize) -> Vec<[usize; 5]> {
    let mut all = Vec::new();
    for ok in 0..=n {
        for gone in 0..=n - ok {
            for taken in 0..=n - ok - gone {
                for restored in 0..=n - ok - gone - taken {
                    all.push([ok, gone, taken, restored, n - ok - gone - taken - restored]);
                }
            }
        }
    }
    all
}

/// The tally of `counts` (as [`every_tally`] gives them), a failure being a
/// timeout.
#[cfg(test)]
pub(crate) fn tally_of(counts: [usize; 5]) -> Tally {
    let [ok, gone, taken, restored, failed] = counts;
    Tally {
        ok,
        gone,
        taken,
        restored,
        failed,
        error: (failed > 0).then_some(BackendError::Timeout {
            backend: super::BACKEND,
            call: "renew",
            timeout_ms: 1,
        }),
    }
}

/// A group of `n` servers that are never connected to.
#[cfg(test)]
pub(crate) fn group_of(n: usize) -> Group {
    let opts = super::RedisOptions::default();
    let servers = (0..n)
        .map(|i| {
            let url = format!("redis://127.0.0.1:{}", 7000 + i);
            super::server::Server::open(&url, &opts).expect("a server")
        })
        .collect();
    Group::new(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_tallied_with_every_failure_counted_and_the_first_error_kept() {
        let t = Tally::of(vec![
            Ok(Value::Int(1)),
            Ok(Value::Int(-1)),
            Ok(Value::Int(0)),
            Ok(Value::Int(2)),
            Ok(Value::Nil),
            Ok(Value::Int(1)),
        ]);
        assert_eq!(
            (t.ok, t.taken, t.gone, t.restored, t.failed),
            (2, 1, 1, 1, 1)
        );
        assert!(matches!(t.error, Some(BackendError::Server { .. })));
    }

    /// Safety: a renewal is done only on a quorum, and over (renew or
    /// release) or released only when no quorum may still hold the key.
    /// Liveness twin: every tally that proves one of them gets it.
    #[test]
    fn verdicts_say_only_what_the_answers_prove() {
        for n in [1, 2, 3, 4, 5] {
            let group = group_of(n);
            let q = group.quorum();
            for counts in every_tally(n) {
                let [ok, _, _, restored, failed] = counts;
                let may_hold = restored + failed;
                let renew = group.renew_verdict(tally_of(counts), "renewed");
                match renew {
                    Verdict::Done { by } => assert!(by == ok && ok >= q, "{counts:?}"),
                    Verdict::Gone | Verdict::Taken => assert!(ok + may_hold < q, "{counts:?}"),
                    Verdict::Failed(_) => assert!(ok < q && ok + may_hold >= q, "{counts:?}"),
                }
                match group.release_verdict(tally_of(counts)) {
                    Verdict::Failed(_) => assert!(may_hold >= q, "{counts:?}"),
                    Verdict::Done { by } => assert!(by == ok && ok > 0 && may_hold < q),
                    _ => assert!(may_hold < q && ok == 0, "{counts:?}"),
                }
            }
        }
    }

    #[test]
    fn one_renewed_one_gone_one_failed_is_a_failure_not_gone() {
        let group = group_of(3);
        let v = group.renew_verdict(tally_of([1, 1, 0, 0, 1]), "renewed");
        assert!(
            matches!(v, Verdict::Failed(BackendError::Timeout { .. })),
            "{v:?}"
        );
        let v = group.renew_verdict(tally_of([1, 2, 0, 0, 0]), "renewed");
        assert!(matches!(v, Verdict::Gone), "{v:?}");
        let v = group.renew_verdict(tally_of([0, 1, 2, 0, 0]), "renewed");
        assert!(matches!(v, Verdict::Taken), "{v:?}");
    }
}
