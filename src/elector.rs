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
//! backends are called one verb at a time, each under a deadline shorter than
//! the renew interval.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backend::{BackendError, Campaign, Holder, LeaseBackend, Renewal, Term};
use crate::metrics::Metrics;

/// Timing and identity of one candidate. Durations are validated by
/// [`crate::config`]; see [`ElectorConfig::validate`].
#[derive(Clone, Debug)]
pub struct ElectorConfig {
    /// Election name (the key suffix).
    pub election: String,
    /// This candidate's holder identity.
    pub identity: String,
    /// Requested lease TTL. The backend may grant more (etcd: whole seconds, at least its minimum).
    pub lease_duration: Duration,
    /// How often the leader renews (client-go's retry of the renew loop; default TTL/3).
    pub renew_interval: Duration,
    /// Upper bound of the backoff between failed attempts, and of a follower's
    /// wait when the backend cannot notify it.
    pub retry_period: Duration,
    /// Fixed drift margin; `None` means max(1% of TTL, 2 × renew round trip, 50 ms).
    pub drift_margin: Option<Duration>,
    /// On shutdown, keep the lease (while no longer claiming) until
    /// [`ElectorHandle::release`] is called or this much time passes; `None`
    /// resigns at once.
    pub drain_timeout: Option<Duration>,
    /// How long the candidacy gate (see [`Elector::with_candidacy`]) may stay
    /// closed while leading before this candidate resigns.
    pub health_grace: Duration,
    /// After a step-down other than shutdown or the validity deadline, wait up
    /// to this long (and never past `valid_until`) for
    /// [`ElectorHandle::release`] before releasing the key, so a supervised
    /// child is gone first (run mode). `None` releases at once.
    pub release_wait: Option<Duration>,
}

impl ElectorConfig {
    /// A configuration with the defaults of the CLI: renew every TTL/3,
    /// retry period 2 s, automatic drift margin, no drain, health grace = TTL,
    /// release at once.
    pub fn new(
        election: impl Into<String>,
        identity: impl Into<String>,
        lease_duration: Duration,
    ) -> Self {
        ElectorConfig {
            election: election.into(),
            identity: identity.into(),
            lease_duration,
            renew_interval: lease_duration / 3,
            retry_period: Duration::from_secs(2),
            drift_margin: None,
            drain_timeout: None,
            health_grace: lease_duration,
            release_wait: None,
        }
    }

    /// Deadline of every backend call: two thirds of the renew interval, so a
    /// hung call cannot delay the next renewal past its slot.
    pub fn call_timeout(&self) -> Duration {
        self.renew_interval * 2 / 3
    }

    /// Check the timing rules (client-go: RenewDeadline < LeaseDuration).
    ///
    /// # Errors
    /// A message naming the flags involved and their values.
    pub fn validate(&self) -> Result<(), String> {
        if self.election.is_empty() {
            return Err("--election must not be empty".into());
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_duration {
            return Err(format!(
                "--renew-interval ({}) must be shorter than --lease-duration ({})\nhint: the default is a third of the lease duration",
                humantime::format_duration(self.renew_interval),
                humantime::format_duration(self.lease_duration)
            ));
        }
        if let Some(m) = self.drift_margin
            && m + self.renew_interval >= self.lease_duration
        {
            return Err(format!(
                "--drift-margin ({}) plus --renew-interval ({}) must be shorter than --lease-duration ({})",
                humantime::format_duration(m),
                humantime::format_duration(self.renew_interval),
                humantime::format_duration(self.lease_duration)
            ));
        }
        Ok(())
    }

    /// How long a follower may keep naming the leader after the send instant
    /// of the last backend answer that showed it: one lease duration plus one
    /// call timeout. A follower checks at least that often while all is well
    /// (etcd: a read every renew interval; Redis: a campaign when the key's
    /// `PTTL` runs out), so only a silent backend lets the bound pass.
    pub fn silence_bound(&self) -> Duration {
        self.lease_duration + self.call_timeout()
    }

    fn margin(&self, ttl: Duration, rtt: Duration) -> Duration {
        self.drift_margin
            .unwrap_or_else(|| (ttl / 100).max(rtt * 2).max(Duration::from_millis(50)))
    }
}

/// This candidate's own term, present only while it holds the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnTerm {
    /// The instant (monotonic) after which this candidate must not claim to lead.
    pub valid_until: Instant,
    /// The term's fencing token.
    pub fencing_token: u64,
}

