//! Unit tests of the Elector on a paused tokio clock against the in-memory
//! backend: no real sleeps, exact timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::{Instant, advance};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::backend::{BackendError, Campaign, Holder, LeaseBackend, Renewal, Term, WaitReason};

/// One candidate's view of the shared memory backend, with its own fault switch
/// (its network link).
struct Link {
    inner: MemoryBackend,
    cut: AtomicBool,
    /// A frozen server (SIGSTOP) or a member without quorum: calls never answer.
    frozen: AtomicBool,
    /// Fail this many resigns (a release sent while the backend is starting).
    fail_resigns: AtomicUsize,
    /// Answer every call "throttled, retry after [`RETRY_AFTER`]" (a 429).
    throttled: AtomicBool,
    /// Calls answered so far while throttled.
    throttled_calls: AtomicUsize,
    /// Reads sent so far.
    reads: AtomicUsize,
    /// What `heard_at` answers (a watch that delivers renewals).
    heard: std::sync::Mutex<Option<Instant>>,
    /// Tell no expiry (as etcd and a Lease): followers then check the term.
    no_expiry: AtomicBool,
}

/// The `Retry-After` of a throttled [`Link`].
const RETRY_AFTER: Duration = Duration::from_millis(400);

impl Link {
    fn new(inner: &MemoryBackend) -> Arc<Link> {
        Arc::new(Link {
            inner: inner.clone(),
            cut: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            fail_resigns: AtomicUsize::new(0),
            throttled: AtomicBool::new(false),
            throttled_calls: AtomicUsize::new(0),
            reads: AtomicUsize::new(0),
            heard: std::sync::Mutex::new(None),
            no_expiry: AtomicBool::new(false),
        })
    }

    /// `h` with its expiry hint, unless told to hide it.
    fn hint(&self, mut h: Holder) -> Holder {
        if self.no_expiry.load(Ordering::SeqCst) {
            h.expires_in = None;
        }
        h
    }

