//! The features that only delay or gate a candidacy or a step-down, kept
//! apart from the safety core: the candidacy (health) gate and its grace,
//! the resign cooldown, the drain on shutdown, the release wait of run mode
//! and the participants (the Pod labeler) that act for a term.
//!
//! The core calls them at four points, and only there:
//!
//! 1. [`Gates::may_campaign`] before every campaign: `false` keeps the
//!    candidate a read-only follower ([`Gates::cool_down`] and the candidacy
//!    gate close it; [`Gates::candidacy_closes`] ends a follow early).
//! 2. [`Gates::unhealthy_past_grace`] while leading: when it resolves the
//!    core steps down as it would on a resign.
//! 3. [`Gates::drain`] when shutdown arrives while leading: the core stops
//!    claiming at once and keeps renewing until `POST /release` or the drain
//!    timeout.
//! 4. [`Gates::before_release`] after the core has stopped claiming and
//!    before it releases the key: waits for the app and the participants.
//!
//! Why none of them can break the safety rule (DESIGN.md): a gate can only
//! say "do not campaign yet" or "step down now", and stepping down early is
//! always safe. The drain and the release waits run after the core has
//! published that it no longer claims (`stopping` or no `own_term`); they
//! never move `valid_until`, the waits after a step-down are bounded by it,
//! and a key kept longer only delays the next leader, which still waits for
//! the backend to give it the key.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tracing::warn;

use super::lead::StepDown;
use super::{Command, ElectorConfig};

/// Longest wait for participants (see [`super::Elector::add_participant`]) to
/// let go of a term before its key is released anyway.
pub const PARTICIPANT_WAIT: Duration = Duration::from_secs(2);

/// The delaying and gating features of one candidate (see the module docs).
#[derive(Debug)]
pub(super) struct Gates {
    /// Campaign only while this is `true` (health-gated candidacy).
    candidacy: Option<watch::Receiver<bool>>,
    /// No campaign before this instant (after a resign).
    cooldown_until: Option<Instant>,
    /// Readers that act for a term (the Pod labeler): each shows the fencing
    /// token it still acts for; the key is released after they let go.
    participants: Vec<watch::Receiver<Option<u64>>>,
    health_grace: Duration,
    drain_timeout: Option<Duration>,
    release_wait: Option<Duration>,
    /// Priority 0: never campaign (follow and report only).
    never_leads: bool,
    /// The end of the freeze (a cooldown after a resign) on the monotonic
    /// clock and by the wall clock, for the candidate registry's record
    /// (`None`: not frozen).
    frozen: watch::Sender<Option<(Instant, SystemTime)>>,
}

impl Gates {
    pub(super) fn new(cfg: &ElectorConfig) -> Self {
        Gates {
            candidacy: None,
            cooldown_until: None,
            participants: Vec::new(),
            health_grace: cfg.health_grace,
            drain_timeout: cfg.drain_timeout,
            release_wait: cfg.release_wait,
            never_leads: cfg.standing.priority == 0,
            frozen: watch::channel(None).0,
        }
    }

    /// The end of the freeze, as the registry record shows it.
    pub(super) fn frozen(&self) -> watch::Receiver<Option<(Instant, SystemTime)>> {
        self.frozen.subscribe()
    }

    pub(super) fn set_candidacy(&mut self, gate: watch::Receiver<bool>) {
        self.candidacy = Some(gate);
    }

    /// The candidacy gate, for the candidate registry's readiness.
    pub(super) fn candidacy(&self) -> Option<watch::Receiver<bool>> {
        self.candidacy.clone()
    }

    pub(super) fn add_participant(&mut self) -> watch::Sender<Option<u64>> {
        let (tx, rx) = watch::channel(None);
        self.participants.push(rx);
        tx
    }

    /// Point 1: whether the cooldown has ended and the candidacy gate is
    /// open (never with priority 0).
    pub(super) fn may_campaign(&self) -> bool {
        let cooled = self.cooldown_until.is_none_or(|t| Instant::now() >= t);
        let healthy = self.candidacy.as_ref().is_none_or(|g| *g.borrow());
        cooled && healthy && !self.never_leads
    }

    /// Whether a candidacy gate is set and closed (the app is unhealthy).
    pub(super) fn health_gate_closed(&self) -> bool {
        self.candidacy.as_ref().is_some_and(|g| !*g.borrow())
    }

