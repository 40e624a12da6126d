//! A leader's choice of successor from the candidate registry
//! (`backend::candidates`): whom a graceful release names, and when a
//! leader hands over on its own because a better candidate is ready.
//!
//! While leading, [`Preempt::watch`] follows the registry (the backend's
//! registry watch, then a list; a list every lease duration besides, and
//! after errors with backoff) and resolves with the identity to hand over
//! to, when either:
//!
//! - a ready candidate of a **higher priority** has been seen in every list
//!   for [`Standing::preempt_after`] by this leader's monotonic clock, from
//!   the first list that showed it so (a candidate that flaps between ready
//!   and not, or restarts, starts its wait again); or
//! - a ready candidate of a **newer revision** (and a priority at least
//!   ours) is seen, at once. No wait here: a rollout terminates the old
//!   Pods anyway, so every second of waiting only risks that this leader is
//!   terminated first and hands over to another old Pod (one more leader
//!   change); and the order cannot flap, since the new leader sees no
//!   revision newer than its own until the next rollout.
//!
//! Both only choose; the Elector steps down the way a resign does (stop
//! claiming, then release naming the successor, no cooldown). Safety is
//! unchanged: the backend's compare-and-swap decides who takes the released
//! term, and a named successor is only a hint (see `backend::candidates`).
//!
//! "Newer revision" is [`Revisions`]: the revision whose first record in the
//! registry was created later. This leader does not renew its own record
//! while it leads, so the record may lapse; the creation of its revision is
//! remembered from the first list of the term (taken while the record was
//! fresh).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout};
use tracing::{debug, info, warn};

use super::Standing;
use super::config::Backoff;
use super::precedence::successor_for;
use crate::backend::CandidateRegistry;
use crate::backend::candidates::{Listed, Revisions, higher_priority, newer_revision};

/// The shortest time between two lists of the registry by one leader.
const RELIST_FLOOR: Duration = Duration::from_millis(100);

impl super::Elector {
    /// The registry follower of the term about to be held (see [`Preempt`]).
    pub(super) fn preemption(
        &self,
    ) -> impl std::future::Future<Output = (String, &'static str)> + 'static {
        // A new term starts with no registry known.
        self.known.send_modify(|k| k.registry = None);
        Preempt {
            known: self.known.clone(),
            registry: self.registry.clone(),
            identity: self.cfg.identity.clone(),
            standing: self.cfg.standing.clone(),
            lease_duration: self.cfg.lease_duration,
            call_timeout: self.cfg.call_timeout(),
            observer: self.publisher.observer(),
        }
        .watch()
    }

    /// The successor to name when a term ends for `why`: the one set by a
    /// switchover or a preemption, else, on a graceful release (resign,
    /// shutdown, unhealthy), [`successor_for`] over the registry this
    /// leader already knows (no read on the release path), else nobody (a
    /// lost term or a missed deadline: there is nothing to hand over).
    pub(super) fn release_successor(&mut self, why: &super::lead::StepDown) -> Option<String> {
        use super::lead::StepDown;
        let set = self.successor.take().map(|(to, _)| to);
        let graceful = matches!(
            why,
            StepDown::Resigned | StepDown::Shutdown | StepDown::Unhealthy
        );
        if set.is_some() || !graceful {
            return set.filter(|_| graceful);
        }
        let known = self.known.borrow();
        let listed = known.registry.as_ref()?;
        successor_for(listed, &known.rules(&self.cfg.identity)).map(|c| c.identity.clone())
    }
}

/// What a leader follows in the registry during one term.
pub(super) struct Preempt {
    /// Where the lists are kept and the controls read.
    pub(super) known: super::known::Shared,
    /// The registry followed; `None`: the backend keeps none.
    pub(super) registry: Option<Arc<dyn CandidateRegistry>>,
    pub(super) identity: String,
    pub(super) standing: Standing,
    /// The relist period when the registry watch says nothing.
    pub(super) lease_duration: Duration,
    /// The deadline of each list.
    pub(super) call_timeout: Duration,
    /// Told of each list's counts (the metrics).
    pub(super) observer: Option<Arc<dyn super::Observer>>,
}

/// What one list of the registry decided.
enum Verdict {
    /// Hand over to this identity now, for this reason (`preemption`,
    /// `revision`).
    HandOver(String, &'static str),
    /// Nothing yet; the earliest instant a higher priority matures, if any.
    Wait(Option<Instant>),
}

/// The state kept between lists of one term.
#[derive(Default)]
struct Seen {
    /// Since when each ready candidate of a higher priority has been seen.
    higher: HashMap<String, Instant>,
    /// The creation of our revision's first record, as first listed.
    mine: Option<u64>,
    /// The candidates warned of for another `--preempt-after` this term.
    warned: HashMap<String, Duration>,
}

impl Preempt {
    /// Follow the registry while leading; resolves with the identity to
    /// hand over to and why (see the module docs). Pends forever on a
    /// backend without a registry.
    pub(super) async fn watch(self) -> (String, &'static str) {
        let Some(registry) = self.registry.clone() else {
            return std::future::pending().await;
        };
        let mut seen = Seen::default();
        let mut backoff = Backoff::new(Duration::from_millis(100), self.lease_duration);
        // One registry watch kept across the fallback relists (reopening it
        // each lease duration would cost a request at rest); a new one only
        // after it resolved.
        let mut watch = Box::pin(registry.watch_candidates());
        let mut controls = self.known.subscribe();
        loop {
            let seen_controls = controls.borrow_and_update().controls.clone();
            let listed_at = Instant::now();
            let (relist, matures) = match timeout(self.call_timeout, registry.candidates()).await {
                Ok(Ok(listed)) => {
                    backoff.reset();
                    let listed = super::known::judged(&self.known, listed, true);
                    self.count(&listed);
                    match self.judge(&listed, &mut seen, Instant::now()) {
                        Verdict::HandOver(to, why) => return (to, why),
                        Verdict::Wait(at) => (Instant::now() + self.lease_duration, at),
                    }
                }
                Ok(Err(e)) => {
                    debug!(error = %e.report(), "cannot list the candidate registry; listing again");
                    (Instant::now() + backoff.next(), None)
                }
                Err(_) => (Instant::now() + backoff.next(), None),
            };
            tokio::select! {
                r = &mut watch => {
                    if let Err(e) = r {
                        debug!(error = %e.report(), "the candidate registry watch ended; listing again");
                        sleep_until(Instant::now() + backoff.next()).await;
                    }
                    watch = Box::pin(registry.watch_candidates());
                }
                _ = sleep_until(relist) => {}
                _ = sleep_until(matures.unwrap_or(relist)) => {}
                // A resume or a new pin changes what the table allows.
                _ = async { let _ = controls.wait_for(|k| k.controls != seen_controls).await; } => {}
            }
            // A registry watch that resolves at once never turns this into
            // a busy loop of lists.
            sleep_until(listed_at + RELIST_FLOOR).await;
        }
    }

