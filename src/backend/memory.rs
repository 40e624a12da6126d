//! An in-memory [`LeaseBackend`] on the tokio clock, for unit tests of the
//! Elector (under `#[tokio::test(start_paused = true)]`) and for embedding
//! tests. It behaves like a single etcd: one key, a lease per term, fencing
//! tokens from a revision counter. Faults can be switched on to make every
//! call fail, as an unreachable backend would. It keeps a candidate registry
//! (records with a TTL on the tokio clock) and the operator controls (a
//! pause honoured in the campaign's own step, a switchover request), so the
//! Elector's operations are tested without a server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use super::candidates::{Candidate, Listed, successor_wait};
use super::controls::Controls;
use super::{
    About, BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term,
    WaitReason,
};
use super::{CandidateRegistry, ControlStore};

/// The in-memory backend's name and advice (it has no TLS, credentials or refusals).
pub const ABOUT: &About = &About {
    name: "memory",
    tls_hint: "the in-memory backend has no TLS",
    auth_hint: "the in-memory backend has no credentials",
    rejected: &[],
    expiry: "its lease has no time left",
    open_cause: None,
};

#[derive(Default)]
struct Inner {
    key: Option<(Holder, Instant)>,
    /// Lease expiry per term id, kept after the key is deleted by hand.
    leases: Vec<(super::TermId, Instant)>,
    revision: i64,
    next_lease: u64,
    unreachable: bool,
    /// The registry: each record, when it was written, its TTL and its
    /// creation order.
    candidates: Vec<(Candidate, Instant, Duration, u64)>,
    /// How many records were ever created (the creation order).
    created: u64,
    /// The successor named by the last release, until when the other
    /// candidates leave it the term at least, and when each other
    /// candidate first saw it (each leaves it the wait from its own first
    /// sight, as on etcd: a candidate asleep in an earlier wait when the
    /// release landed still leaves the successor its whole head start).
    successor: Option<(String, Instant, std::collections::HashMap<String, Instant>)>,
    /// The failsafe roster (no TTL), what each identity's next write
    /// carries, and the applications with their expiry (see `roster`).
    roster: roster::Rosters,
    /// Since when the server is stopped (`stop`): leases do not run out
    /// while it is, as a restarted etcd gives every lease its TTL again.
    stopped_at: Option<Instant>,
}

mod roster;
pub mod shards;

/// How long a campaign refused by a pause asks the candidate to wait.
const PAUSED_RETRY: Duration = Duration::from_secs(1);