    /// Stay out of campaigns for `cooldown` from now (after a resign): a
    /// freeze, which the registry record shows (not eligible until then).
    pub(super) fn cool_down(&mut self, cooldown: Duration) {
        let until = Instant::now() + cooldown;
        self.cooldown_until = Some(until);
        let until = (!cooldown.is_zero()).then(|| (until, SystemTime::now() + cooldown));
        self.frozen.send_replace(until);
    }

    /// The end of the cooldown, if one was set.
    pub(super) fn cooldown_until(&self) -> Option<Instant> {
        self.cooldown_until
    }

    /// Resolves when the candidacy gate changes; with `true` when its sender
    /// is gone, after which the gate is dropped (stop gating rather than
    /// never campaign again). Pends forever without a gate.
    pub(super) fn candidacy_changed(&self) -> impl Future<Output = bool> + 'static {
        let gate = self.candidacy.clone();
        async move {
            let Some(mut g) = gate else {
                return std::future::pending().await;
            };
            g.changed().await.is_err() || g.has_changed().is_err()
        }
    }

    /// Forget a candidacy gate whose health checker is gone.
    pub(super) fn drop_candidacy(&mut self) {
        self.candidacy = None;
    }

    /// Resolves when the candidacy gate closes (turns `false` or its sender
    /// goes away), so a follower stops following until it is healthy again.
    /// Pends forever without a gate.
    pub(super) fn candidacy_closes(&self) -> impl Future<Output = ()> + 'static {
        let gate = self.candidacy.clone();
        async move {
            let Some(mut g) = gate else {
                return std::future::pending().await;
            };
            while g.changed().await.is_ok() && *g.borrow() {}
        }
    }

    /// Point 2: resolves once the candidacy gate has stayed closed for the
    /// health grace, counted from when the closing was seen (or from now if
    /// it is closed already). A gate whose sender goes away while closed
    /// still ends the grace; one that goes away while open never resolves.
    pub(super) fn unhealthy_past_grace(&self) -> impl Future<Output = ()> + 'static {
        let gate = self.candidacy.clone();
        let grace = self.health_grace;
        async move {
            let Some(mut g) = gate else {
                return std::future::pending().await;
            };
            loop {
                let gone = g.wait_for(|healthy| !*healthy).await.is_err();
                if gone {
                    return std::future::pending().await;
                }
                let until = Instant::now() + grace;
                tokio::select! {
                    healed = async { g.wait_for(|healthy| *healthy).await.is_ok() } => if !healed {
                        sleep_until(until).await;
                        return;
                    },
                    _ = sleep_until(until) => return,
                }
            }
        }
    }

    /// Point 3: how long to keep the lease without claiming after shutdown
    /// arrives while leading; `None` resigns at once.
    pub(super) fn drain(&self) -> Option<Duration> {
        self.drain_timeout.filter(|d| !d.is_zero())
    }

    /// Whether the drain waits for the supervised command (run mode) rather
    /// than for `POST /release`; only changes the log line.
    pub(super) fn waits_for_command(&self) -> bool {
        self.release_wait.is_some()
    }

    /// The health grace, for the log line of an unhealthy step-down.
    pub(super) fn health_grace(&self) -> Duration {
        self.health_grace
    }

    /// Point 4: after stepping down for `why` (no longer claiming), wait for
    /// the app's release (run mode: the command is gone; at most the release
    /// wait, never past `valid_until`) and for the participants to let go of
    /// the term with `token` (at most [`PARTICIPANT_WAIT`], never past
    /// `valid_until`). Resign requests meanwhile answer `false`.
    pub(super) async fn before_release(
        &self,
        commands: &mut mpsc::Receiver<Command>,
        token: u64,
        valid_until: Instant,
        why: &StepDown,
    ) {
        if let Some(wait) = self.release_wait
            && !matches!(why, StepDown::Shutdown | StepDown::Deadline)
        {
            let until = (Instant::now() + wait).min(valid_until);
            loop {
                tokio::select! {
                    _ = sleep_until(until) => break,
                    cmd = commands.recv() => match cmd {
                        Some(Command::Release) | None => break,
                        Some(Command::Resign { reply, .. }) => { let _ = reply.send(false); }
                    },
                }
            }
        }
        if matches!(why, StepDown::Deadline) {
            return;
        }
        let until = (Instant::now() + PARTICIPANT_WAIT).min(valid_until);
        for p in &self.participants {
            let mut p = p.clone();
            if tokio::time::timeout_at(until, p.wait_for(|v| *v != Some(token)))
                .await
                .is_err()
            {
                warn!(
                    fencing_token = token,
                    "a participant (the Pod labeler) did not let go in time; releasing anyway"
                );
            }
        }
    }
}
