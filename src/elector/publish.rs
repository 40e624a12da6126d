//! The [`Publisher`], the one writer of [`LeaderState`]: it owns the `watch`
//! sender, applies each [`Change`] through [`LeaderState::apply`], and is
//! the single place where a change of leader is logged, counted and sent as
//! an [`Event`]. Every step is also reported to the [`Observer`] (the
//! metrics). The Elector's helpers below say in the loop's words what
//! happened (a backend answer, a new term, a renewal) and hand the change
//! to the publisher.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, timeout};
use tracing::{info, warn};

use super::observe::{Observation, Observer};
use super::transition::{Applied, Change, Note};
use super::{Elector, Event, LeaderState, OwnTerm, Waiting};
use crate::backend::controls::Controls;
use crate::backend::{BackendError, Holder, Term, WaitReason};

/// Owns the published state and the event stream (see the module docs).
pub(super) struct Publisher {
    state: watch::Sender<LeaderState>,
    events: broadcast::Sender<Event>,
    observer: Option<Arc<dyn Observer>>,
}

impl Publisher {
    /// A publisher of `initial` and the first reader of its state.
    pub(super) fn new(
        initial: LeaderState,
        observer: Option<Arc<dyn Observer>>,
    ) -> (Self, watch::Receiver<LeaderState>) {
        let (state, rx) = watch::channel(initial);
        let (events, _) = broadcast::channel(64);
        let publisher = Publisher {
            state,
            events,
            observer,
        };
        (publisher, rx)
    }

    /// Report `o` to the observer, if any.
    pub(super) fn report(&self, o: Observation) {
        if let Some(obs) = &self.observer {
            obs.observe(o);
        }
    }

    /// The observer, for the Elector's helper tasks.
    pub(super) fn observer(&self) -> Option<Arc<dyn Observer>> {
        self.observer.clone()
    }

    /// A new subscriber to the transitions.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// A new reader of the published state.
    pub(super) fn watch_state(&self) -> watch::Receiver<LeaderState> {
        self.state.subscribe()
    }

    /// The state as published now.
    pub(super) fn state(&self) -> watch::Ref<'_, LeaderState> {
        self.state.borrow()
    }

    /// A writer of the controls (the pause marker and the pin in the
    /// state, all of them in `known`), for the controls follower's task.
    pub(super) fn controls_writer(&self, known: super::known::Shared) -> ControlsWriter {
        ControlsWriter {
            state: self.state.clone(),
            known,
        }
    }

    /// Apply `change`, wake the readers if it matters to them, then log and
    /// announce what happened. `config_problem` picks the level of a backend
    /// error's log line.
    pub(super) fn apply(&self, change: Change, config_problem: bool) {
        let mut applied = Applied::default();
        self.state.send_if_modified(|s| {
            applied = s.apply(change, SystemTime::now());
            applied.notify
        });
        let s = self.state.borrow();
        match applied.note {
            Some(Note::BackendRecovered) => {
                info!(election = %s.election, "backend reachable again")
            }
            Some(Note::BackendFailed) => {
                let report = s.error.as_ref().map(|e| e.report()).unwrap_or_default();
                if config_problem {
                    tracing::error!(election = %s.election, error = %report, "backend call failed: configuration problem");
                } else {
                    warn!(election = %s.election, error = %report, "backend call failed");
                }
            }
            Some(Note::NewWait) => {
                if let Some(w) = s.waiting {
                    let what = w.what.as_str();
                    match w.until_text() {
                        Some(until) => {
                            info!(election = %s.election, waiting_for = what, until = %until, "not campaigning yet")
                        }
                        // A closed health gate ends when the app answers.
                        None => {
                            info!(election = %s.election, waiting_for = what, "not campaigning yet")
                        }
                    }
                }
            }
            None => {}
        }
        let Some(kind) = applied.transition else {
            return;
        };
        let event = Event {
            event: kind,
            election: s.election.clone(),
            identity: s.identity.clone(),
            leader: s.leader.clone(),
            fencing_token: s.fencing_token,
            transitions: s.transitions,
            at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        };
        drop(s);
        info!(
            election = %event.election,
            identity = %event.identity,
            leader = event.leader.as_deref().unwrap_or(""),
            fencing_token = event.fencing_token.unwrap_or(0),
            transitions = event.transitions,
            "{}",
            kind.words()
        );
        self.report(Observation::Transition);
        let _ = self.events.send(event);
    }
}

