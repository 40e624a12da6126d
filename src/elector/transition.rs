//! Every change the Elector makes to its published [`LeaderState`] is one
//! [`Change`], applied by [`LeaderState::apply`]: a pure function of the
//! state, the change and the wall-clock time it is given (no I/O, no other
//! clock), so each rule is tested without a backend. The publisher
//! (`publish.rs`) is its only caller: it sends the result to the readers,
//! then logs and announces what the returned [`Applied`] says happened.
//!
//! Invariants kept here:
//! - a claim (`own_term`) is set only by [`Change::Elected`] and moved only
//!   by [`Change::Renewed`]; every other observation of the key clears it,
//!   so the Elector stops claiming before it does anything else;
//! - `stopping` is never cleared;
//! - `transitions` (the long-poll index) grows by one for each change of
//!   (leader, fencing token, leading), and for nothing else;
//! - readiness and leadership are not stored: [`LeaderState::is_ready`] and
//!   [`LeaderState::is_leader`] derive them when asked.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{EventKind, LeaderState, OwnTerm, Waiting};
use crate::backend::BackendError;

/// One change of the published state.
#[derive(Clone, Debug)]
pub(super) enum Change {
    /// The last backend call succeeded.
    BackendUp,
    /// The last backend call failed with this error.
    BackendDown(Arc<BackendError>),
    /// A backend answer vouches for the observed holder until this instant.
    Heard(Instant),
    /// What keeps this candidate from campaigning now (`None`: nothing).
    Waiting(Option<Waiting>),
    /// This candidate won a term, granted for `ttl`.
    Elected {
        /// Our holder identity.
        identity: String,
        /// The term and its validity.
        own: OwnTerm,
        /// The TTL the backend granted.
        ttl: Duration,
        /// Redlock: servers that granted it, and servers in all.
        servers: Option<(usize, usize)>,
    },
    /// A renewal of our term was acknowledged.
    Renewed {
        /// The new validity deadline.
        valid_until: Instant,
        /// The host's suspended time when the renewal was sent.
        suspended_at_send: Duration,
        /// The TTL the backend reports.
        ttl: Duration,
        /// Redlock: servers that renewed, and servers in all.
        servers: Option<(usize, usize)>,
    },
    /// Another holder, or nobody (`leader: None`), observed: we claim nothing.
    Observed {
        /// The holder's identity.
        leader: Option<String>,
        /// The holder's fencing token.
        fencing_token: Option<u64>,
    },
    /// Failsafe's view changed; `claim`: our term's new validity deadline
    /// (the later of the lease's and the members' confirmed bound) and the
    /// host's suspended time when the heartbeats behind it were sent.
    Failsafe {
        /// What `/leader` shows.
        view: super::state::FailsafeView,
        /// The new claim.
        claim: Option<(Instant, Duration)>,
    },
    /// Shutdown began: never claim again.
    Stopping,
    /// The election's pause marker and pin as the backend's controls show them.
    Controls {
        /// Whether the election is paused.
        paused: bool,
        /// The member pinned by a forced switchover.
        pinned: Option<String>,
    },
}

/// Something worth one log line, found while applying a [`Change`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Note {
    /// The backend answered after an error.
    BackendRecovered,
    /// A backend error not reported just before (a new one, or after a success).
    BackendFailed,
    /// A new kind of wait began.
    NewWait,
}

/// What applying a [`Change`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Applied {
    /// Whether readers should be woken.
    pub notify: bool,
    /// The leader change it made, if any.
    pub transition: Option<EventKind>,
    /// What to log.
    pub note: Option<Note>,
}

impl Applied {
    fn woken(notify: bool) -> Self {
        Applied {
            notify,
            ..Applied::default()
        }
    }
    fn noted(notify: bool, note: Option<Note>) -> Self {
        Applied {
            note,
            ..Applied::woken(notify)
        }
    }
    fn moved(notify: bool, transition: Option<EventKind>) -> Self {
        Applied {
            transition,
            ..Applied::woken(notify)
        }
    }
}

impl LeaderState {
    /// Failsafe's view, and our term's new claim when given.
    fn failsafe(
        &mut self,
        view: super::state::FailsafeView,
        claim: Option<(Instant, Duration)>,
    ) -> Applied {
        if let (Some(t), Some((until, suspended))) = (&mut self.own_term, claim) {
            t.valid_until = until;
            t.suspended_at_send = suspended;
        }
        let changed = self.failsafe.is_some_and(|f| f.active) != view.active;
        self.failsafe = Some(view);
        Applied::woken(changed || claim.is_some())
    }

