use async_trait::async_trait;

use super::*;
use crate::backend::LostReason;
use crate::backend::memory::MemoryBackend;
use crate::backend::{CandidateRegistry, ControlStore};

const TTL: Duration = Duration::from_secs(2);

fn pair() -> (MemoryBackend, MemoryBackend, Arc<Both>) {
    let (p, b) = (MemoryBackend::new(), MemoryBackend::new());
    let both = Both::new(Arc::new(p.clone()), Arc::new(b.clone()));
    (p, b, both)
}

fn elected(c: Campaign) -> Term {
    match c {
        Campaign::Elected(t) => t,
        other => panic!("not elected: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn elected_only_holding_both_with_the_primarys_term() {
    let (p, b, both) = pair();
    // Another elector (the old image) holds the bridge: follow it, and
    // leave the primary untouched.
    let old = elected(b.campaign("old", TTL, None).await.unwrap());
    match both.campaign("a", TTL, None).await.unwrap() {
        Campaign::Following(h) => assert_eq!(h.identity, "old"),
        other => panic!("{other:?}"),
    }
    assert!(p.holder().is_none(), "the primary is not written");
    b.release(&old, None).await.unwrap();
    let t = elected(both.campaign("a", TTL, None).await.unwrap());
    assert_eq!(
        Some(t.holder.term_id.clone()),
        p.holder().map(|h| h.term_id)
    );
    assert_eq!(b.holder().unwrap().identity, "a");
    assert!(matches!(
        both.renew(&t).await.unwrap(),
        Renewal::Renewed { .. }
    ));
    both.release(&t, None).await.unwrap();
    assert!(
        p.holder().is_none() && b.holder().is_none(),
        "both released"
    );
}

#[tokio::test(start_paused = true)]
async fn a_primary_held_elsewhere_gives_the_bridge_back() {
    let (p, b, both) = pair();
    // A primary-only candidate (the bridge turned off) leads.
    elected(p.campaign("lease-only", TTL, None).await.unwrap());
    match both.campaign("a", TTL, None).await.unwrap() {
        Campaign::Following(h) => assert_eq!(h.identity, "lease-only"),
        other => panic!("{other:?}"),
    }
    assert!(b.holder().is_none(), "the bridge was given back");
}

#[tokio::test(start_paused = true)]
async fn losing_either_lock_is_losing() {
    for bridge_side in [false, true] {
        let (p, b, both) = pair();
        let t = elected(both.campaign("a", TTL, None).await.unwrap());
        if bridge_side {
            b.delete_key();
        } else {
            p.delete_key();
        }
        assert_eq!(
            both.renew(&t).await.unwrap(),
            Renewal::Lost(LostReason::KeyDeleted),
            "bridge side: {bridge_side}"
        );
    }
    // The held term's watch ends when the bridge changes.
    let (_p, b, both) = pair();
    let t = elected(both.campaign("a", TTL, None).await.unwrap());
    let watch = both.watch(&t.holder);
    b.delete_key();
    tokio::time::timeout(Duration::from_secs(1), watch)
        .await
        .expect("the watch resolves")
        .unwrap();
}

/// A primary that keeps a pause (the memory backend keeps none) and
/// answers a campaign as the Lease backend does while paused.
struct Pausable {
    inner: MemoryBackend,
    paused: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl LeaseBackend for Pausable {
    fn about(&self) -> &'static About {
        self.inner.about()
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign> {
        if self.paused.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Campaign::Waiting {
                previous: None,
                retry_after: Duration::from_secs(1),
                why: WaitReason::Paused,
            });
        }
        self.inner.campaign(identity, ttl, previous).await
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        self.inner.renew(term).await
    }

    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        self.inner.release(term, successor).await
    }

    async fn read(&self) -> Result<Option<Holder>> {
        self.inner.read().await
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        self.inner.watch(seen).await
    }
}

/// No registry of its own: the memory backend's.
#[async_trait]
impl CandidateRegistry for Pausable {
    async fn publish_candidate(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        self.inner.publish_candidate(candidate, ttl).await
    }

    async fn withdraw_candidate(&self, identity: &str) -> Result<()> {
        self.inner.withdraw_candidate(identity).await
    }

    async fn candidates(&self) -> Result<Vec<Listed>> {
        self.inner.candidates().await
    }

    async fn watch_candidates(&self) -> Result<()> {
        self.inner.watch_candidates().await
    }
}

#[async_trait]
impl ControlStore for Pausable {
    async fn controls(&self) -> Result<Controls> {
        Ok(Controls {
            paused: self.paused.load(std::sync::atomic::Ordering::SeqCst),
            switchover: None,
        })
    }

    async fn watch_controls(&self, _: &Controls) -> Result<Controls> {
        std::future::pending().await
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        self.paused
            .store(paused, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn request_switchover(&self, _: Option<&str>) -> Result<()> {
        Ok(())
    }
}

/// While the primary says the election is paused, campaigns leave the
/// bridge alone (an unreachable bridge is never asked); after resume the
/// candidate holds both.
#[tokio::test(start_paused = true)]
async fn a_paused_primary_leaves_the_bridge_alone() {
    let b = MemoryBackend::new();
    let p = Arc::new(Pausable {
        inner: MemoryBackend::new(),
        paused: true.into(),
    });
    let both = Both::new(p.clone(), Arc::new(b.clone()));
    assert!(both.controls().await.unwrap().paused);
    for round in 0..3 {
        match both.campaign("a", TTL, None).await {
            Ok(Campaign::Waiting { why, .. }) => assert_eq!(why, WaitReason::Paused),
            other => panic!("round {round}: {other:?}"),
        }
        assert!(b.holder().is_none(), "the bridge is not held");
        b.set_unreachable(true);
    }
    p.paused.store(false, std::sync::atomic::Ordering::SeqCst);
    b.set_unreachable(false);
    elected(both.campaign("a", TTL, None).await.unwrap());
    assert_eq!(b.holder().unwrap().identity, "a");
    assert_eq!(p.inner.holder().unwrap().identity, "a");
}
