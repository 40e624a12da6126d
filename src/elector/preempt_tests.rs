use std::sync::Mutex;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::sleep;

use super::*;
use crate::backend::candidates::Candidate;
use crate::backend::{
    About, Campaign, CandidateRegistry, Holder, LeaseBackend, Renewal, Result, Term,
};

/// A backend that only keeps a registry, changed by the test.
#[derive(Default)]
struct Registry {
    listed: Mutex<Vec<Listed>>,
    changed: Notify,
}

impl Registry {
    fn set(&self, listed: Vec<Listed>) {
        *self.listed.lock().unwrap() = listed;
        self.changed.notify_waiters();
    }
}

#[async_trait]
impl CandidateRegistry for Registry {
    async fn publish_candidate(&self, _: &Candidate, _: Duration) -> Result<()> {
        unreachable!("the registry follower never publishes")
    }
    async fn withdraw_candidate(&self, _: &str) -> Result<()> {
        unreachable!()
    }
    async fn candidates(&self) -> Result<Vec<Listed>> {
        Ok(self.listed.lock().unwrap().clone())
    }
    async fn watch_candidates(&self) -> Result<()> {
        self.changed.notified().await;
        Ok(())
    }
}

fn record(id: &str, priority: u32, revision: &str, created: u64) -> Listed {
    Listed {
        candidate: Candidate {
            identity: id.into(),
            priority,
            revision: revision.into(),
            ready: true,
            frozen_until: None,
            preempt_after: None,
        },
        age: Some(Duration::from_secs(1)),
        ttl: Duration::from_secs(180),
        created: Some(created),
        written_ago: None,
    }
}

/// The follower of leader "me" (priority 5, revision "a", preempt after 10 s).
fn follower(backend: &Arc<Registry>) -> Preempt {
    Preempt {
        known: super::super::known::shared(),
        registry: Some(backend.clone()),
        identity: "me".into(),
        standing: Standing {
            priority: 5,
            revision: "a".into(),
            preempt_after: Duration::from_secs(10),
        },
        lease_duration: Duration::from_secs(15),
        call_timeout: Duration::from_secs(3),
        observer: None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_is_followed_after_it_stayed_for_the_wait() {
    let backend = Arc::new(Registry::default());
    backend.set(vec![record("me", 5, "a", 1), record("low", 1, "a", 2)]);
    let task = tokio::spawn(follower(&backend).watch());
    sleep(Duration::from_secs(60)).await;
    assert!(!task.is_finished(), "nobody better: no handover");
    let high = record("high", 9, "a", 3);
    backend.set(vec![record("me", 5, "a", 1), high.clone()]);
    sleep(Duration::from_secs(6)).await;
    // Gone for a moment: its wait starts again when it is back.
    backend.set(vec![record("me", 5, "a", 1)]);
    sleep(Duration::from_millis(200)).await;
    backend.set(vec![record("me", 5, "a", 1), high]);
    let start = Instant::now();
    assert_eq!(task.await.unwrap(), ("high".to_owned(), "preemption"));
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(10),
        "preempt-after from its return"
    );
}

#[tokio::test(start_paused = true)]
async fn a_newer_revision_is_followed_at_once_and_an_older_never() {
    let backend = Arc::new(Registry::default());
    backend.set(vec![record("me", 5, "a", 10), record("old", 5, "z", 5)]);
    let task = tokio::spawn(follower(&backend).watch());
    sleep(Duration::from_secs(60)).await;
    assert!(!task.is_finished(), "an older revision is no reason");
    // Our own record lapses (not renewed while leading): remembered.
    let mut mine = record("me", 5, "a", 10);
    mine.age = Some(Duration::from_secs(999));
    backend.set(vec![
        mine,
        record("old", 5, "z", 5),
        record("new", 5, "b", 20),
    ]);
    let start = Instant::now();
    assert_eq!(task.await.unwrap(), ("new".to_owned(), "revision"));
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_newer_revision_of_a_lower_priority_is_no_reason() {
    let backend = Arc::new(Registry::default());
    backend.set(vec![record("me", 5, "a", 10), record("new", 1, "b", 20)]);
    let task = tokio::spawn(follower(&backend).watch());
    sleep(Duration::from_secs(120)).await;
    assert!(!task.is_finished());
    task.abort();
}

/// Priority 0 never campaigns, alone or not (safety); its liveness twin:
/// a priority-1 candidate beside it leads, and the 0 follows and names it.
#[tokio::test(start_paused = true)]
async fn priority_0_never_campaigns_and_follows_who_leads() {
    use crate::backend::memory::MemoryBackend;
    use crate::elector::{Elector, ElectorConfig};
    use tokio_util::sync::CancellationToken;
    let backend = MemoryBackend::new();
    let ttl = Duration::from_secs(3);
    let mut cfg = ElectorConfig::new("e", "zero", ttl);
    cfg.standing.priority = 0;
    let (zero, zero_rx) = Elector::connected(cfg, &backend.connected(), None);
    let stop = CancellationToken::new();
    tokio::spawn(zero.run(stop.clone()));
    sleep(Duration::from_secs(10)).await;
    assert!(!zero_rx.borrow().is_leader_now());
    assert_eq!(backend.read().await.unwrap(), None, "nobody holds the key");
    let cfg = ElectorConfig::new("e", "one", ttl);
    let (one, one_rx) = Elector::connected(cfg, &backend.connected(), None);
    tokio::spawn(one.run(stop.clone()));
    sleep(Duration::from_secs(5)).await;
    assert!(one_rx.borrow().is_leader_now());
    assert_eq!(zero_rx.borrow().leader.as_deref(), Some("one"));
    stop.cancel();
}

/// The memory backend with a fixed registry, recording whom each release
/// names.
struct Naming {
    inner: crate::backend::memory::MemoryBackend,
    listed: Vec<Listed>,
    /// What [`CandidateRegistry::candidates_now`] reads (empty: `listed`),
    /// as a backend whose `candidates` is a watched copy that trails it.
    now: Vec<Listed>,
    named: Mutex<Vec<Option<String>>>,
}

#[async_trait]
impl LeaseBackend for Naming {
    fn about(&self) -> &'static About {
        crate::backend::memory::ABOUT
    }
    async fn campaign(&self, id: &str, ttl: Duration, seen: Option<&Holder>) -> Result<Campaign> {
        self.inner.campaign(id, ttl, seen).await
    }
    async fn renew(&self, term: &Term) -> Result<Renewal> {
        self.inner.renew(term).await
    }
    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        self.named
            .lock()
            .unwrap()
            .push(successor.map(str::to_owned));
        self.inner.release(term, successor).await
    }
    async fn read(&self) -> Result<Option<Holder>> {
        self.inner.read().await
    }
    async fn watch(&self, seen: &Holder) -> Result<()> {
        self.inner.watch(seen).await
    }
}

