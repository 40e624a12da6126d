//! Job claims on Leases: one Lease per job of a queue (`queue/job`), its
//! claim a holder like a lock's; completing replaces the claim with the
//! completion, remembered for the retention by every sidecar's sight, after
//! which the Lease is deleted ([`super::follow::sweep`]) or claimed afresh.

use std::time::Duration;

use super::io::{Decision, View, ms};
use super::names::object_name;
use super::{LeaseCoord, entry, grant, held};
use crate::backend::coordination::{Kind, Outcome, Result, Token, TokenKind, Try};

/// Whether the completion in `v` is `token`'s.
fn done_by(v: &View, token: &str) -> bool {
    v.stored.done.as_ref().is_some_and(|d| d.token == token)
}

impl LeaseCoord {
    /// Claim job `job` of `queue` ([`Acquire::Job`](crate::backend::coordination::Acquire::Job)).
    pub(super) async fn claim_job(
        &self,
        queue: &str,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Try> {
        let name = format!("{queue}/{job}");
        let object = object_name(Kind::Job, &name);
        let t = self.target(Kind::Job, &name, &object);
        let token = Token::new(TokenKind::Job, 0).to_string();
        self.update(&t, |v| {
            let refusal = if v.sight.done_live {
                Some(Try::Completed)
            } else {
                v.sight.live.first().map(|e| Try::Held(e.owner.clone()))
            };
            Ok(match refusal {
                Some(_) if !v.fresh => Decision::Confirm,
                Some(r) => Decision::Answer(r),
                None => {
                    let mut state = v.stored.clone();
                    state.holders = vec![entry(&token, owner, ttl, None)];
                    state.done = None;
                    Decision::Write {
                        state,
                        bump: true,
                        answer: Try::Acquired(grant(&name, &token, v.next_fencing, ttl)),
                    }
                }
            })
        })
        .await
    }

    /// Complete a claimed job, remembered for `retention`
    /// ([`Coordinator::complete`](crate::backend::coordination::Coordinator::complete)).
    pub(super) async fn complete_job(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        let name = format!("{queue}/{job}");
        let object = object_name(Kind::Job, &name);
        let t = self.target(Kind::Job, &name, &object);
        self.update(&t, |v| {
            if done_by(v, token) {
                // Completed by us already (a retry).
                return Ok(Decision::Answer(Outcome::Ok(None)));
            }
            let Some(mine) = held(v, token) else {
                let other = v.sight.done_live || !v.sight.live.is_empty();
                return Ok(match (v.fresh, other) {
                    (false, _) => Decision::Confirm,
                    (true, true) => Decision::Answer(Outcome::NotYours),
                    (true, false) => Decision::Answer(Outcome::Gone),
                });
            };
            let mut state = v.stored.clone();
            state.holders.clear();
            let mut done = entry(token, &mine.owner, retention, Some(mine.at_ms));
            done.ttl_ms = ms(retention);
            state.done = Some(done);
            Ok(Decision::Write {
                state,
                bump: false,
                answer: Outcome::Ok(None),
            })
        })
        .await
    }

    /// Renew (`ttl`) or give back (`None`) the claim `token` holds on job
    /// `job` of `queue` ([`Coordinator::renew`](crate::backend::coordination::Coordinator::renew),
    /// [`Coordinator::release`](crate::backend::coordination::Coordinator::release) of a job):
    /// as on etcd, a renewal of a claim that is not ours (gone, completed,
    /// or another's) answers gone (410); a give-back answers not yours (409)
    /// when another holds or completed the job, else gone. A job given back
    /// can be claimed again at once.
    pub(super) async fn job_act(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        ttl: Option<Duration>,
    ) -> Result<Outcome> {
        let name = format!("{queue}/{job}");
        let object = object_name(Kind::Job, &name);
        let t = self.target(Kind::Job, &name, &object);
        self.update(&t, |v| {
            let Some(mine) = held(v, token) else {
                let other = v.sight.done_live || !v.sight.live.is_empty();
                return Ok(match (v.fresh, other && ttl.is_none()) {
                    (false, _) => Decision::Confirm,
                    (true, true) => Decision::Answer(Outcome::NotYours),
                    (true, false) => Decision::Answer(Outcome::Gone),
                });
            };
            let mut state = v.stored.clone();
            match ttl {
                Some(ttl) => {
                    if let Some(e) = state.holders.iter_mut().find(|e| e.token == token) {
                        *e = entry(token, &mine.owner, ttl, Some(mine.at_ms));
                    }
                }
                None => state.release(token),
            }
            Ok(Decision::Write {
                state,
                bump: false,
                answer: Outcome::Ok(ttl),
            })
        })
        .await
    }
}
