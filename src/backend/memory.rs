//! An in-memory [`LeaseBackend`] on the tokio clock, for unit tests of the
//! Elector (under `#[tokio::test(start_paused = true)]`) and for embedding
//! tests. It behaves like a single etcd: one key, a lease per term, fencing
//! tokens from a revision counter. Faults can be switched on to make every
//! call fail, as an unreachable backend would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{
    About, BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term,
};

/// The in-memory backend's name and advice (it has no TLS, credentials or refusals).
pub const ABOUT: &About = &About {
    name: "memory",
    tls_hint: "the in-memory backend has no TLS",
    auth_hint: "the in-memory backend has no credentials",
    rejected: &[],
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
}

/// A shared in-memory election key. Clones share the same key, like several
/// candidates talking to one server.
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<watch::Sender<i64>>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// An empty key.
    pub fn new() -> Self {
        MemoryBackend {
            inner: Arc::new(Mutex::new(Inner::default())),
            changed: Arc::new(watch::channel(0).0),
        }
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

    fn check(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        let mut inner = self.inner.lock().unwrap();
        if inner.unreachable {
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
        if let Some(prev) = previous
            && let Some((_, until)) = inner.leases.iter().find(|(id, _)| *id == prev.term_id)
        {
            return Ok(Campaign::Waiting {
                previous: Some(prev.clone()),
                retry_after: until.saturating_duration_since(Instant::now()),
                why: "the key was deleted but the previous term is alive: waiting for it to end",
            });
        }
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
                Ok(Renewal::Renewed {
                    ttl: term.ttl,
                    servers: None,
                })
            }
        }
    }

    async fn resign(&self, term: &Term) -> Result<()> {
        let mut inner = self.check()?;
        inner.leases.retain(|(id, _)| *id != term.holder.term_id);
        if matches!(&inner.key, Some((h, _)) if h.term_id == term.holder.term_id) {
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
