//! The Elector: campaign, renew and step-down loop for one candidate, and the
//! [`LeaderState`] it publishes.
//!
//! Invariant (DESIGN.md, "The safety rule"): this candidate may say it leads
//! only while `now < valid_until`, where `valid_until` is the instant the last
//! acknowledged renewal (or the acquisition) was *sent*, plus the granted TTL,
//! minus a drift margin. The backend keeps the key at least that long (it
//! starts counting when it receives the request, later than we sent it), so no
//! follower can take over while we still claim. Readers compute
//! [`LeaderState::is_leader`] at the moment they answer, from the monotonic
//! tokio clock, so a paused process resumes as "not leader".
//!
//! The Elector is the only writer of the `watch` channel and owns all timing:
//! backends are called one verb at a time, each under a call deadline.
//!
//! Layout: this file is the safety core's campaign loop ([`Elector::run`]);
//! `lead` holds a term (renew, step down, resign); `follow` follows another
//! holder; `publish` is the one writer of [`LeaderState`] and of [`Event`]s;
//! `gates` holds the features that only delay or gate a candidacy or a
//! step-down (health gate, cooldown, drain, release wait, participants),
//! called by the core at four documented points; `observe` reports each
//! step to an [`Observer`] (the metrics); `known` what the Elector knows of
//! controls, registry and dead members; `config`, `builder` and `state` hold
//! the public types, `transition` the state's one writer, `watching` waits.
//!
//! What an embedding program needs is re-exported at the crate root; the
//! rest of this module serves the sidecar binary and its tests and is not a
//! stable API.

mod agree;
mod builder;
mod config;
mod controls;
mod failsafe;
#[cfg(test)]
pub(crate) use failsafe::is_outage;
mod follow;
mod gates;
mod known;
mod lead;
mod observe;
mod precedence;
mod preempt;
mod publish;
mod registry;
mod state;
pub(crate) mod suspend;
mod transition;
mod watching;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::backend::candidates::Candidate;
use crate::backend::{BackendError, Campaign, Holder, LeaseBackend, Term, WaitReason};
use crate::backend::{CandidateRegistry, ControlStore};
pub use builder::{DEFAULT_LEASE_DURATION, ElectorBuilder};
use config::{Backoff, jitter};
pub use config::{DEFAULT_PREEMPT_AFTER, ElectorConfig, ElectorConfigError, Standing};
pub use controls::{Handover, SwitchoverRefusal};
use gates::Gates;
pub use gates::PARTICIPANT_WAIT;
pub use observe::{Observation, Observer};
pub use precedence::{MatrixOp, ModelMember, Rules, TableModel, check_target, successor_for};
use publish::Publisher;
pub use state::{Event, EventKind, FailsafeView, LeaderState, OwnTerm, Waiting};
use transition::Change;
pub use watching::{LEADING_RECHECK, until_leading, until_not_leading};

/// How soon a candidate kept out by another's head start looks at the key
/// again: a quarter of the shortest head start.
const HEAD_START_RECHECK: Duration = Duration::from_millis(25);

/// Requests to a running Elector (from the control listener or the run-mode supervisor).
#[derive(Debug)]
enum Command {
    Resign {
        cooldown: Duration,
        /// The identity to name in the release (a switchover); `None`: the
        /// Elector's own choice ([`successor_for`]).
        successor: Option<String>,
        reply: oneshot::Sender<bool>,
    },
    Release,
}

/// A cheap handle to ask a running [`Elector`] to resign, hand over or
/// finish draining.
#[derive(Clone)]
pub struct ElectorHandle {
    tx: mpsc::Sender<Command>,
    /// The backend, for its name in errors.
    backend: Arc<dyn LeaseBackend>,
    /// To check a switchover's target (`None`: no registry), and who is dead.
    registry: Option<Arc<dyn CandidateRegistry>>,
    known: known::Shared,
    /// To follow the controls and write a pin; `None`: it keeps none.
    controls: Option<Arc<dyn ControlStore>>,
    state: watch::Receiver<LeaderState>,
    call_timeout: Duration,
}

impl std::fmt::Debug for ElectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorHandle").finish_non_exhaustive()
    }
}

impl ElectorHandle {
    /// Give up leadership now (stop claiming, release the key) and stay out
    /// of campaigns for `cooldown`. Returns whether this candidate was leading;
    /// `false` also when the Elector has stopped.
    pub async fn resign(&self, cooldown: Duration) -> bool {
        self.send_resign(cooldown, None).await
    }