/// A shared in-memory election key. Clones share the same key, like several
/// candidates talking to one server.
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<watch::Sender<i64>>,
    controls: Arc<watch::Sender<Controls>>,
    registry: Arc<watch::Sender<u64>>,
    /// This handle's own link to the server (`cut`): one candidate cut
    /// off while the others reach it.
    link_down: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// This backend connected as a backend row connects: the election, its
    /// registry, its controls and its failsafe roster, all this same key (no
    /// coordination).
    pub fn connected(&self) -> super::registry::Connected {
        super::registry::Connected {
            election: Arc::new(self.clone()),
            coordination: None,
            registry: Some(Arc::new(self.clone())),
            controls: Some(Arc::new(self.clone())),
            roster: Some(Arc::new(self.clone())),
            shards: Some(Arc::new(shards::MemoryShards::new())),
        }
    }

    /// An empty key.
    pub fn new() -> Self {
        MemoryBackend {
            inner: Arc::new(Mutex::new(Inner::default())),
            changed: Arc::new(watch::channel(0).0),
            controls: Arc::new(watch::channel(Controls::default()).0),
            registry: Arc::new(watch::channel(0).0),
            link_down: Arc::default(),
        }
    }

    /// Another handle on the same server with a link of its own (see
    /// [`MemoryBackend::cut`]); a clone shares its link.
    pub fn handle(&self) -> MemoryBackend {
        MemoryBackend {
            link_down: Arc::default(),
            ..self.clone()
        }
    }

    /// Cut this handle's link to the server (`true`) or heal it: its calls
    /// fail as unreachable while the server keeps counting.
    pub fn cut(&self, down: bool) {
        self.link_down
            .store(down, std::sync::atomic::Ordering::SeqCst);
        self.changed.send_modify(|_| {});
    }

    /// Stop the server (`true`: every call fails as unreachable, and no
    /// lease runs out meanwhile) or start it again (every lease gets back
    /// the time it was stopped, as a restarted etcd renews every lease's TTL).
    pub fn stop(&self, stopped: bool) {
        let mut inner = self.inner.lock().unwrap();
        let now = Instant::now();
        match (stopped, inner.stopped_at) {
            (true, None) => inner.stopped_at = Some(now),
            (false, Some(at)) => {
                let gap = now - at;
                inner.stopped_at = None;
                inner.leases.iter_mut().for_each(|(_, u)| *u += gap);
                if let Some((_, u)) = &mut inner.key {
                    *u += gap;
                }
            }
            _ => {}
        }
        drop(inner);
        self.changed.send_modify(|_| {});
    }

    /// Make every call fail with [`BackendError::Unreachable`] (`true`) or work again.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.inner.lock().unwrap().unreachable = unreachable;
        // Wake watchers so they fail like a broken stream would.
        self.changed.send_modify(|_| {});
    }

    /// Delete the key by hand (like `etcdctl del`), leaving its lease alive.
    pub fn delete_key(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.revision += 1;
        inner.key = None;
        let rev = inner.revision;
        drop(inner);
        self.changed.send_replace(rev);
    }

    /// The current holder, if its lease is alive.
    pub fn holder(&self) -> Option<Holder> {
        let mut inner = self.inner.lock().unwrap();
        Self::expire(&mut inner);
        inner.key.as_ref().map(|(h, _)| h.clone())
    }

    fn expire(inner: &mut Inner) -> bool {
        let now = Instant::now();
        if inner.stopped_at.is_some() {
            return false;
        }
        inner.leases.retain(|(_, until)| *until > now);
        if let Some((_, until)) = &inner.key
            && *until <= now
        {
            inner.key = None;
            inner.revision += 1;
            return true;
        }
        false
    }

    /// Why `identity` may not take the free key now: the last release
    /// named another successor that has not had its wait, or the election
    /// is paused (decided under the same lock as the take).
    fn held_back(
        &self,
        inner: &mut Inner,
        identity: &str,
        previous: Option<&Holder>,
    ) -> Option<Campaign> {
        let now = Instant::now();
        if let Some((to, until, seen)) = &mut inner.successor
            && to != identity
        {
            let first = *seen.entry(identity.to_owned()).or_insert(now);
            let until = (*until).max(first + successor_wait(Duration::ZERO));
            if now < until {
                return Some(Campaign::Waiting {
                    previous: None,
                    retry_after: until - now,
                    why: WaitReason::SuccessorHeadStart,
                });
            }
        }
        self.controls.borrow().paused.then(|| Campaign::Waiting {
            previous: previous.cloned(),
            retry_after: PAUSED_RETRY,
            why: WaitReason::Paused,
        })
    }

    fn check(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        let mut inner = self.inner.lock().unwrap();
        let cut = self.link_down.load(std::sync::atomic::Ordering::SeqCst);
        if inner.unreachable || cut || inner.stopped_at.is_some() {
            return Err(BackendError::Unreachable {
                backend: ABOUT,
                endpoints: "memory".into(),
                source: "switched off by the test".into(),
            });
        }
        if Self::expire(&mut inner) {
            self.changed.send_replace(inner.revision);
        }
        Ok(inner)
    }
}

#[async_trait]
impl LeaseBackend for MemoryBackend {
    fn about(&self) -> &'static About {
        ABOUT
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign> {
        let mut inner = self.check()?;
        let revision = inner.revision;
        if let Some((holder, until)) = &inner.key {
            let mut holder = holder.clone();
            holder.revision = Some(revision);
            holder.expires_in = Some(until.saturating_duration_since(Instant::now()));
            return Ok(Campaign::Following(holder));
        }
        if let Some(wait) = self.held_back(&mut inner, identity, previous) {
            return Ok(wait);
        }
        if let Some(prev) = previous
            && let Some((_, until)) = inner.leases.iter().find(|(id, _)| *id == prev.term_id)
        {
            return Ok(Campaign::Waiting {
                previous: Some(prev.clone()),
                retry_after: until.saturating_duration_since(Instant::now()),
                why: WaitReason::PreviousTerm,
            });
        }
        inner.successor = None;
        inner.revision += 1;
        inner.next_lease += 1;
        let holder = Holder {
            identity: identity.to_owned(),
            fencing_token: inner.revision as u64,
            term_id: super::TermId::new(format!("{:x}", inner.next_lease)),
            revision: Some(inner.revision),
            expires_in: None,
        };
        let until = Instant::now() + ttl;
        inner.key = Some((holder.clone(), until));
        inner.leases.push((holder.term_id.clone(), until));
        inner.roster.write_staged(identity);
        let rev = inner.revision;
        drop(inner);
        self.changed.send_replace(rev);
        Ok(Campaign::Elected(Term {
            holder,
            ttl,
            granted: ttl,
            servers: None,
        }))
    }