/// `backend` as the election and its registry, nothing else.
fn connected_to(backend: &Arc<Naming>) -> crate::backend::registry::Connected {
    crate::backend::registry::Connected {
        election: backend.clone(),
        coordination: None,
        registry: Some(backend.clone()),
        controls: None,
        roster: None,
        shards: None,
    }
}

#[async_trait]
impl CandidateRegistry for Naming {
    async fn publish_candidate(&self, _: &Candidate, _: Duration) -> Result<()> {
        Ok(())
    }
    async fn withdraw_candidate(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn candidates(&self) -> Result<Vec<Listed>> {
        Ok(self.listed.clone())
    }
    async fn candidates_now(&self) -> Result<Vec<Listed>> {
        Ok(if self.now.is_empty() {
            &self.listed
        } else {
            &self.now
        }
        .clone())
    }
    async fn watch_candidates(&self) -> Result<()> {
        std::future::pending().await
    }
}

/// A shutdown (a graceful release) names the registry's best candidate:
/// the newest revision among the highest priorities, never a priority 0.
#[tokio::test(start_paused = true)]
async fn a_shutdown_names_the_registrys_best_candidate() {
    use crate::elector::{Elector, ElectorConfig};
    use tokio_util::sync::CancellationToken;
    let backend = Arc::new(Naming {
        inner: crate::backend::memory::MemoryBackend::new(),
        listed: vec![
            record("me", 1, "a", 1),
            record("zero", 0, "b", 9),
            record("old", 2, "a", 2),
            record("new", 2, "b", 5),
        ],
        now: vec![],
        named: Mutex::default(),
    });
    // Priority 5: nobody listed preempts it while it leads.
    let mut cfg = ElectorConfig::new("e", "me", Duration::from_secs(3));
    cfg.standing.priority = 5;
    cfg.standing.revision = "a".into();
    let connected = connected_to(&backend);
    let (elector, rx) = Elector::connected(cfg, &connected, None);
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    sleep(Duration::from_secs(1)).await;
    assert!(rx.borrow().is_leader_now());
    stop.cancel();
    task.await.unwrap();
    assert_eq!(*backend.named.lock().unwrap(), [Some("new".to_owned())]);
}

/// Regression (the precedence matrix on Leases, where the leader's registry
/// is a watched copy one delivery behind the server): a switchover checks
/// its target on the list as it is now, so a target that turned ready a
/// moment ago is not refused as unhealthy.
#[tokio::test(start_paused = true)]
async fn a_switchover_checks_its_target_on_the_list_as_it_is_now() {
    use crate::elector::{Elector, ElectorConfig};
    use tokio_util::sync::CancellationToken;
    let mut sick = record("b", 1, "a", 2);
    sick.candidate.ready = false;
    let backend = Arc::new(Naming {
        inner: crate::backend::memory::MemoryBackend::new(),
        listed: vec![record("me", 1, "a", 1), sick],
        now: vec![record("me", 1, "a", 1), record("b", 1, "a", 2)],
        named: Mutex::default(),
    });
    let cfg = ElectorConfig::new("e", "me", Duration::from_secs(3));
    let connected = connected_to(&backend);
    let (elector, rx) = Elector::connected(cfg, &connected, None);
    let handle = elector.handle();
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    sleep(Duration::from_secs(1)).await;
    assert!(rx.borrow().is_leader_now());
    let done = handle.switchover("b", false).await;
    assert!(done.is_ok(), "refused on the trailing copy: {done:?}");
    stop.cancel();
    task.await.unwrap();
    assert_eq!(
        backend.named.lock().unwrap().first(),
        Some(&Some("b".to_owned()))
    );
}