    /// Hand over to `successor` (an identity in the candidate registry): a
    /// graceful release, like [`resign`](Self::resign) without a cooldown,
    /// that names `successor` so the other candidates leave it the term
    /// (see [`LeaseBackend::release`]). Only a hint: the backend's
    /// compare-and-swap still decides. Answers once the release was sent
    /// (after the drain and participant waits of a step-down). Returns
    /// whether this candidate was leading; `false` also when the Elector
    /// has stopped.
    pub async fn hand_over(&self, successor: &str) -> bool {
        self.send_resign(Duration::ZERO, Some(successor.to_owned()))
            .await
    }

    async fn send_resign(&self, cooldown: Duration, successor: Option<String>) -> bool {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Resign {
            cooldown,
            successor,
            reply,
        };
        if self.tx.send(cmd).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Tell a draining Elector that the app finished its leader work: release
    /// the key now. Does nothing when not draining.
    pub async fn release(&self) {
        let _ = self.tx.send(Command::Release).await;
    }
}

/// Runs the campaign of one candidate. Create with [`Elector::builder`] (or
/// [`Elector::new`]), then drive [`Elector::run`] on a task; read the state
/// from the receiver (see [`until_leading`] and [`until_not_leading`]).
/// Cancelling the token given to `run` stops claiming at once and releases
/// a held term before `run` returns: await it before the process exits.
pub struct Elector {
    cfg: ElectorConfig,
    backend: Arc<dyn LeaseBackend>,
    /// The candidate registry (`None`: the backend keeps none, and the
    /// Elector names no successor).
    registry: Option<Arc<dyn CandidateRegistry>>,
    /// The operator controls (`None`: never paused, no switchover).
    controls: Option<Arc<dyn ControlStore>>,
    /// The one writer of the published state and events.
    publisher: Publisher,
    backoff: Backoff,
    /// A term we stopped claiming but could not resign; resigned before the next campaign.
    abandoned: Option<Term>,
    /// The holder we saw last, so the backend can wait for its term to end.
    last_seen: Option<Holder>,
    commands_tx: mpsc::Sender<Command>,
    commands: mpsc::Receiver<Command>,
    /// Health gate, cooldown, drain, release wait, participants.
    gates: Gates,
    /// The term last shown alive by a backend answer (fencing token), and the
    /// send instant of that answer: the start of the next failover.
    term_seen: Option<(u64, Instant)>,
    /// The host's suspended time when the last campaign was sent (a term it
    /// won is valid from then, suspends counted).
    suspended_at_campaign: Duration,
    /// The successor the next release of a held term names (a switchover
    /// or a preemption), with the handover's reason for the metrics;
    /// `None`: the Elector's own choice ([`successor_for`]).
    successor: Option<(String, &'static str)>,
    /// The controls and the registry as last read (the precedence inputs).
    known: known::Shared,
    /// The answer to a handover, sent once its release was sent.
    handed_over: Option<oneshot::Sender<bool>>,
    /// Failsafe (`None`: off): the member's promises and the leader's
    /// confirmations ([`crate::failsafe`]).
    failsafe: Option<Arc<crate::failsafe::Failsafe>>,
    /// The roster staged with the campaign being sent.
    staged: Option<crate::failsafe::Roster>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("cfg", &self.cfg)
            .field("backend", &self.backend.name())
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// A new Elector and the receiver of its state, from a configuration
    /// that [`ElectorConfig::validate`] accepts ([`Elector::builder`]
    /// validates for you). `observer` (the sidecar's Prometheus metrics,
    /// usually) is told of every campaign, renewal, backend error,
    /// transition and failover.
    pub fn new(
        cfg: ElectorConfig,
        backend: Arc<dyn LeaseBackend>,
        observer: Option<Arc<dyn Observer>>,
    ) -> (Self, watch::Receiver<LeaderState>) {
        let (publisher, rx) = Publisher::new(LeaderState::new(&cfg, backend.name()), observer);
        let backoff = Backoff::new(Duration::from_millis(100), cfg.retry_period);
        let (commands_tx, commands) = mpsc::channel(8);
        let gates = Gates::new(&cfg);
        (
            Elector {
                cfg,
                backend,
                registry: None,
                controls: None,
                publisher,
                backoff,
                abandoned: None,
                last_seen: None,
                commands_tx,
                commands,
                gates,
                term_seen: None,
                suspended_at_campaign: Duration::ZERO,
                successor: None,
                handed_over: None,
                known: known::shared(),
                failsafe: None,
                staged: None,
            },
            rx,
        )
    }

    /// A handle to resign or release while [`Elector::run`] runs.
    pub fn handle(&self) -> ElectorHandle {
        ElectorHandle {
            tx: self.commands_tx.clone(),
            backend: self.backend.clone(),
            registry: self.registry.clone(),
            known: self.known.clone(),
            controls: self.controls.clone(),
            state: self.publisher.watch_state(),
            call_timeout: self.cfg.call_timeout(),
        }
    }

    /// Transitions in order (a slow subscriber that falls more than 64 behind
    /// loses the oldest ones; see `tokio::sync::broadcast`).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.publisher.subscribe()
    }