    async fn read(&self) -> Result<Option<Holder>> {
        let inner = self.check()?;
        let revision = inner.revision;
        Ok(inner.key.as_ref().map(|(h, until)| {
            let mut h = h.clone();
            h.revision = Some(revision);
            h.expires_in = Some(until.saturating_duration_since(Instant::now()));
            h
        }))
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let mut inner = self.check()?;
        let now = Instant::now();
        let Some(lease) = inner
            .leases
            .iter_mut()
            .find(|(id, _)| *id == term.holder.term_id)
        else {
            return Ok(Renewal::Lost(LostReason::LeaseExpired));
        };
        lease.1 = now + term.ttl;
        match &mut inner.key {
            None => Ok(Renewal::Lost(LostReason::KeyDeleted)),
            Some((holder, _)) if holder.term_id != term.holder.term_id => {
                Ok(Renewal::Lost(LostReason::KeyOverwritten))
            }
            Some((_, until)) => {
                *until = now + term.ttl;
                let inner = &mut *inner;
                inner.roster.write_staged(&term.holder.identity);
                Ok(Renewal::Renewed {
                    ttl: term.ttl,
                    servers: None,
                })
            }
        }
    }

    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        let mut inner = self.check()?;
        inner.leases.retain(|(id, _)| *id != term.holder.term_id);
        if matches!(&inner.key, Some((h, _)) if h.term_id == term.holder.term_id) {
            if let Some(to) = successor {
                let until = Instant::now() + successor_wait(Duration::ZERO);
                inner.successor = Some((to.to_owned(), until, Default::default()));
            }
            inner.key = None;
            inner.revision += 1;
            let rev = inner.revision;
            drop(inner);
            self.changed.send_replace(rev);
        }
        Ok(())
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        let mut rx = self.changed.subscribe();
        loop {
            let expiry = {
                let inner = self.check()?;
                let current = inner.key.as_ref().map(|(h, _)| h.term_id.clone());
                if current.as_ref() != Some(&seen.term_id) && Some(inner.revision) > seen.revision {
                    return Ok(());
                }
                inner.key.as_ref().map(|(_, until)| *until)
            };
            // Wake up at the lease expiry, like etcd's delete event.
            match expiry {
                Some(until) => tokio::select! {
                    _ = rx.changed() => {}
                    _ = tokio::time::sleep_until(until) => {}
                },
                None => {
                    let _ = rx.changed().await;
                }
            }
        }
    }
}

#[async_trait]
impl CandidateRegistry for MemoryBackend {
    async fn publish_candidate(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        let mut inner = self.check()?;
        let now = Instant::now();
        let created = match inner
            .candidates
            .iter()
            .find(|(c, _, _, _)| c.identity == candidate.identity)
        {
            Some((_, _, _, created)) => *created,
            None => {
                inner.created += 1;
                inner.created
            }
        };
        inner
            .candidates
            .retain(|(c, _, _, _)| c.identity != candidate.identity);
        inner
            .candidates
            .push((candidate.clone(), now, ttl, created));
        drop(inner);
        self.registry.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn withdraw_candidate(&self, identity: &str) -> Result<()> {
        let mut inner = self.check()?;
        inner
            .candidates
            .retain(|(c, _, _, _)| c.identity != identity);
        drop(inner);
        self.registry.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn candidates(&self) -> Result<Vec<Listed>> {
        let inner = self.check()?;
        let now = Instant::now();
        let listed = inner.candidates.iter().map(|(c, at, ttl, created)| Listed {
            candidate: c.clone(),
            age: Some(now.saturating_duration_since(*at)),
            ttl: *ttl,
            created: Some(*created),
            written_ago: None,
        });
        Ok(listed.collect())
    }

    async fn watch_candidates(&self) -> Result<()> {
        let mut rx = self.registry.subscribe();
        let _ = rx.changed().await;
        self.check().map(|_| ())
    }
}

#[async_trait]
impl ControlStore for MemoryBackend {
    async fn controls(&self) -> Result<Controls> {
        drop(self.check()?);
        Ok(self.controls.borrow().clone())
    }

    async fn watch_controls(&self, seen: &Controls) -> Result<Controls> {
        let mut rx = self.controls.subscribe();
        let controls = rx.wait_for(|c| c != seen).await;
        let controls = controls.map(|c| c.clone()).unwrap_or_default();
        drop(self.check()?);
        Ok(controls)
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        drop(self.check()?);
        self.controls.send_if_modified(|c| {
            let changed = c.paused != paused;
            c.paused = paused;
            changed
        });
        Ok(())
    }

    async fn request_switchover(&self, to: Option<&str>) -> Result<()> {
        drop(self.check()?);
        let to = to.map(str::to_owned);
        self.controls.send_if_modified(|c| {
            let changed = c.switchover != to;
            c.switchover = to;
            changed
        });
        Ok(())
    }
}