/// Writes [`LeaderState::paused`] through [`LeaderState::apply`] like
/// every other change (no leader change follows from it: nothing to log or
/// announce), from the task that follows the backend's controls.
#[derive(Clone)]
pub(super) struct ControlsWriter {
    state: watch::Sender<LeaderState>,
    known: super::known::Shared,
}

impl ControlsWriter {
    /// Publish the controls `c`; readers are woken when they changed.
    pub(super) fn set(&self, c: &Controls) {
        let change = Change::Controls {
            paused: c.paused,
            pinned: c.pinned().map(str::to_owned),
        };
        self.state
            .send_if_modified(|s| s.apply(change, SystemTime::now()).notify);
        self.known.send_if_modified(|k| {
            let changed = k.controls != *c;
            k.controls = c.clone();
            changed
        });
    }
}

impl Elector {
    /// Report `o` to the observer, if any.
    pub(super) fn report(&self, o: Observation) {
        self.publisher.report(o);
    }

    /// Publish `change` (never a backend error: see [`Elector::backend_failed`]).
    pub(super) fn publish(&self, change: Change) {
        self.publisher.apply(change, false);
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
    pub(super) fn set_waiting(&mut self, wait: Option<(WaitReason, Duration)>) {
        let wait = wait.map(|(what, left)| Waiting {
            what,
            until: SystemTime::now() + left,
        });
        self.publish(Change::Waiting(wait));
    }

    /// The last backend call succeeded.
    pub(super) fn backend_ok(&mut self) {
        self.backoff.reset();
        self.report(Observation::BackendUp(true));
        self.publish(Change::BackendUp);
    }

    /// The last backend call failed with `e`; a new error is logged once.
    pub(super) fn backend_failed(&mut self, e: BackendError) {
        if let Some(fs) = &self.failsafe {
            fs.blind();
        }
        self.report(Observation::BackendUp(false));
        let config_problem = !e.is_retryable();
        self.publisher
            .apply(Change::BackendDown(Arc::new(e)), config_problem);
    }

    /// A backend answer sent at `sent` showed the term with fencing token
    /// `token` holding the key (`None`: nobody). Extends how long followers
    /// may name the observed leader, and records the duration of a failover
    /// when the term differs from the one seen before.
    pub(super) fn heard(&mut self, token: Option<u64>, sent: Instant) {
        if let Some(fs) = &self.failsafe {
            fs.saw(token);
        }
        self.publish(Change::Heard(sent + self.cfg.silence_bound()));
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

    /// Publish our new `term`, valid until `valid_until`.
    pub(super) fn elected(&mut self, term: &Term, valid_until: Instant) {
        let own = OwnTerm {
            valid_until,
            fencing_token: term.holder.fencing_token,
            suspended_at_send: self.suspended_at_campaign,
        };
        self.publish(Change::Elected {
            identity: term.holder.identity.clone(),
            own,
            ttl: term.ttl,
            servers: term.servers,
        });
    }

    /// Record the holder observed as a follower (`None`: nobody holds the
    /// key); ends our own claim, if any.
    pub(super) fn observe(&mut self, holder: Option<&Holder>) {
        let (me, now) = (self.cfg.identity.as_str(), Instant::now());
        let id = holder.map(|h| h.identity.as_str());
        // Nobody waits on this: no wake-up.
        self.known.send_if_modified(|k| {
            k.alive.saw_holder(id, me, now);
            false
        });
        self.publish(Change::Observed {
            leader: holder.map(|h| h.identity.clone()),
            fencing_token: holder.map(|h| h.fencing_token),
        });
    }
}