    /// Pend while frozen.
    async fn thaw(&self) {
        while self.frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn check(&self) -> Result<(), BackendError> {
        if self.throttled.load(Ordering::SeqCst) {
            self.throttled_calls.fetch_add(1, Ordering::SeqCst);
            return Err(BackendError::Throttled {
                backend: crate::backend::memory::ABOUT,
                retry_after: RETRY_AFTER,
                source: "429 from the test".into(),
            });
        }
        if self.cut.load(Ordering::SeqCst) {
            Err(BackendError::Unreachable {
                backend: crate::backend::memory::ABOUT,
                endpoints: "memory".into(),
                source: "link cut by the test".into(),
            })
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl LeaseBackend for Link {
    fn about(&self) -> &'static crate::backend::About {
        crate::backend::memory::ABOUT
    }
    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign, BackendError> {
        self.thaw().await;
        self.check()?;
        match self.inner.campaign(identity, ttl, previous).await? {
            Campaign::Following(h) => Ok(Campaign::Following(self.hint(h))),
            c => Ok(c),
        }
    }
    async fn renew(&self, term: &Term) -> Result<Renewal, BackendError> {
        self.thaw().await;
        self.check()?;
        self.inner.renew(term).await
    }
    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<(), BackendError> {
        self.thaw().await;
        self.check()?;
        if self
            .fail_resigns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(BackendError::Unreachable {
                backend: crate::backend::memory::ABOUT,
                endpoints: "memory".into(),
                source: "release refused by the test".into(),
            });
        }
        self.inner.release(term, successor).await
    }
    async fn read(&self) -> Result<Option<Holder>, BackendError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.thaw().await;
        self.check()?;
        Ok(self.inner.read().await?.map(|h| self.hint(h)))
    }
    fn heard_at(&self, _: &Holder) -> Option<Instant> {
        *self.heard.lock().unwrap()
    }
    async fn watch(&self, seen: &Holder) -> Result<(), BackendError> {
        self.thaw().await;
        self.check()?;
        // A cut link breaks the watch too: poll the switch while waiting. A
        // frozen one stays silent: no event, no error.
        tokio::select! {
            r = async { let r = self.inner.watch(seen).await; self.thaw().await; r } => r,
            _ = async { while !self.cut.load(Ordering::SeqCst) { tokio::time::sleep(Duration::from_millis(10)).await } } => self.check(),
        }
    }
}

struct Candidate {
    link: Arc<Link>,
    rx: watch::Receiver<LeaderState>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

const TTL: Duration = Duration::from_secs(3);

fn cfg(identity: &str) -> ElectorConfig {
    ElectorConfig {
        renew_interval: Duration::from_secs(1),
        retry_period: Duration::from_millis(500),
        health_grace: Duration::from_secs(1),
        ..ElectorConfig::new("e", identity, TTL)
    }
}

fn start(backend: &MemoryBackend, identity: &str) -> Candidate {
    let link = Link::new(backend);
    let (elector, rx) = Elector::new(cfg(identity), link.clone(), None);
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    Candidate {
        link,
        rx,
        stop,
        task,
    }
}

fn leaders(cs: &[Candidate]) -> Vec<String> {
    let now = Instant::now();
    cs.iter()
        .filter(|c| c.rx.borrow().is_leader(now))
        .map(|c| c.rx.borrow().identity.clone())
        .collect()
}

/// Advance the paused clock in small steps, checking at every step that at
/// most one candidate claims to lead.
async fn run_for(cs: &[Candidate], d: Duration) {
    let step = Duration::from_millis(5);
    let end = Instant::now() + d;
    while Instant::now() < end {
        advance(step).await;
        tokio::task::yield_now().await;
        let l = leaders(cs);
        assert!(l.len() <= 1, "two candidates claim to lead: {l:?}");
    }
}

fn leader_of(cs: &[Candidate]) -> usize {
    let now = Instant::now();
    let l: Vec<usize> = (0..cs.len())
        .filter(|i| cs[*i].rx.borrow().is_leader(now))
        .collect();
    assert_eq!(l.len(), 1, "expected exactly one leader");
    l[0]
}

#[tokio::test(start_paused = true)]
async fn three_candidates_elect_exactly_one_and_agree() {
    let b = MemoryBackend::new();
    let cs: Vec<_> = ["a", "b", "c"].iter().map(|id| start(&b, id)).collect();
    run_for(&cs, Duration::from_secs(10)).await;
    let l = leader_of(&cs);
    let name = cs[l].rx.borrow().identity.clone();
    for c in &cs {
        let s = c.rx.borrow();
        assert_eq!(s.leader.as_deref(), Some(name.as_str()));
        assert!(s.is_ready() && s.backend_healthy);
        assert_eq!(s.fencing_token, cs[l].rx.borrow().fencing_token);
    }
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_hands_over_at_once_with_a_larger_token() {
    let b = MemoryBackend::new();
    let cs: Vec<_> = ["a", "b", "c"].iter().map(|id| start(&b, id)).collect();
    run_for(&cs, Duration::from_secs(1)).await;
    let old = leader_of(&cs);
    let old_token = cs[old].rx.borrow().fencing_token.unwrap();
    cs[old].stop.cancel();
    // The old leader stops claiming before anything else happens.
    tokio::task::yield_now().await;
    assert!(!cs[old].rx.borrow().is_leader(Instant::now()));
    run_for(&cs, Duration::from_millis(50)).await;
    let new = leader_of(&cs);
    assert_ne!(new, old);
    assert!(cs[new].rx.borrow().fencing_token.unwrap() > old_token);
    assert!(cs[old].task.is_finished());
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_leader_steps_down_by_valid_until_and_nobody_overlaps() {
    let b = MemoryBackend::new();
    let cs: Vec<_> = ["a", "b", "c"].iter().map(|id| start(&b, id)).collect();
    run_for(&cs, Duration::from_secs(2)).await;
    let old = leader_of(&cs);
    let valid_until = cs[old].rx.borrow().own_term.unwrap().valid_until;
    assert!(valid_until <= Instant::now() + TTL);
    cs[old].link.cut.store(true, Ordering::SeqCst);
    // run_for asserts no overlap at every 5 ms step.
    run_for(&cs, TTL).await;
    assert!(!cs[old].rx.borrow().is_leader(Instant::now()));
    assert!(
        cs[old].rx.borrow().own_term.is_none(),
        "the Elector stepped down on its own clock"
    );
    assert!(!cs[old].rx.borrow().is_ready());
    run_for(&cs, TTL).await;
    let new = leader_of(&cs);
    assert_ne!(new, old);
    // The link heals: the old leader follows.
    cs[old].link.cut.store(false, Ordering::SeqCst);
    run_for(&cs, Duration::from_secs(3)).await;
    assert_eq!(leader_of(&cs), new);
    assert_eq!(
        cs[old].rx.borrow().leader,
        cs[new].rx.borrow().leader,
        "the healed candidate agrees on the leader"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_deleted_by_hand_ends_the_term_and_the_election_recovers() {
    let b = MemoryBackend::new();
    let cs: Vec<_> = ["a", "b", "c"].iter().map(|id| start(&b, id)).collect();
    run_for(&cs, Duration::from_secs(1)).await;
    let old = leader_of(&cs);
    let old_token = cs[old].rx.borrow().fencing_token.unwrap();
    b.delete_key();
    run_for(&cs, Duration::from_millis(20)).await;
    assert!(
        !cs[old].rx.borrow().is_leader(Instant::now())
            || cs[old].rx.borrow().fencing_token.unwrap() > old_token
    );
    run_for(&cs, Duration::from_secs(2)).await;
    let new = leader_of(&cs);
    assert!(cs[new].rx.borrow().fencing_token.unwrap() > old_token);
}

#[tokio::test(start_paused = true)]
async fn the_same_identity_restarted_does_not_adopt_its_previous_term() {
    let b = MemoryBackend::new();
    let first = start(&b, "pod-0");
    run_for(std::slice::from_ref(&first), Duration::from_millis(100)).await;
    assert!(first.rx.borrow().is_leader(Instant::now()));
    // The first process "dies" without resigning: its task stops renewing.
    first.task.abort();
    let second = start(&b, "pod-0");
    let mut waited = Duration::ZERO;
    while !second.rx.borrow().is_leader(Instant::now()) {
        advance(Duration::from_millis(5)).await;
        tokio::task::yield_now().await;
        waited += Duration::from_millis(5);
        assert!(waited < TTL * 2, "the restarted candidate never led");
    }
    assert!(
        waited >= TTL - Duration::from_millis(200),
        "led after {waited:?}, before the previous lease ended"
    );
}

#[tokio::test(start_paused = true)]
async fn transitions_count_leader_changes_including_to_nobody() {
    let b = MemoryBackend::new();
    let cs = vec![start(&b, "a")];
    run_for(&cs, Duration::from_millis(100)).await;
    assert_eq!(cs[0].rx.borrow().transitions, 1);
    cs[0].link.cut.store(true, Ordering::SeqCst);
    run_for(&cs, TTL).await;
    assert_eq!(cs[0].rx.borrow().transitions, 2, "stepped down to nobody");
    assert_eq!(cs[0].rx.borrow().leader, None);
}

#[tokio::test(start_paused = true)]
async fn randomized_link_faults_never_give_two_leaders() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("ELECTOR_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let b = MemoryBackend::new();
    let cs: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| start(&b, id))
        .collect();
    for _ in 0..60 {
        let i = rng.random_range(0..cs.len());
        let cut = rng.random_bool(0.5);
        cs[i].link.cut.store(cut, Ordering::SeqCst);
        run_for(&cs, Duration::from_millis(rng.random_range(10..2000))).await;
    }
    for c in &cs {
        c.link.cut.store(false, Ordering::SeqCst);
    }
    run_for(&cs, TTL * 2).await;
    leader_of(&cs);
}

#[test]
fn validation_names_both_flags() {
    let mut c = cfg("a");
    c.renew_interval = Duration::from_secs(3);
    let e = c.validate().unwrap_err();
    let cli = e.cli_message();
    assert!(
        cli.contains("--renew-interval (3s) must be shorter than --lease-duration (3s)"),
        "{cli}"
    );
    assert_eq!(
        String::from(e.clone()),
        cli,
        "the command line gets its flags"
    );
    assert_eq!(
        e.to_string(),
        "renew_interval (3s) must be shorter than lease_duration (3s)"
    );
    assert_eq!(e.field(), "renew_interval");
}

#[test]
fn the_builder_fills_in_the_sidecars_defaults_and_names_the_field_at_fault() {
    let b: Arc<dyn LeaseBackend> = Arc::new(MemoryBackend::new());
    let cfg = Elector::builder(b.clone())
        .election("e")
        .lease_duration(Duration::from_secs(9))
        .config();
    assert_eq!(cfg.renew_interval, Duration::from_secs(3));
    assert_eq!(cfg.health_grace, Duration::from_secs(9));
    assert_eq!(cfg.retry_period, Duration::from_secs(2));
    let e = Elector::builder(b.clone())
        .identity("me")
        .build()
        .unwrap_err();
    assert_eq!(e, ElectorConfigError::EmptyElection);
    let e = Elector::builder(b.clone())
        .election("e")
        .identity("me")
        .lease_duration(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(2))
        .drift_margin(Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert_eq!(e.field(), "drift_margin");
    assert!(
        e.to_string()
            .contains("drift_margin (1s) plus renew_interval (2s)"),
        "{e}"
    );
    let (_elector, rx) = Elector::builder(b)
        .election("e")
        .identity("me")
        .build()
        .unwrap();
    assert_eq!(rx.borrow().lease_duration, DEFAULT_LEASE_DURATION);
    assert!(!rx.borrow().is_ready());
}

#[test]
fn margin_is_the_largest_of_one_percent_two_rtts_and_50ms() {
    let c = cfg("a");
    assert_eq!(
        c.margin(Duration::from_secs(15), Duration::from_millis(1)),
        Duration::from_millis(150)
    );
    assert_eq!(
        c.margin(Duration::from_secs(2), Duration::from_millis(1)),
        Duration::from_millis(50)
    );
    assert_eq!(
        c.margin(Duration::from_secs(2), Duration::from_millis(40)),
        Duration::from_millis(80)
    );
}

fn start_with(
    backend: &MemoryBackend,
    cfg: ElectorConfig,
    gate: Option<watch::Receiver<bool>>,
) -> (
    Candidate,
    ElectorHandle,
    tokio::sync::broadcast::Receiver<Event>,
) {
    let link = Link::new(backend);
    let (mut elector, rx) = Elector::new(cfg, link.clone(), None);
    if let Some(g) = gate {
        elector = elector.with_candidacy(g);
    }
    let handle = elector.handle();
    let events = elector.events();
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    (
        Candidate {
            link,
            rx,
            stop,
            task,
        },
        handle,
        events,
    )
}

#[tokio::test(start_paused = true)]
async fn resign_hands_over_and_keeps_out_for_the_cooldown() {
    let b = MemoryBackend::new();
    let (a, handle, _) = start_with(&b, cfg("a"), None);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    assert!(a.rx.borrow().is_leader(Instant::now()));
    let other = start(&b, "b");
    let cs = vec![a, other];
    run_for(&cs, Duration::from_millis(50)).await;
    assert!(handle.resign(Duration::from_secs(10)).await, "was leading");
    run_for(&cs, Duration::from_millis(50)).await;
    assert_eq!(leader_of(&cs), 1, "b took over at once");
    // b stops: the key is free, but a stays out until its cooldown ends.
    cs[1].stop.cancel();
    run_for(&cs, Duration::from_secs(5)).await;
    assert!(
        !cs[0].rx.borrow().is_leader(Instant::now()),
        "a campaigned during its cooldown"
    );
    run_for(&cs, Duration::from_secs(6)).await;
    assert!(
        cs[0].rx.borrow().is_leader(Instant::now()),
        "a campaigns again after the cooldown"
    );
}

#[tokio::test(start_paused = true)]
async fn drain_keeps_the_lease_until_release_without_claiming() {
    let b = MemoryBackend::new();
    let mut c = cfg("a");
    c.drain_timeout = Some(Duration::from_secs(30));
    let (a, handle, _) = start_with(&b, c, None);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    let cs = vec![a, start(&b, "b")];
    run_for(&cs, Duration::from_millis(50)).await;
    cs[0].stop.cancel();
    run_for(&cs, Duration::from_millis(10)).await;
    assert!(
        !cs[0].rx.borrow().is_leader(Instant::now()),
        "stops claiming at once"
    );
    run_for(&cs, Duration::from_secs(10)).await;
    assert!(
        !cs[1].rx.borrow().is_leader(Instant::now()),
        "b must not lead while a drains"
    );
    assert_eq!(b.holder().unwrap().identity, "a", "the lease is kept alive");
    handle.release().await;
    run_for(&cs, Duration::from_millis(50)).await;
    assert!(
        cs[1].rx.borrow().is_leader(Instant::now()),
        "b leads right after the release"
    );
    assert!(cs[0].task.is_finished());
}

#[tokio::test(start_paused = true)]
async fn drain_ends_by_its_timeout_when_the_app_never_releases() {
    let b = MemoryBackend::new();
    let mut c = cfg("a");
    c.drain_timeout = Some(Duration::from_secs(4));
    let (a, _handle, _) = start_with(&b, c, None);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    let cs = vec![a, start(&b, "b")];
    run_for(&cs, Duration::from_millis(50)).await;
    cs[0].stop.cancel();
    run_for(&cs, Duration::from_millis(3900)).await;
    assert!(!cs[1].rx.borrow().is_leader(Instant::now()));
    run_for(&cs, Duration::from_millis(200)).await;
    assert!(cs[1].rx.borrow().is_leader(Instant::now()));
}

/// The log lines of a test, written by a subscriber set for its thread
/// (a paused-clock test runs every task on it).
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Capture what this thread logs until the guard drops.
    fn start() -> (Captured, tracing::subscriber::DefaultGuard) {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn lines(&self) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines().map(str::to_owned).collect()
    }
}

/// A closed health gate is what `/leader`'s `waiting` names (it named
/// nothing), and the wait ends when the gate opens. Its log line names no
/// `until` (it ends when the app answers, not at a time; it printed one
/// renew interval from then).
#[tokio::test(start_paused = true)]
async fn a_closed_health_gate_is_shown_as_the_wait() {
    let (logs, _guard) = Captured::start();
    let b = MemoryBackend::new();
    let (gate_tx, gate) = watch::channel(false);
    let (a, _h, _) = start_with(&b, cfg("a"), Some(gate));
    run_for(std::slice::from_ref(&a), Duration::from_secs(1)).await;
    let waiting = a.rx.borrow().waiting;
    assert_eq!(
        waiting.map(|w| w.what),
        Some(WaitReason::HealthGate),
        "{waiting:?}"
    );
    let lines = logs.lines();
    let gated: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("not campaigning yet") && l.contains("health gate is closed"))
        .collect();
    assert!(!gated.is_empty(), "no wait logged: {lines:#?}");
    assert!(gated.iter().all(|l| !l.contains("until")), "{gated:#?}");
    gate_tx.send_replace(true);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    let s = a.rx.borrow().clone();
    assert!(s.is_leader(Instant::now()) && s.waiting.is_none(), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_candidate_never_leads_and_an_unhealthy_leader_resigns_after_the_grace() {
    let b = MemoryBackend::new();
    let (gate_tx, gate) = watch::channel(false);
    let (a, _h, _) = start_with(&b, cfg("a"), Some(gate));
    run_for(std::slice::from_ref(&a), Duration::from_secs(5)).await;
    assert!(
        !a.rx.borrow().is_leader(Instant::now()),
        "an unhealthy candidate led"
    );
    assert!(b.holder().is_none());
    gate_tx.send_replace(true);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    assert!(a.rx.borrow().is_leader(Instant::now()));
    let cs = vec![a, start(&b, "b")];
    run_for(&cs, Duration::from_millis(50)).await;
    gate_tx.send_replace(false);
    run_for(&cs, Duration::from_millis(900)).await;
    assert!(
        cs[0].rx.borrow().is_leader(Instant::now()),
        "resigned before the grace (1 s) passed"
    );
    run_for(&cs, Duration::from_millis(200)).await;
    assert_eq!(leader_of(&cs), 1, "b leads after a resigned");
    // A flapping health check within the grace does not resign.
    gate_tx.send_replace(true);
    cs[1].stop.cancel();
    run_for(&cs, Duration::from_secs(1)).await;
    assert_eq!(leader_of(&cs), 0);
    gate_tx.send_replace(false);
    run_for(&cs, Duration::from_millis(500)).await;
    gate_tx.send_replace(true);
    run_for(&cs, Duration::from_secs(2)).await;
    assert_eq!(leader_of(&cs), 0);
}

#[tokio::test(start_paused = true)]
async fn events_arrive_in_order() {
    let b = MemoryBackend::new();
    let (a, handle, mut events) = start_with(&b, cfg("a"), None);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    let other = start(&b, "b");
    let cs = vec![a, other];
    run_for(&cs, Duration::from_millis(50)).await;
    handle.resign(Duration::from_secs(60)).await;
    run_for(&cs, Duration::from_millis(500)).await;
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push((e.event.as_str(), e.leader.clone(), e.transitions));
    }
    assert_eq!(seen[0].0, "became_leader");
    assert_eq!(seen[1].0, "stopped_leading");
    assert_eq!(seen[2], ("leader_changed", Some("b".to_owned()), 3));
}

/// A follower whose backend goes silent (a frozen etcd, a
/// member without quorum: no answer, no error, the watch just quiet) reports
/// `error`, `backend_healthy: false` and not ready within one lease duration,
/// and stops naming the leader after [`ElectorConfig::silence_bound`]. On the
/// original code it kept vouching for the leader for as long as the silence.
#[tokio::test(start_paused = true)]
async fn a_follower_of_a_silent_backend_stops_vouching_for_the_leader() {
    let b = MemoryBackend::new();
    let cs = vec![start(&b, "a"), start(&b, "b")];
    run_for(&cs, Duration::from_millis(100)).await;
    let l = leader_of(&cs);
    let f = 1 - l;
    let leader = cs[l].rx.borrow().identity.clone();
    run_for(&cs, Duration::from_secs(5)).await;
    assert_eq!(
        cs[f].rx.borrow().leader_at(Instant::now()),
        Some(leader.as_str())
    );
    cs[f].link.frozen.store(true, Ordering::SeqCst);
    let frozen = Instant::now();
    run_for(&cs, TTL).await;
    {
        let s = cs[f].rx.borrow();
        assert!(!s.backend_healthy, "still healthy one TTL into the silence");
        assert!(!s.is_ready(), "still ready one TTL into the silence");
        assert!(s.error.is_some(), "no error one TTL into the silence");
    }
    let bound = cfg("x").silence_bound();
    run_for(
        &cs,
        (frozen + bound).saturating_duration_since(Instant::now()),
    )
    .await;
    assert_eq!(
        cs[f].rx.borrow().leader_at(Instant::now()),
        None,
        "still names the leader {bound:?} into the silence"
    );
    // The leader, whose backend answers, was never disturbed.
    assert!(cs[l].rx.borrow().is_leader(Instant::now()));
    cs[f].link.frozen.store(false, Ordering::SeqCst);
    run_for(&cs, Duration::from_secs(3)).await;
    let s = cs[f].rx.borrow();
    assert!(s.backend_healthy && s.is_ready() && s.error.is_none());
    assert_eq!(s.leader_at(Instant::now()), Some(leader.as_str()));
}

/// When releasing a term we stopped claiming fails (and so
/// does the retry before the next campaign), the candidate that then finds
/// its own old term holding the key releases it instead of following it until
/// its lease runs out. On the original code it followed itself for ~one TTL.
#[tokio::test(start_paused = true)]
async fn a_candidate_releases_its_own_abandoned_term_instead_of_following_it() {
    let b = MemoryBackend::new();
    let (a, handle, _) = start_with(&b, cfg("a"), None);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    let first = a.rx.borrow().fencing_token.expect("a leads");
    a.link.fail_resigns.store(2, Ordering::SeqCst);
    assert!(handle.resign(Duration::ZERO).await, "was leading");
    run_for(std::slice::from_ref(&a), TTL / 3).await;
    let s = a.rx.borrow();
    assert!(
        s.is_leader(Instant::now()) && s.fencing_token != Some(first),
        "a still follows its own abandoned term {first} ({:?})",
        s.fencing_token
    );
}

/// The last failover's duration is recorded, from the last
/// backend answer that showed the previous term to the observation of the next.
#[tokio::test(start_paused = true)]
async fn the_last_failover_duration_is_recorded() {
    let b = MemoryBackend::new();
    let a = start(&b, "a");
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    let metrics = crate::metrics::Metrics::new(prometheus::Registry::new(), "e", "memory").unwrap();
    let link = Link::new(&b);
    let (elector, rx) = Elector::new(cfg("b"), link.clone(), Some(metrics.clone()));
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    let f = Candidate {
        link,
        rx,
        stop,
        task,
    };
    let cs = vec![a, f];
    run_for(&cs, Duration::from_secs(2)).await;
    assert_eq!(metrics.last_failover.get(), 0.0);
    // a's link is cut: it steps down by valid_until, its lease expires, b leads.
    cs[0].link.cut.store(true, Ordering::SeqCst);
    run_for(&cs, TTL * 2).await;
    assert!(cs[1].rx.borrow().is_leader(Instant::now()));
    let took = metrics.last_failover.get();
    // From b's last answer showing a's term (a renew interval at most before
    // the lease ran out) to b's own term; the in-memory backend reports the
    // expiry at b's next read (another renew interval at most).
    assert!(
        took > 0.0 && took <= 2.0 + cfg("b").call_timeout().as_secs_f64(),
        "last failover {took} s"
    );
}

/// The moment a draining leader stops claiming, the transition is
/// recorded (long-polls on the index return) and `stopped_leading` goes out,
/// while the key is still held until the app releases.
#[tokio::test(start_paused = true)]
async fn a_drain_announces_stopped_leading_when_it_begins() {
    let b = MemoryBackend::new();
    let mut c = cfg("a");
    c.drain_timeout = Some(Duration::from_secs(30));
    let (a, handle, mut events) = start_with(&b, c, None);
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    let became = events.try_recv().unwrap();
    assert_eq!(became.event, EventKind::BecameLeader);
    assert_eq!(
        serde_json::to_value(&became).unwrap()["event"],
        "became_leader",
        "the notifier's JSON keeps the wire name"
    );
    let index = a.rx.borrow().transitions;
    a.stop.cancel();
    run_for(std::slice::from_ref(&a), Duration::from_millis(10)).await;
    assert_eq!(
        events
            .try_recv()
            .expect("no event when the drain began")
            .event
            .as_str(),
        "stopped_leading"
    );
    assert!(
        a.rx.borrow().transitions > index,
        "the long-poll index moves"
    );
    assert_eq!(b.holder().unwrap().identity, "a", "the lease is still kept");
    handle.release().await;
    run_for(std::slice::from_ref(&a), Duration::from_millis(50)).await;
    assert!(
        events.try_recv().is_err(),
        "no second stopped_leading at release"
    );
}

/// A host suspend longer than the lease: tokio's clock (CLOCK_MONOTONIC)
/// does not move while suspended, the backend's TTL does. On resume the
/// leader answers "not leader" at once, before any timer fires; a suspend
/// shorter than what is left of its validity changes nothing (the liveness
/// twin).
#[tokio::test(start_paused = true)]
async fn a_suspend_past_valid_until_answers_not_leader_at_once() {
    let b = MemoryBackend::new();
    let cs = [start(&b, "a")];
    run_for(&cs, Duration::from_secs(1)).await;
    let now = Instant::now();
    let left = cs[0].rx.borrow().valid_for(now);
    assert!(cs[0].rx.borrow().is_leader(now) && left > Duration::from_millis(500));
    // A short suspend: still leading, with less left.
    crate::elector::suspend::inject(Duration::from_millis(200));
    let s = cs[0].rx.borrow().clone();
    assert!(s.is_leader(now), "a suspend shorter than the validity left");
    assert!(s.valid_for(now) <= left - Duration::from_millis(200));
    // A suspend past valid_until: not leader, with no tokio time passing.
    crate::elector::suspend::inject(TTL);
    assert!(
        !cs[0].rx.borrow().is_leader(now),
        "the suspend counts against valid_until"
    );
    assert_eq!(cs[0].rx.borrow().valid_for(now), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_throttled_leader_retries_after_retry_after_and_keeps_its_term_inside_the_deadline() {
    let b = MemoryBackend::new();
    let cs: Vec<_> = ["a", "b"].iter().map(|id| start(&b, id)).collect();
    run_for(&cs, Duration::from_secs(2)).await;
    let old = leader_of(&cs);
    let token = cs[old].rx.borrow().fencing_token;
    // 1.6 s of 429s: shorter than the 3 s lease less one renew interval.
    cs[old].link.throttled.store(true, Ordering::SeqCst);
    run_for(&cs, Duration::from_millis(1600)).await;
    cs[old].link.throttled.store(false, Ordering::SeqCst);
    let calls = cs[old].link.throttled_calls.load(Ordering::SeqCst);
    assert!(
        calls <= 4,
        "one renewal per Retry-After (400 ms) at most: {calls} in 1.6 s"
    );
    assert!(calls >= 1, "the renewal was tried during the window");
    run_for(&cs, Duration::from_secs(2)).await;
    assert_eq!(leader_of(&cs), old, "no transition");
    assert_eq!(cs[old].rx.borrow().fencing_token, token, "the same term");
}

/// Reads of every follower in `cs` (all but `l`).
fn follower_reads(cs: &[Candidate], l: usize) -> usize {
    let others = cs.iter().enumerate().filter(|(i, _)| *i != l);
    others
        .map(|(_, c)| c.link.reads.load(Ordering::SeqCst))
        .sum()
}

#[tokio::test(start_paused = true)]
async fn followers_read_only_while_their_watch_hears_no_renewals() {
    let b = MemoryBackend::new();
    let cs: Vec<_> = ["a", "b", "c"].iter().map(|id| start(&b, id)).collect();
    for c in &cs {
        c.link.no_expiry.store(true, Ordering::SeqCst);
    }
    run_for(&cs, Duration::from_secs(5)).await;
    let l = leader_of(&cs);
    // Renewals heard on the watch every renew interval: no reads.
    let before = follower_reads(&cs, l);
    for _ in 0..10 {
        for c in &cs {
            *c.link.heard.lock().unwrap() = Some(Instant::now());
        }
        run_for(&cs, Duration::from_secs(1)).await;
    }
    assert_eq!(
        follower_reads(&cs, l),
        before,
        "followers read while hearing renewals"
    );
    let name = cs[l].rx.borrow().identity.clone();
    for c in &cs {
        assert_eq!(c.rx.borrow().leader.as_deref(), Some(name.as_str()));
    }
    // The twin: the watch falls silent, the followers read again (about
    // once per renew interval) and still name the leader.
    run_for(&cs, Duration::from_secs(5)).await;
    let reads = follower_reads(&cs, l) - before;
    assert!((6..=12).contains(&reads), "{reads} follower reads in 5 s");
    assert_eq!(leaders(&cs), vec![name]);
}