/// What one candidate knows about its election. Published by the Elector on a
/// `tokio::sync::watch` channel; readers call [`LeaderState::is_leader`] with
/// the current instant each time they answer.
#[derive(Clone, Debug)]
pub struct LeaderState {
    /// Election name.
    pub election: String,
    /// This candidate's identity.
    pub identity: String,
    /// Backend name (`etcd`, `redis`, `memory`).
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
    /// The last backend error, as one line with its hint; `None` when healthy.
    pub error: Option<String>,
    /// The candidate has reached the backend and knows the leader (or that there is none).
    pub ready: bool,
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
}

impl LeaderState {
    fn new(cfg: &ElectorConfig, backend: &'static str) -> Self {
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
            ready: false,
            stopping: false,
            transitions: 0,
            servers: None,
            heard_until: None,
        }
    }

    /// Whether this candidate leads at `now`: it holds a term whose
    /// `valid_until` lies after `now`, and shutdown has not started.
    pub fn is_leader(&self, now: Instant) -> bool {
        !self.stopping && self.own_term.is_some_and(|t| now < t.valid_until)
    }

    /// How long this candidate may still claim to lead at `now` (zero when it does not lead).
    pub fn valid_for(&self, now: Instant) -> Duration {
        match self.own_term {
            Some(t) if !self.stopping => t.valid_until.saturating_duration_since(now),
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

/// A leadership transition, as sent to [`Elector::events`] subscribers (the
/// `--notify-url` notifier), in the order they happened.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Event {
    /// `became_leader`, `stopped_leading` or `leader_changed`.
    pub event: &'static str,
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

/// Requests to a running Elector (from the control listener or the run-mode supervisor).
#[derive(Debug)]
enum Command {
    Resign {
        cooldown: Duration,
        reply: oneshot::Sender<bool>,
    },
    Release,
}

/// A cheap handle to ask a running [`Elector`] to resign or to finish draining.
#[derive(Clone, Debug)]
pub struct ElectorHandle {
    tx: mpsc::Sender<Command>,
}

impl ElectorHandle {
    /// Give up leadership now (stop claiming, release the key) and stay out
    /// of campaigns for `cooldown`. Returns whether this candidate was leading;
    /// `false` also when the Elector has stopped.
    pub async fn resign(&self, cooldown: Duration) -> bool {
        let (reply, rx) = oneshot::channel();
        if self
            .tx
            .send(Command::Resign { cooldown, reply })
            .await
            .is_err()
        {
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

/// Longest wait for participants (see [`Elector::add_participant`]) to let go
/// of a term before its key is released anyway.
pub const PARTICIPANT_WAIT: Duration = Duration::from_secs(2);

/// Capped, jittered exponential backoff (full jitter between half and all of the step).
#[derive(Debug)]
struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }
    fn next(&mut self) -> Duration {
        let step = self
            .base
            .saturating_mul(1u32 << self.attempt.min(16))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        step.mul_f64(rand::rng().random_range(0.5..=1.0))
    }
    fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// How a term ended, for logs.
#[derive(Debug)]
enum StepDown {
    Shutdown,
    Deadline,
    Lost(&'static str),
    Resigned,
    Unhealthy,
}

/// Runs the campaign of one candidate. Create with [`Elector::new`], then
/// drive [`Elector::run`] on a task; read the state from the receiver.
pub struct Elector {
    cfg: ElectorConfig,
    backend: Arc<dyn LeaseBackend>,
    state: watch::Sender<LeaderState>,
    metrics: Option<Arc<Metrics>>,
    backoff: Backoff,
    /// A term we stopped claiming but could not resign; resigned before the next campaign.
    abandoned: Option<Term>,
    /// The holder we saw last, so the backend can wait for its term to end.
    last_seen: Option<Holder>,
    commands_tx: mpsc::Sender<Command>,
    commands: mpsc::Receiver<Command>,
    events: broadcast::Sender<Event>,
    /// Campaign only while this is `true` (health-gated candidacy).
    candidacy: Option<watch::Receiver<bool>>,
    /// No campaign before this instant (after a resign).
    cooldown_until: Option<Instant>,
    /// Readers that act for a term (the Pod labeler): each shows the fencing
    /// token it still acts for; the key is released after they let go.
    participants: Vec<watch::Receiver<Option<u64>>>,
    /// The term last shown alive by a backend answer (fencing token), and the
    /// send instant of that answer: the start of the next failover.
    term_seen: Option<(u64, Instant)>,
}

impl Elector {
    /// A new Elector and the receiver of its state.
    pub fn new(
        cfg: ElectorConfig,
        backend: Arc<dyn LeaseBackend>,
        metrics: Option<Arc<Metrics>>,
    ) -> (Self, watch::Receiver<LeaderState>) {
        let (state, rx) = watch::channel(LeaderState::new(&cfg, backend.name()));
        let backoff = Backoff::new(Duration::from_millis(100), cfg.retry_period);
        let (commands_tx, commands) = mpsc::channel(8);
        let (events, _) = broadcast::channel(64);
        (
            Elector {
                cfg,
                backend,
                state,
                metrics,
                backoff,
                abandoned: None,
                last_seen: None,
                commands_tx,
                commands,
                events,
                candidacy: None,
                cooldown_until: None,
                participants: Vec::new(),
                term_seen: None,
            },
            rx,
        )
    }

    /// A handle to resign or release while [`Elector::run`] runs.
    pub fn handle(&self) -> ElectorHandle {
        ElectorHandle {
            tx: self.commands_tx.clone(),
        }
    }

    /// Transitions in order (a slow subscriber that falls more than 64 behind
    /// loses the oldest ones; see `tokio::sync::broadcast`).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Campaign only while `gate` holds `true`; a leader whose gate stays
    /// `false` for [`ElectorConfig::health_grace`] resigns.
    pub fn with_candidacy(mut self, gate: watch::Receiver<bool>) -> Self {
        self.candidacy = Some(gate);
        self
    }

    /// Register a reader that acts for our terms (e.g. labels our Pod as the
    /// leader). It sends `Some(fencing_token)` while acting for a term and
    /// `None` when done; after a step-down the Elector waits for `None` (at
    /// most [`PARTICIPANT_WAIT`], never past `valid_until`) before releasing the
    /// key.
    pub fn add_participant(&mut self) -> watch::Sender<Option<u64>> {
        let (tx, rx) = watch::channel(None);
        self.participants.push(rx);
        tx
    }

    fn may_campaign(&self) -> bool {
        let cooled = self.cooldown_until.is_none_or(|t| Instant::now() >= t);
        let healthy = self.candidacy.as_ref().is_none_or(|g| *g.borrow());
        cooled && healthy
    }

    /// Answer a command received while not leading.
    fn handle_idle_command(&mut self, cmd: Option<Command>) {
        match cmd {
            Some(Command::Resign { cooldown, reply }) => {
                self.cooldown_until = Some(Instant::now() + cooldown);
                let _ = reply.send(false);
            }
            Some(Command::Release) | None => {}
        }
    }

    /// Stay out of campaigns, serving commands and following the current
    /// holder read-only, until the cooldown ends and the candidacy gate opens.
    /// Returns `false` on shutdown.
    async fn wait_until_eligible(&mut self, shutdown: &CancellationToken) -> bool {
        let backend = self.backend.clone();
        while !self.may_campaign() {
            let until = self.cooldown_until.unwrap_or_else(Instant::now);
            let mut gate = self.candidacy.clone();
            // Who leads meanwhile? Read it, then watch it (and read again
            // every renew interval, so a silent backend is noticed).
            let sent = Instant::now();
            let seen = match self.call("read", backend.read()).await {
                Ok(h) => {
                    self.backend_ok();
                    self.heard(h.as_ref().map(|h| h.fencing_token), sent);
                    self.observe(h.as_ref());
                    h
                }
                Err(e) => {
                    self.backend_failed(&e);
                    None
                }
            };
            let watch = async {
                match &seen {
                    Some(h) => {
                        let _ = backend.watch(h).await;
                    }
                    // Nobody leads (yet: right after our resign a follower
                    // is about to take over), or the backend failed: look
                    // again shortly.
                    None => sleep(self.cfg.retry_period.min(Duration::from_millis(200))).await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                cmd = self.commands.recv() => self.handle_idle_command(cmd),
                _ = sleep_until(until), if Instant::now() < until => {}
                _ = watch => {}
                _ = sleep(self.cfg.renew_interval) => {}
                _ = async { gate.as_mut().expect("guarded").changed().await }, if gate.is_some() => {
                    if gate.as_ref().is_some_and(|g| g.has_changed().is_err()) {
                        // The health checker is gone: stop gating rather than never campaign.
                        self.candidacy = None;
                    }
                }
            }
        }
        true
    }

    /// Campaign until `shutdown` is cancelled; on shutdown stop claiming at
    /// once, resign a held term (bounded by the call timeout) and return.
    /// Backend faults never end this loop.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let backend = self.backend.clone();
        while !shutdown.is_cancelled() {
            if !self.may_campaign() {
                if !self.wait_until_eligible(&shutdown).await {
                    break;
                }
                continue;
            }
            if let Some(term) = self.abandoned.take()
                && let Err(e) = self.call("resign", backend.resign(&term)).await
            {
                debug!(error = %e.report(), "could not resign an abandoned term yet");
                self.abandoned = Some(term);
            }
            if let Some(m) = &self.metrics {
                m.acquire_attempts.inc();
            }
            let sent = Instant::now();
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = self.call("campaign", backend.campaign(&self.cfg.identity, self.cfg.lease_duration, self.last_seen.as_ref())) => r,
            };
            match attempt {
                Ok(Campaign::Elected(term)) => {
                    self.backend_ok();
                    self.heard(Some(term.holder.fencing_token), sent);
                    self.lead(term, sent, &shutdown).await;
                }
                Ok(Campaign::Following(holder))
                    if self
                        .abandoned
                        .as_ref()
                        .is_some_and(|t| t.holder.term_id == holder.term_id) =>
                {
                    // Our own abandoned term still holds the key (its release
                    // failed, e.g. while the backend was starting): end it
                    // rather than follow our own dead term until it expires.
                    self.backend_ok();
                    self.observe(None);
                    let term = self.abandoned.take().expect("matched above");
                    match self.call("resign", backend.resign(&term)).await {
                        Ok(()) => {
                            info!(election = %self.cfg.election, fencing_token = term.holder.fencing_token, "released our own abandoned term; campaigning again");
                            self.last_seen = None;
                        }
                        Err(e) => {
                            self.backend_failed(&e);
                            self.abandoned = Some(term);
                            let wait = self.backoff.next();
                            tokio::select! {
                                _ = shutdown.cancelled() => break,
                                _ = sleep(wait) => {}
                            }
                        }
                    }
                }
                Ok(Campaign::Following(holder)) => {
                    self.backend_ok();
                    self.heard(Some(holder.fencing_token), sent);
                    self.observe(Some(&holder));
                    self.last_seen = Some(holder.clone());
                    self.follow(&holder, &shutdown).await;
                }
                Ok(Campaign::Waiting {
                    previous,
                    retry_after,
                }) => {
                    self.backend_ok();
                    self.heard(None, sent);
                    self.observe(None);
                    debug!(previous = %previous.identity, ?retry_after, "key is free but the previous term is still alive");
                    if !previous.term_id.is_empty() {
                        self.last_seen = Some(previous);
                    }
                    let wait =
                        retry_after.min(self.cfg.retry_period) + jitter(Duration::from_millis(20));
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = sleep(wait) => {}
                    }
                }
                Err(e) => {
                    if let Some(m) = &self.metrics {
                        m.acquire_failures.with_label_values(&[e.reason()]).inc();
                    }
                    self.backend_failed(&e);
                    let wait = self.backoff.next();
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = sleep(wait) => {}
                    }
                }
            }
        }
        self.state.send_modify(|s| {
            s.stopping = true;
            s.ready = false;
        });
        if let Some(term) = self.abandoned.take() {
            let _ = self.call("resign", backend.resign(&term)).await;
        }
    }

    /// Follow `holder` until its key changes, the backend's hint of its expiry
    /// passes, shutdown, or the watch fails.
    async fn follow(&mut self, holder: &Holder, shutdown: &CancellationToken) {
        let backend = self.backend.clone();
        // A backend without a watch (Redis) tells when the key expires: wake
        // right then (crash failover ≈ TTL, about one command per follower
        // per TTL); its release notice covers graceful handovers. An expiry
        // hint longer than two TTLs (a key without TTL) is capped by the
        // retry period.
        let recheck = holder.expires_in.map(|d| {
            let d = if d > self.cfg.lease_duration * 2 {
                self.cfg.retry_period
            } else {
                d
            };
            d + jitter(Duration::from_millis(20))
        });
        let watch = backend.watch(holder);
        tokio::pin!(watch);
        let mut gate = self.candidacy.clone();
        // A backend with a watch (etcd) is silent while nothing changes, and
        // a frozen server or a member without quorum stays silent too: read
        // the key every renew interval (a linearizable read needs the quorum),
        // so silence is noticed within one renew interval plus a call timeout.
        let mut next_check = recheck
            .is_none()
            .then(|| Instant::now() + self.cfg.renew_interval);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sleep_until(next_check.unwrap_or_else(Instant::now)), if next_check.is_some() => {
                    let sent = Instant::now();
                    match self.call("read", backend.read()).await {
                        Ok(Some(h)) if h.term_id == holder.term_id => {
                            self.backend_ok();
                            self.heard(Some(h.fencing_token), sent);
                            next_check = Some(sent + self.cfg.renew_interval);
                        }
                        // The key changed and the watch did not say so: campaign.
                        Ok(_) => return,
                        Err(e) => {
                            self.backend_failed(&e);
                            return;
                        }
                    }
                }
                cmd = self.commands.recv() => {
                    self.handle_idle_command(cmd);
                    continue;
                }
                // A candidate whose app turns unhealthy stops following (and
                // campaigning) until it is healthy again.
                r = async { gate.as_mut().expect("guarded").changed().await }, if gate.is_some() => {
                    if r.is_err() || !*gate.as_ref().expect("guarded").borrow() { return; }
                    continue;
                }
                r = &mut watch => { self.after_watch(r, shutdown).await; return; }
                _ = sleep(recheck.unwrap_or(Duration::MAX)), if recheck.is_some() => return,
            }
        }
    }

    async fn after_watch(&mut self, r: Result<(), BackendError>, shutdown: &CancellationToken) {
        match r {
            Ok(()) => debug!("the key changed; campaigning"),
            Err(e) => {
                self.backend_failed(&e);
                let wait = self.backoff.next();
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = sleep(wait) => {}
                }
            }
        }
    }

    /// Hold `term` (acquired by a request sent at `sent`) until it is lost,
    /// its deadline passes, or shutdown; then stop claiming and resign.
    async fn lead(&mut self, term: Term, sent: Instant, shutdown: &CancellationToken) {
        let backend = self.backend.clone();
        let now = Instant::now();
        let ttl = term.ttl;
        let asked = self.cfg.lease_duration;
        if ttl > asked && self.state.borrow().lease_duration == asked {
            // First grant that differs (etcd: at least 2 s, whole seconds).
            warn!(
                election = %self.cfg.election,
                asked = %humantime::format_duration(asked),
                granted = %humantime::format_duration(ttl),
                "the backend granted a longer lease than --lease-duration; failover takes up to the granted TTL"
            );
        }
        let mut valid_until = sent + ttl.saturating_sub(self.cfg.margin(ttl, now - sent));
        self.state.send_modify(|s| {
            s.lease_duration = ttl;
            s.servers = term.servers;
        });
        self.set_own_term(&term, valid_until);
        self.last_seen = Some(term.holder.clone());

        let mut watch = Some(Box::pin(backend.watch(&term.holder)));
        let mut next_renew = sent + self.cfg.renew_interval;
        let mut retry = Backoff::new(Duration::from_millis(50), self.cfg.renew_interval / 4);
        // Set while draining after shutdown: the lease is kept until the app
        // releases or this instant passes.
        let mut drain_until: Option<Instant> = None;
        let mut gate = self.candidacy.clone();
        let mut unhealthy_since: Option<Instant> = gate
            .as_ref()
            .filter(|g| !*g.borrow())
            .map(|_| Instant::now());
        let grace = self.cfg.health_grace;
        let why = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if drain_until.is_none() => {
                    match self.cfg.drain_timeout {
                        Some(d) if !d.is_zero() => {
                            // Stop claiming at once; keep the lease so no one
                            // else starts while the app finishes.
                            self.state.send_modify(|s| { s.stopping = true; s.ready = false; });
                            // Record the end of our claim now, not at release:
                            // long-polls return and `stopped_leading` goes out.
                            self.observe(None);
                            if self.cfg.release_wait.is_some() {
                                info!(election = %self.cfg.election, "not claiming; stopping the command before releasing the lease");
                            } else {
                                info!(election = %self.cfg.election, drain_timeout = ?d, "draining: not claiming, keeping the lease until POST /release or the drain timeout");
                            }
                            drain_until = Some(Instant::now() + d);
                        }
                        _ => break StepDown::Shutdown,
                    }
                }
                _ = sleep_until(drain_until.unwrap_or_else(Instant::now)), if drain_until.is_some() => {
                    warn!(election = %self.cfg.election, "drain timeout passed without POST /release; releasing");
                    break StepDown::Shutdown;
                }
                _ = sleep_until(valid_until) => break StepDown::Deadline,
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Resign { cooldown, reply }) => {
                        self.cooldown_until = Some(Instant::now() + cooldown);
                        let _ = reply.send(true);
                        break StepDown::Resigned;
                    }
                    Some(Command::Release) if drain_until.is_some() => break StepDown::Shutdown,
                    Some(Command::Release) | None => {}
                },
                r = async { gate.as_mut().expect("guarded").changed().await }, if gate.is_some() => {
                    match r {
                        Err(_) => gate = None,
                        Ok(()) => {
                            let healthy = *gate.as_ref().expect("guarded").borrow();
                            unhealthy_since = match (healthy, unhealthy_since) {
                                (true, _) => None,
                                (false, None) => Some(Instant::now()),
                                (false, since) => since,
                            };
                        }
                    }
                }
                _ = sleep_until(unhealthy_since.map_or_else(Instant::now, |t| t + grace)), if unhealthy_since.is_some() => {
                    break StepDown::Unhealthy;
                }
                r = async { watch.as_mut().expect("guarded by the select condition").await }, if watch.is_some() => {
                    match r {
                        Ok(()) => break StepDown::Lost("key deleted or overwritten"),
                        Err(e) => {
                            // Renewals also verify the key, so a lost watch
                            // only slows detection; it is opened again after
                            // the next successful renewal.
                            warn!(error = %e.report(), "watch on own key failed");
                            watch = None;
                        }
                    }
                }
                _ = sleep_until(next_renew) => {
                    let send = Instant::now();
                    let deadline = self.cfg.call_timeout().min(valid_until.saturating_duration_since(send));
                    if let Some(m) = &self.metrics { m.renew_attempts.inc(); }
                    let r = match timeout(deadline, backend.renew(&term)).await {
                        Ok(r) => r,
                        Err(_) => Err(BackendError::Timeout { backend: backend.name(), call: "renew", timeout_ms: deadline.as_millis() as u64 }),
                    };
                    match r {
                        Ok(Renewal::Renewed { ttl, servers }) => {
                            let rtt = send.elapsed();
                            valid_until = send + ttl.saturating_sub(self.cfg.margin(ttl, rtt));
                            next_renew = send + self.cfg.renew_interval;
                            retry.reset();
                            if let Some(m) = &self.metrics { m.renew_latency.observe(rtt.as_secs_f64()); }
                            self.backend_ok();
                            self.heard(Some(term.holder.fencing_token), send);
                            self.state.send_modify(|s| {
                                if let Some(t) = &mut s.own_term { t.valid_until = valid_until; }
                                s.lease_duration = ttl;
                                s.servers = servers;
                            });
                            if watch.is_none() {
                                watch = Some(Box::pin(backend.watch(&term.holder)));
                            }
                        }
                        Ok(Renewal::Lost(reason)) => break StepDown::Lost(reason.as_str()),
                        Err(e) => {
                            if let Some(m) = &self.metrics {
                                m.renew_failures.with_label_values(&[e.reason()]).inc();
                                m.slowpath.inc();
                            }
                            self.backend_failed(&e);
                            next_renew = Instant::now() + retry.next();
                        }
                    }
                }
            }
        };
        drop(watch);
        // Stop claiming first, then release the key. (A drain already set
        // `stopping` when it began; the transition is recorded now.)
        if matches!(why, StepDown::Shutdown) {
            self.state.send_modify(|s| {
                s.stopping = true;
                s.ready = false;
            });
        }
        self.observe(None);
        match &why {
            StepDown::Resigned => {
                info!(election = %self.cfg.election, identity = %self.cfg.identity, fencing_token = term.holder.fencing_token, "resigned on request")
            }
            StepDown::Unhealthy => {
                warn!(election = %self.cfg.election, identity = %self.cfg.identity, fencing_token = term.holder.fencing_token, grace = ?grace, "resigning: the app stayed unhealthy past the health grace")
            }
            StepDown::Shutdown => {
                info!(election = %self.cfg.election, identity = %self.cfg.identity, fencing_token = term.holder.fencing_token, "resigning for shutdown")
            }
            StepDown::Deadline => {
                warn!(election = %self.cfg.election, identity = %self.cfg.identity, fencing_token = term.holder.fencing_token, "stepped down: no renewal acknowledged before the validity deadline")
            }
            StepDown::Lost(reason) => {
                warn!(election = %self.cfg.election, identity = %self.cfg.identity, fencing_token = term.holder.fencing_token, reason, "stepped down: term lost")
            }
        }
        if let Some(wait) = self.cfg.release_wait
            && !matches!(why, StepDown::Shutdown | StepDown::Deadline)
        {
            let until = (Instant::now() + wait).min(valid_until);
            loop {
                tokio::select! {
                    _ = sleep_until(until) => break,
                    cmd = self.commands.recv() => match cmd {
                        Some(Command::Release) | None => break,
                        Some(Command::Resign { reply, .. }) => { let _ = reply.send(false); }
                    },
                }
            }
        }
        if !matches!(why, StepDown::Deadline) {
            let token = term.holder.fencing_token;
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
        if let Err(e) = self.call("resign", backend.resign(&term)).await {
            debug!(error = %e.report(), "resign failed; the lease will expire by TTL");
            if !matches!(why, StepDown::Shutdown) {
                self.abandoned = Some(term);
            }
        }
    }

    /// Run one backend call under the call timeout.
    async fn call<T>(
        &self,
        verb: &'static str,
        fut: impl std::future::Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let limit = self.cfg.call_timeout();
        match timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::Timeout {
                backend: self.backend.name(),
                call: verb,
                timeout_ms: limit.as_millis() as u64,
            }),
        }
    }

    fn backend_ok(&mut self) {
        self.backoff.reset();
        if let Some(m) = &self.metrics {
            m.backend_up.set(1);
        }
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

    fn backend_failed(&mut self, e: &BackendError) {
        if let Some(m) = &self.metrics {
            m.backend_up.set(0);
        }
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
    fn heard(&mut self, token: Option<u64>, sent: Instant) {
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
            info!(election = %self.cfg.election, previous_fencing_token = previous, fencing_token = token, failover_ms = took.as_millis() as u64, "observed a new term");
            if let Some(m) = &self.metrics {
                m.last_failover.set(took.as_secs_f64());
            }
        }
        self.term_seen = Some((token, sent));
    }

    fn set_own_term(&mut self, term: &Term, valid_until: Instant) {
        let own = OwnTerm {
            valid_until,
            fencing_token: term.holder.fencing_token,
        };
        self.publish(
            Some(term.holder.identity.clone()),
            Some(term.holder.fencing_token),
            Some(own),
        );
    }

    /// Record the holder observed as a follower (`None`: nobody holds the key).
    fn observe(&mut self, holder: Option<&Holder>) {
        self.publish(
            holder.map(|h| h.identity.clone()),
            holder.map(|h| h.fencing_token),
            None,
        );
    }

    /// The single place where a change of leader is recorded, counted and logged.
    fn publish(&mut self, leader: Option<String>, token: Option<u64>, own: Option<OwnTerm>) {
        let metrics = self.metrics.clone();
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
            if let Some(m) = &metrics {
                m.transitions.inc();
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

fn jitter(max: Duration) -> Duration {
    max.mul_f64(rand::rng().random_range(0.0..=1.0))
}

#[cfg(test)]
#[path = "elector_tests.rs"]
mod tests;
