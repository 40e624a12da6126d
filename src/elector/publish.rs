//! The one writer of [`LeaderState`]: backend health, the silence bound of a
//! follower (`heard_until`), our own term and the single place where a change
//! of leader is recorded, counted, logged and sent as an [`Event`]. Every
//! step is also reported to the [`super::Observer`] (the metrics).

use std::time::{Duration, SystemTime};

use tokio::time::{Instant, timeout};
use tracing::{info, warn};

use super::observe::Observation;
use super::{Elector, Event, OwnTerm, Waiting};
use crate::backend::{BackendError, Holder, Term};

impl Elector {
    /// Report `o` to the observer, if any.
    pub(super) fn report(&self, o: Observation) {
        if let Some(obs) = &self.observer {
            obs.observe(o);
        }
    }

    /// Run one backend call under the call timeout.
    pub(super) async fn call<T>(
        &self,
        verb: &'static str,
        fut: impl std::future::Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let limit = self.cfg.call_timeout();
        match timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::Timeout {
                backend: self.backend.about(),
                call: verb,
                timeout_ms: limit.as_millis() as u64,
            }),
        }
    }

    /// Name the wait that keeps this candidate from campaigning (`None`:
    /// none), for `/leader`; a new kind of wait is logged once.
    pub(super) fn set_waiting(&mut self, wait: Option<(&'static str, Duration)>) {
        let until = wait.map(|(what, left)| Waiting {
            what,
            until: std::time::SystemTime::now() + left,
        });
        self.state.send_if_modified(|s| {
            let new_kind = until.map(|w| w.what) != s.waiting.map(|w| w.what);
            if new_kind && let Some(w) = &until {
                info!(election = %s.election, waiting_for = w.what, until = %humantime::format_rfc3339_millis(w.until), "not campaigning yet");
            }
            let changed = new_kind;
            s.waiting = until;
            changed
        });
    }

    pub(super) fn backend_ok(&mut self) {
        self.backoff.reset();
        self.report(Observation::BackendUp(true));
        self.state.send_if_modified(|s| {
            let changed = !s.backend_healthy || !s.ready || s.error.is_some();
            if s.error.is_some() {
                info!(election = %s.election, "backend reachable again");
            }
            s.backend_healthy = true;
            s.ready = !s.stopping;
            s.error = None;
            changed
        });
    }

    pub(super) fn backend_failed(&mut self, e: &BackendError) {
        self.report(Observation::BackendUp(false));
        let report = e.report();
        self.state.send_if_modified(|s| {
            let first = s.error.as_deref() != Some(report.as_str());
            if first {
                if e.is_retryable() {
                    warn!(election = %s.election, error = %report, "backend call failed");
                } else {
                    tracing::error!(election = %s.election, error = %report, "backend call failed: configuration problem");
                }
            }
            let changed = s.backend_healthy || s.ready || first;
            s.backend_healthy = false;
            s.ready = false;
            s.error = Some(report.clone());
            changed
        });
    }

    /// A backend answer sent at `sent` showed the term with fencing token
    /// `token` holding the key (`None`: nobody). Extends how long followers
    /// may name the observed leader, and records the duration of a failover
    /// when the term differs from the one seen before.
    pub(super) fn heard(&mut self, token: Option<u64>, sent: Instant) {
        let until = sent + self.cfg.silence_bound();
        self.state.send_if_modified(|s| {
            s.heard_until = Some(until);
            // Read-time only: no reader needs waking for this.
            false
        });
        let Some(token) = token else { return };
        if let Some((previous, at)) = self.term_seen
            && previous != token
        {
            let took = Instant::now().saturating_duration_since(at);
            // An upper bound, not the handover itself: from the send instant
            // of the last answer that showed the previous term alive (a
            // follower reads about once per renew interval) to now.
            info!(election = %self.cfg.election, previous_fencing_token = previous, fencing_token = token, since_previous_seen_ms = took.as_millis() as u64, "observed a new term (since_previous_seen_ms bounds the failover from above)");
            self.report(Observation::Failover { took });
        }
        self.term_seen = Some((token, sent));
    }

    pub(super) fn set_own_term(&mut self, term: &Term, valid_until: Instant) {
        let own = OwnTerm {
            valid_until,
            fencing_token: term.holder.fencing_token,
            suspended_at_send: self.suspended_at_campaign,
        };
        self.publish(
            Some(term.holder.identity.clone()),
            Some(term.holder.fencing_token),
            Some(own),
        );
    }

    /// Record the holder observed as a follower (`None`: nobody holds the key).
    pub(super) fn observe(&mut self, holder: Option<&Holder>) {
        self.publish(
            holder.map(|h| h.identity.clone()),
            holder.map(|h| h.fencing_token),
            None,
        );
    }

    /// The single place where a change of leader is recorded, counted and logged.
    pub(super) fn publish(
        &mut self,
        leader: Option<String>,
        token: Option<u64>,
        own: Option<OwnTerm>,
    ) {
        let observer = self.observer.clone();
        let events = self.events.clone();
        self.state.send_if_modified(|s| {
            let was_leading = s.own_term.is_some();
            let leading = own.is_some();
            let same = s.leader == leader && s.fencing_token == token && was_leading == leading;
            s.own_term = own;
            if !leading {
                s.servers = None;
            }
            if same {
                return false;
            }
            s.leader = leader;
            s.fencing_token = token;
            s.term_observed_at = s.leader.as_ref().map(|_| SystemTime::now());
            s.transitions += 1;
            if let Some(o) = &observer {
                o.observe(Observation::Transition);
            }
            let (event, kind) = match (was_leading, leading) {
                (false, true) => ("became leader", "became_leader"),
                (true, false) => ("stopped leading", "stopped_leading"),
                _ => ("leader changed", "leader_changed"),
            };
            let _ = events.send(Event {
                event: kind,
                election: s.election.clone(),
                identity: s.identity.clone(),
                leader: s.leader.clone(),
                fencing_token: s.fencing_token,
                transitions: s.transitions,
                at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            });
            info!(
                election = %s.election,
                identity = %s.identity,
                leader = s.leader.as_deref().unwrap_or(""),
                fencing_token = s.fencing_token.unwrap_or(0),
                transitions = s.transitions,
                "{event}"
            );
            true
        });
    }
}
