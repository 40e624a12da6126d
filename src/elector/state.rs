//! [`LeaderState`], what one candidate knows about its election (published
//! on a `watch` channel, read with the clock at answer time), and [`Event`],
//! a leadership transition as sent to subscribers.
//!
//! Readers get shared references only (`watch::Receiver::borrow`); the
//! fields are written by one function, [`LeaderState::apply`] (see
//! `transition.rs`), called only by the Elector's publisher. Nothing derived
//! is stored: readiness and leadership are computed when asked.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::ElectorConfig;
use crate::backend::BackendError;

/// This candidate's own term, present only while it holds the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnTerm {
    /// The instant (tokio's monotonic clock) after which this candidate must
    /// not claim to lead.
    pub valid_until: Instant,
    /// The term's fencing token.
    pub fencing_token: u64,
    /// The host's suspended time (`CLOCK_BOOTTIME − CLOCK_MONOTONIC`) when
    /// the request behind `valid_until` was sent: a suspend since then
    /// counts against `valid_until` (tokio's clock stops while suspended).
    pub suspended_at_send: Duration,
}

impl OwnTerm {
    /// Whether the term is still valid at `now` (tokio's clock), counting
    /// any suspend of the host since the request behind `valid_until`.
    pub fn valid_at(&self, now: Instant) -> bool {
        self.left_at(now) > Duration::ZERO
    }

    /// How long the term stays valid after `now`, suspends counted.
    pub fn left_at(&self, now: Instant) -> Duration {
        self.valid_until
            .saturating_duration_since(now)
            .saturating_sub(super::suspend::since(self.suspended_at_send))
    }
}

/// Failsafe as this candidate shows it (`/leader`'s `failsafe`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailsafeView {
    /// Whether this leader claims on its members' promises (its renewals
    /// find the backend unreachable).
    pub active: bool,
    /// The bound every required member confirmed (monotonic), if any.
    pub until: Option<Instant>,
    /// How many required members hold a promise now.
    pub members_confirmed: usize,
}

/// A wait that keeps this candidate from campaigning, named for `/leader`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// What is waited for (rendered to words at the edges).
    pub what: crate::backend::WaitReason,
    /// Wall-clock time at which the wait is expected to end (the next
    /// campaign may find another reason to wait).
    pub until: SystemTime,
}

impl Waiting {
    /// When the wait ends, as `/leader` and the log show it: the RFC 3339
    /// time (milliseconds); `"resume"` for a pause (an operator ends it,
    /// not a time); `None` for a closed health gate (it ends when the app
    /// answers: its `until` is only when the gate is asked again).
    pub fn until_text(&self) -> Option<String> {
        match self.what {
            crate::backend::WaitReason::Paused => Some("resume".to_owned()),
            crate::backend::WaitReason::HealthGate => None,
            _ => Some(humantime::format_rfc3339_millis(self.until).to_string()),
        }
    }
}

/// What one candidate knows about its election. Published by the Elector on a
/// `tokio::sync::watch` channel; readers call [`LeaderState::is_leader`] with
/// the current instant each time they answer (or [`LeaderState::is_leader_now`]).
///
/// The fields are public to read; only the Elector writes them.
#[derive(Clone, Debug)]
pub struct LeaderState {
    /// Election name.
    pub election: String,
    /// This candidate's holder identity.
    pub identity: String,
    /// Backend name (`etcd`, `redis`, `kubernetes`, `memory`).
    pub backend: &'static str,
    /// Identity of the holder this candidate last observed; `None` for nobody
    /// (or not yet known).
    pub leader: Option<String>,
    /// Fencing token of the observed holder's term.
    pub fencing_token: Option<u64>,
    /// Wall-clock time at which this candidate first observed the current term.
    pub term_observed_at: Option<SystemTime>,
    /// Set while this candidate holds a term.
    pub own_term: Option<OwnTerm>,
    /// The lease TTL in force (granted by the backend once known).
    pub lease_duration: Duration,
    /// Whether the last backend call succeeded.
    pub backend_healthy: bool,
    /// The last backend error; `None` when healthy. `/leader` and `/readyz`
    /// show its [`BackendError::report`] (one line with its hint).
    pub error: Option<Arc<BackendError>>,
    /// Shutdown started: never claim again.
    pub stopping: bool,
    /// Count of leader changes this candidate observed, including to nobody;
    /// the long-poll index of `/leader`.
    pub transitions: u64,
    /// Redlock: servers that answered the last acquisition or renewal of our
    /// term, and servers in all.
    pub servers: Option<(usize, usize)>,
    /// While following: the instant (monotonic) after which the observed
    /// leader is no longer vouched for, because no backend answer has shown
    /// it for [`ElectorConfig::silence_bound`]. `None`: no bound (not yet
    /// heard, or leading).
    pub heard_until: Option<Instant>,
    /// The wait that keeps this candidate from campaigning right now, if
    /// any (a previous term that may still run, a restarted Redis server).
    pub waiting: Option<Waiting>,
    /// Whether the election is paused by an operator (the backend's
    /// controls, `leader-elector pause`): no candidate takes a released or
    /// expired term; a leader keeps its term. `false` on a backend without
    /// controls.
    pub paused: bool,
    /// This candidate's priority (`--priority`); 0 never campaigns.
    pub priority: u32,
    /// The member a forced switchover pinned as leader (`switchover
    /// --force`): no preemption or revision handover moves the term away
    /// from it until it leaves or a new switchover. `None`: no pin.
    pub pinned: Option<String>,
    /// Failsafe: `None` when off.
    pub failsafe: Option<FailsafeView>,
}