    /// Report the records alive in `listed` by readiness to the observer.
    fn count(&self, listed: &[Listed]) {
        let Some(obs) = &self.observer else { return };
        let now = std::time::SystemTime::now();
        let alive = listed.iter().filter(|l| l.alive());
        let ready = alive
            .clone()
            .filter(|l| l.candidate.ready && !l.candidate.frozen_at(now));
        let ready = ready.count() as u32;
        let not_ready = alive.count() as u32 - ready;
        obs.observe(super::Observation::Candidates { ready, not_ready });
    }

    /// Decide on one list taken at `now`.
    fn judge(&self, listed: &[Listed], seen: &mut Seen, now: Instant) -> Verdict {
        let (me, s) = (self.identity.as_str(), &self.standing);
        for (id, theirs) in super::agree::differs(listed, me, s.preempt_after) {
            if seen.warned.insert(id.to_owned(), theirs) != Some(theirs) {
                warn!(candidate = id, candidate_preempt_after = ?theirs, preempt_after = ?s.preempt_after, "a candidate's --preempt-after differs from this leader's: this leader's value counts (it is election-wide)");
            }
        }
        // Pause and pin come first in the table: no voluntary handover.
        let may = self.known.borrow().rules(me).may_hand_over();
        let first = Revisions::of(listed, me).first_created(&s.revision);
        seen.mine = match (seen.mine, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let newer = newer_revision(listed, me, (s.priority, &s.revision), seen.mine);
        if let Some(c) = newer.filter(|_| may) {
            info!(successor = %c.identity, revision = %c.revision, "a ready candidate of a newer revision: handing over");
            return Verdict::HandOver(c.identity.clone(), "revision");
        }
        let higher = higher_priority(listed, me, s.priority);
        seen.higher
            .retain(|id, _| higher.iter().any(|c| c.identity == *id));
        for c in &higher {
            seen.higher.entry(c.identity.clone()).or_insert(now);
        }
        if !may {
            // Woken again by a change of the controls (a resume, a new pin).
            return Verdict::Wait(None);
        }
        let matured = higher
            .iter()
            .find(|c| seen.higher[&c.identity] + s.preempt_after <= now);
        if let Some(c) = matured {
            info!(successor = %c.identity, priority = c.priority, preempt_after = ?s.preempt_after, "a ready candidate of a higher priority stayed: handing over");
            return Verdict::HandOver(c.identity.clone(), "preemption");
        }
        Verdict::Wait(seen.higher.values().min().map(|t| *t + s.preempt_after))
    }
}

#[cfg(test)]
#[path = "preempt_tests.rs"]
mod tests;