    /// Apply `change` at wall-clock time `wall` (stamped on a new term);
    /// the one writer of the state (see the module docs).
    pub(super) fn apply(&mut self, change: Change, wall: SystemTime) -> Applied {
        match change {
            Change::BackendUp => self.backend(None),
            Change::BackendDown(e) => self.backend(Some(e)),
            Change::Heard(until) => {
                // Read-time only: no reader needs waking for this.
                self.heard_until = Some(until);
                Applied::woken(false)
            }
            Change::Waiting(wait) => {
                let new_kind = wait.map(|w| w.what) != self.waiting.map(|w| w.what);
                self.waiting = wait;
                let note = (new_kind && wait.is_some()).then_some(Note::NewWait);
                Applied::noted(new_kind, note)
            }
            Change::Elected {
                identity,
                own,
                ttl,
                servers,
            } => {
                self.lease_duration = ttl;
                self.servers = servers;
                let token = Some(own.fencing_token);
                Applied::moved(true, self.holder(Some(identity), token, Some(own), wall))
            }
            Change::Renewed {
                valid_until,
                suspended_at_send,
                ttl,
                servers,
            } => {
                if let Some(t) = &mut self.own_term {
                    t.valid_until = valid_until;
                    t.suspended_at_send = suspended_at_send;
                }
                self.lease_duration = ttl;
                self.servers = servers;
                Applied::woken(true)
            }
            Change::Observed {
                leader,
                fencing_token,
            } => {
                let transition = self.holder(leader, fencing_token, None, wall);
                Applied::moved(transition.is_some(), transition)
            }
            Change::Failsafe { view, claim } => self.failsafe(view, claim),
            Change::Stopping => {
                self.stopping = true;
                Applied::woken(true)
            }
            Change::Controls { paused, pinned } => {
                let changed = self.paused != paused || self.pinned != pinned;
                self.paused = paused;
                self.pinned = pinned;
                Applied::woken(changed)
            }
        }
    }

    /// Record a backend answer: healthy (`None`) or failed with `error`.
    /// An error is news when its report differs from the last one's.
    fn backend(&mut self, error: Option<Arc<BackendError>>) -> Applied {
        let Some(error) = error else {
            let note = self.error.take().map(|_| Note::BackendRecovered);
            let notify = !self.backend_healthy || note.is_some();
            self.backend_healthy = true;
            return Applied::noted(notify, note);
        };
        let first = self.error.as_ref().map(|e| e.report()) != Some(error.report());
        let notify = self.backend_healthy || first;
        self.backend_healthy = false;
        self.error = Some(error);
        Applied::noted(notify, first.then_some(Note::BackendFailed))
    }