impl LeaderState {
    pub(crate) fn new(cfg: &ElectorConfig, backend: &'static str) -> Self {
        LeaderState {
            election: cfg.election.clone(),
            identity: cfg.identity.clone(),
            backend,
            leader: None,
            fencing_token: None,
            term_observed_at: None,
            own_term: None,
            lease_duration: cfg.lease_duration,
            backend_healthy: false,
            error: None,
            stopping: false,
            transitions: 0,
            servers: None,
            heard_until: None,
            waiting: None,
            paused: false,
            priority: cfg.standing.priority,
            pinned: None,
            failsafe: None,
        }
    }

    /// Whether this candidate is ready (`/readyz`): its last backend call
    /// succeeded, so it knows the leader (or that there is none), and
    /// shutdown has not started.
    pub fn is_ready(&self) -> bool {
        self.backend_healthy && !self.stopping
    }

    /// Whether this candidate leads at `now`: it holds a term whose
    /// `valid_until` lies after `now` plus any time the host was suspended
    /// since that deadline's request was sent, and shutdown has not started.
    pub fn is_leader(&self, now: Instant) -> bool {
        !self.stopping && self.own_term.is_some_and(|t| t.valid_at(now))
    }

    /// [`LeaderState::is_leader`] at this instant (`tokio::time::Instant::now()`).
    pub fn is_leader_now(&self) -> bool {
        self.is_leader(Instant::now())
    }

    /// How long this candidate may still claim to lead at `now` (zero when it does not lead).
    pub fn valid_for(&self, now: Instant) -> Duration {
        match self.own_term {
            Some(t) if !self.stopping => t.left_at(now),
            _ => Duration::ZERO,
        }
    }

    /// The leader as this candidate may report it at `now`: the observed
    /// holder, except that our own term past `valid_until`, and another
    /// holder not confirmed by the backend since `heard_until`, are reported
    /// as unknown (`None`): a follower never vouches for a leader it cannot see.
    pub fn leader_at(&self, now: Instant) -> Option<&str> {
        if self.own_term.is_some() {
            if !self.is_leader(now) {
                return None;
            }
        } else if self.heard_until.is_some_and(|t| now >= t) {
            return None;
        }
        self.leader.as_deref()
    }
}

/// The kind of a leadership transition ([`Event::event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// This candidate started leading (`became_leader`).
    BecameLeader,
    /// This candidate stopped claiming to lead (`stopped_leading`).
    StoppedLeading,
    /// Another holder, or nobody, was observed (`leader_changed`).
    LeaderChanged,
}

impl EventKind {
    /// The wire name (`became_leader`, `stopped_leading`, `leader_changed`),
    /// as serialized in [`Event`].
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::BecameLeader => "became_leader",
            EventKind::StoppedLeading => "stopped_leading",
            EventKind::LeaderChanged => "leader_changed",
        }
    }

    /// The log message (`became leader`, `stopped leading`, `leader changed`).
    pub fn words(self) -> &'static str {
        match self {
            EventKind::BecameLeader => "became leader",
            EventKind::StoppedLeading => "stopped leading",
            EventKind::LeaderChanged => "leader changed",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A leadership transition, as sent to [`Elector::events`](super::Elector::events)
/// subscribers (the `--notify-url` notifier), in the order they happened.
/// Serializes to the notifier's JSON body.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Event {
    /// What happened.
    pub event: EventKind,
    /// Election name.
    pub election: String,
    /// This candidate's identity.
    pub identity: String,
    /// The leader after the transition; `null` for nobody.
    pub leader: Option<String>,
    /// Fencing token of the leader's term.
    pub fencing_token: Option<u64>,
    /// The long-poll index after the transition.
    pub transitions: u64,
    /// RFC 3339 wall-clock time of the transition.
    pub at: String,
}