    /// Campaign only while `gate` holds `true`; a leader whose gate stays
    /// `false` for [`ElectorConfig::health_grace`] resigns.
    pub fn with_candidacy(mut self, gate: watch::Receiver<bool>) -> Self {
        self.gates.set_candidacy(gate);
        self
    }

    /// Register a reader that acts for our terms (e.g. labels our Pod as the
    /// leader). It sends `Some(fencing_token)` while acting for a term and
    /// `None` when done; after a step-down the Elector waits for `None` (at
    /// most [`PARTICIPANT_WAIT`], never past `valid_until`) before releasing the
    /// key.
    pub fn add_participant(&mut self) -> watch::Sender<Option<u64>> {
        self.gates.add_participant()
    }

    /// Campaign until `shutdown` is cancelled; on shutdown stop claiming at
    /// once, resign a held term (bounded by the call timeout) and return.
    /// Backend faults never end this loop.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let backend = self.backend.clone();
        let registry = self.start_registry(&shutdown);
        let controls = controls::Follower::start(
            self.handle(),
            self.publisher.controls_writer(self.known.clone()),
            (self.cfg.retry_period, self.cfg.lease_duration),
        );
        while !shutdown.is_cancelled() {
            if !self.gates.may_campaign() {
                if !self.wait_until_eligible(&shutdown).await {
                    break;
                }
                continue;
            }
            if let Some(term) = self.abandoned.take()
                && let Err(e) = self.call("release", backend.release(&term, None)).await
            {
                debug!(error = %e.report(), "could not resign an abandoned term yet");
                self.abandoned = Some(term);
            }
            match self.failsafe_hold(&shutdown).await {
                Some(true) => break,
                Some(false) => continue,
                None => {}
            }
            self.report(Observation::CampaignSent);
            let sent = Instant::now();
            self.suspended_at_campaign = suspend::suspended();
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = self.call("campaign", backend.campaign(&self.cfg.identity, self.cfg.lease_duration, self.last_seen.as_ref())) => r,
            };
            self.campaign_answered(&attempt);
            // A timed wait (a successor's head start, a pause) ends early
            // when the controls change: a resume, a new switchover request.
            let mut known = self.known.subscribe();
            if let Some(wait) = self.after_campaign(attempt, sent, &shutdown).await {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = sleep(wait) => {}
                    _ = known.changed() => {}
                    cmd = self.commands.recv() => self.handle_idle_command(cmd),
                }
            }
        }
        self.publish(Change::Stopping);
        drop(controls);
        if let Some(term) = self.abandoned.take() {
            let _ = self.call("release", backend.release(&term, None)).await;
        }
        if let Some(registry) = registry {
            let limit = self.cfg.call_timeout();
            registry.withdraw(&self.cfg.identity, limit).await;
        }
    }

    /// Start keeping this candidate's record in the registry (`None`: the
    /// backend keeps none).
    fn start_registry(&self, shutdown: &CancellationToken) -> Option<registry::Registry> {
        registry::Registry::start(
            shutdown,
            self.registry.clone(),
            Candidate {
                priority: self.cfg.standing.priority,
                revision: self.cfg.standing.revision.clone(),
                preempt_after: Some(self.cfg.standing.preempt_after),
                ..Candidate::new(self.cfg.identity.clone())
            },
            (
                self.gates.candidacy(),
                Some(self.publisher.watch_state()),
                self.gates.frozen(),
            ),
            self.cfg.lease_duration,
            self.cfg.call_timeout(),
        )
    }

    /// Act on the answer to a campaign sent at `sent`: lead, follow, or
    /// return how long to wait before the next campaign.
    async fn after_campaign(
        &mut self,
        attempt: Result<Campaign, BackendError>,
        sent: Instant,
        shutdown: &CancellationToken,
    ) -> Option<Duration> {
        if !matches!(attempt, Ok(Campaign::Waiting { .. })) {
            self.set_waiting(None);
        }
        match attempt {
            Ok(Campaign::Elected(term)) => {
                self.backend_ok();
                self.heard(Some(term.holder.fencing_token), sent);
                self.lead(term, sent, shutdown).await;
                None
            }
            Ok(Campaign::Following(holder))
                if self
                    .abandoned
                    .as_ref()
                    .is_some_and(|t| t.holder.term_id == holder.term_id) =>
            {
                self.end_abandoned().await
            }
            Ok(Campaign::Following(holder)) => {
                self.backend_ok();
                self.heard(Some(holder.fencing_token), sent);
                self.observe(Some(&holder));
                self.last_seen = Some(holder.clone());
                self.follow(&holder, shutdown).await;
                None
            }
            Ok(Campaign::Waiting {
                previous,
                retry_after,
                why,
            }) => Some(self.wait_for_previous(previous, retry_after, why, sent)),
            Err(e) => {
                self.report(Observation::CampaignFailed { reason: e.reason() });
                let retryable = e.is_retryable();
                let wait = self.retry_wait(&e, Self::next_backoff);
                self.backend_failed(e);
                // A refusal that retrying cannot fix (credentials, RBAC) is
                // never retried faster than the renew interval.
                Some(if retryable {
                    wait
                } else {
                    wait.max(self.cfg.renew_interval)
                })
            }
        }
    }

    /// The key is free but the previous term may still run: remember its
    /// holder (when the backend saw one) and wait `retry_after` at most the
    /// retry period.
    fn wait_for_previous(
        &mut self,
        previous: Option<Holder>,
        retry_after: Duration,
        why: WaitReason,
        sent: Instant,
    ) -> Duration {
        self.backend_ok();
        self.heard(None, sent);
        self.observe(None);
        self.set_waiting(Some((why, retry_after)));
        let name = previous.as_ref().map_or("", |p| p.identity.as_str());
        debug!(previous = %name, ?retry_after, "key is free but the previous term is still alive");
        if previous.is_some() {
            self.last_seen = previous;
        }
        let mut wait = retry_after.min(self.cfg.retry_period) + jitter(Duration::from_millis(20));
        if why == WaitReason::SuccessorHeadStart {
            // The key changes fast during a handover (the successor takes
            // it, and may hand it on at once, naming us): look again within
            // a quarter of the shortest head start, so a head start naming
            // us is never spent asleep.
            wait = wait.min(HEAD_START_RECHECK + jitter(Duration::from_millis(5)));
        }
        wait
    }

    /// Our own abandoned term still holds the key (its release failed, e.g.
    /// while the backend was starting): end it rather than follow our own
    /// dead term until it expires. Returns the wait before the next campaign
    /// when the release fails again.
    async fn end_abandoned(&mut self) -> Option<Duration> {
        self.backend_ok();
        self.observe(None);
        let term = self.abandoned.take()?;
        let backend = self.backend.clone();
        match self.call("release", backend.release(&term, None)).await {
            Ok(()) => {
                info!(election = %self.cfg.election, fencing_token = term.holder.fencing_token, "released our own abandoned term; campaigning again");
                self.last_seen = None;
                None
            }
            Err(e) => {
                let wait = self.retry_wait(&e, Self::next_backoff);
                self.backend_failed(e);
                self.abandoned = Some(term);
                Some(wait)
            }
        }
    }

    fn next_backoff(&mut self) -> Duration {
        self.backoff.next()
    }

    /// The wait after the failed call that answered `e`: the backend's own
    /// when it is throttling us (its `Retry-After`, at most one renew
    /// interval, plus up to a tenth of it so that candidates told the same
    /// do not return in step), else `backoff`'s next step.
    fn retry_wait(
        &mut self,
        e: &BackendError,
        backoff: impl FnOnce(&mut Self) -> Duration,
    ) -> Duration {
        match e.retry_after() {
            Some(d) => {
                let d = d.min(self.cfg.renew_interval);
                d + jitter(d / 10)
            }
            None => backoff(self),
        }
    }
}

#[cfg(test)]
#[path = "elector_tests.rs"]
mod tests;