    /// Record the holder (`own`: ours); returns the transition when the
    /// leader, its token or whether we lead changed.
    fn holder(
        &mut self,
        leader: Option<String>,
        token: Option<u64>,
        own: Option<OwnTerm>,
        wall: SystemTime,
    ) -> Option<EventKind> {
        let (was_leading, leading) = (self.own_term.is_some(), own.is_some());
        self.own_term = own;
        if !leading {
            self.servers = None;
        }
        if self.leader == leader && self.fencing_token == token && was_leading == leading {
            return None;
        }
        self.term_observed_at = leader.as_ref().map(|_| wall);
        self.leader = leader;
        self.fencing_token = token;
        self.transitions += 1;
        Some(match (was_leading, leading) {
            (false, true) => EventKind::BecameLeader,
            (true, false) => EventKind::StoppedLeading,
            _ => EventKind::LeaderChanged,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elector::ElectorConfig;

    fn state() -> LeaderState {
        LeaderState::new(
            &ElectorConfig::new("e", "me", Duration::from_secs(3)),
            "memory",
        )
    }

    fn elected(token: u64) -> Change {
        Change::Elected {
            identity: "me".into(),
            own: OwnTerm {
                valid_until: Instant::now() + Duration::from_secs(2),
                fencing_token: token,
                suspended_at_send: Duration::ZERO,
            },
            ttl: Duration::from_secs(3),
            servers: Some((2, 3)),
        }
    }

    fn down(why: &'static str) -> Change {
        Change::BackendDown(Arc::new(BackendError::Unreachable {
            backend: crate::backend::memory::ABOUT,
            endpoints: "memory".into(),
            source: why.into(),
        }))
    }

    fn observed(leader: Option<&str>, token: Option<u64>) -> Change {
        Change::Observed {
            leader: leader.map(str::to_owned),
            fencing_token: token,
        }
    }

    #[test]
    fn readiness_is_derived_from_health_and_stopping() {
        let mut s = state();
        assert!(!s.is_ready(), "ready before the backend answered");
        s.apply(Change::BackendUp, SystemTime::now());
        assert!(s.is_ready());
        let a = s.apply(down("x"), SystemTime::now());
        assert_eq!((a.notify, a.note), (true, Some(Note::BackendFailed)));
        assert!(!s.is_ready());
        let a = s.apply(down("x"), SystemTime::now());
        assert_eq!(
            (a.notify, a.note),
            (false, None),
            "the same error again is news to nobody"
        );
        let a = s.apply(Change::BackendUp, SystemTime::now());
        assert_eq!((a.notify, a.note), (true, Some(Note::BackendRecovered)));
        s.apply(Change::Stopping, SystemTime::now());
        assert!(!s.is_ready() && s.backend_healthy);
    }

    #[test]
    fn each_change_of_holder_is_one_transition_and_the_same_holder_none() {
        let mut s = state();
        let steps = [
            (observed(Some("a"), Some(1)), Some(EventKind::LeaderChanged)),
            (observed(Some("a"), Some(1)), None),
            (observed(None, None), Some(EventKind::LeaderChanged)),
            (elected(2), Some(EventKind::BecameLeader)),
            (observed(None, None), Some(EventKind::StoppedLeading)),
            (observed(Some("b"), Some(3)), Some(EventKind::LeaderChanged)),
        ];
        for (i, (change, want)) in steps.into_iter().enumerate() {
            assert_eq!(
                s.apply(change, SystemTime::now()).transition,
                want,
                "step {i}"
            );
        }
        assert_eq!(s.transitions, 5);
        assert_eq!((s.leader.as_deref(), s.fencing_token), (Some("b"), Some(3)));
    }

    #[test]
    fn only_elected_sets_a_claim_and_any_observation_clears_it() {
        let mut s = state();
        s.apply(elected(4), SystemTime::now());
        assert!(s.is_leader_now());
        assert_eq!(s.servers, Some((2, 3)));
        let later = Instant::now() + Duration::from_secs(5);
        s.apply(
            Change::Renewed {
                valid_until: later,
                suspended_at_send: Duration::ZERO,
                ttl: Duration::from_secs(4),
                servers: Some((3, 3)),
            },
            SystemTime::now(),
        );
        assert_eq!(s.own_term.map(|t| t.valid_until), Some(later));
        assert_eq!(s.lease_duration, Duration::from_secs(4));
        s.apply(observed(Some("me"), Some(4)), SystemTime::now());
        assert!(s.own_term.is_none() && s.servers.is_none() && !s.is_leader_now());
        let before = s.clone();
        s.apply(
            Change::Renewed {
                valid_until: later,
                suspended_at_send: Duration::ZERO,
                ttl: Duration::from_secs(4),
                servers: None,
            },
            SystemTime::now(),
        );
        assert!(s.own_term.is_none(), "a renewal never re-creates a claim");
        assert_eq!(s.transitions, before.transitions);
    }

    #[test]
    fn stopping_ends_every_claim_and_stays() {
        let mut s = state();
        s.apply(elected(1), SystemTime::now());
        s.apply(Change::Stopping, SystemTime::now());
        assert!(!s.is_leader_now() && s.stopping);
        s.apply(Change::BackendUp, SystemTime::now());
        assert!(s.stopping && !s.is_ready());
    }

    #[test]
    fn a_new_kind_of_wait_is_news_and_the_same_kind_is_not() {
        let mut s = state();
        let wait = |what| Waiting {
            what,
            until: SystemTime::now(),
        };
        let a = s.apply(
            Change::Waiting(Some(wait(crate::backend::WaitReason::Paused))),
            SystemTime::now(),
        );
        assert_eq!((a.notify, a.note), (true, Some(Note::NewWait)));
        let a = s.apply(
            Change::Waiting(Some(wait(crate::backend::WaitReason::Paused))),
            SystemTime::now(),
        );
        assert_eq!((a.notify, a.note), (false, None));
        let a = s.apply(Change::Waiting(None), SystemTime::now());
        assert_eq!((a.notify, a.note), (true, None));
    }
}
