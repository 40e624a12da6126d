//! The coordination API beyond leadership: named locks, fair locks,
//! semaphores and job claims, over the same backend as the election, with
//! fencing tokens. The HTTP handlers ([`http`]) are thin over [`Coordinator`],
//! which Rust programs can use directly.
//!
//! Safety rules kept by every backend implementation (the bugs hand-rolled
//! Redis code has):
//! - a token is random per acquisition, and renew/release act only when the
//!   stored value carries it: never release someone else's lock;
//! - a renew never re-creates an expired lock, permit or claim (410 Gone);
//! - a semaphore counts only permits that have not expired;
//! - fencing tokens grow per name (etcd: the key's `create_revision`, a
//!   global revision; Redis: a counter beside the key).

pub mod etcd;
pub mod http;
pub mod redis;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;

use crate::backend::BackendError;

/// What a granted lock, permit or claim looks like to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Grant {
    /// Lock, semaphore or `queue/job` name.
    pub name: String,
    /// Random per acquisition; needed to renew, release or complete.
    pub token: String,
    /// Grows per name with every acquisition; pass it to the guarded resource.
    pub fencing_token: u64,
    /// TTL granted, in milliseconds (etcd grants whole seconds, at least its minimum).
    pub ttl_ms: u64,
}

/// The answer to one acquisition attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Try {
    /// Granted.
    Acquired(Grant),
    /// Held by someone else: the holder's owner label (locks) or the number of
    /// live permits (semaphores).
    Held(String),
}

/// The answer to a job claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This client now holds the claim.
    Claimed(Grant),
    /// Another client holds a live claim (its owner label).
    ClaimedByOther(String),
    /// The job was completed (and is remembered for the retention time).
    Completed,
}

/// The answer to renew, release or complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done; for renewals, the TTL granted.
    Ok(Option<Duration>),
    /// The lock/permit/claim expired or was never there (HTTP 410).
    Gone,
    /// It belongs to someone else now (HTTP 409).
    NotYours,
}

/// Which kind of object a token belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A named lock (fair or not).
    Lock,
    /// A semaphore permit.
    Semaphore,
}

/// Errors of the coordination API.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// The backend failed (unreachable, timeout, refused).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The operation is not available on this backend.
    #[error("{0}")]
    Unsupported(String),
}

/// Shorthand.
pub type Result<T, E = CoordError> = std::result::Result<T, E>;

/// The coordination verbs of one backend. Each call is one attempt; waiting
/// (`wait=`) is done by [`Service`] except for fair locks, which queue.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// Backend name.
    fn backend(&self) -> &'static str;
    /// Try once to take lock `name` for `ttl`, labelled with `owner`.
    async fn lock(&self, name: &str, owner: &str, ttl: Duration) -> Result<Try>;
    /// Take lock `name` in arrival order, waiting up to `wait` (etcd only).
    async fn lock_fair(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try>;
    /// Try once to take one of `permits` permits of semaphore `name`.
    async fn semaphore(&self, name: &str, owner: &str, permits: u32, ttl: Duration) -> Result<Try>;
    /// Extend a lock or permit; never re-creates an expired one.
    async fn renew(&self, kind: Kind, name: &str, token: &str, ttl: Duration) -> Result<Outcome>;
    /// Release a lock or permit if `token` still holds it.
    async fn release(&self, kind: Kind, name: &str, token: &str) -> Result<Outcome>;
    /// Claim job `job` of `queue` for `ttl` unless claimed or completed.
    async fn claim(&self, queue: &str, job: &str, owner: &str, ttl: Duration) -> Result<Claim>;
    /// Mark a claimed job completed, remembered for `retention`.
    async fn complete(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome>;
}

/// A random token: `prefix` + 32 hex digits.
pub fn random_token(prefix: &str) -> String {
    let bytes: [u8; 16] = rand::rng().random();
    let mut s = String::with_capacity(prefix.len() + 32);
    s.push_str(prefix);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Longest accepted name, in bytes.
pub const MAX_NAME: usize = 128;

/// Check a lock, semaphore, queue or job name: 1–128 characters of
/// `[A-Za-z0-9._-]`.
///
/// # Errors
/// A message naming `what` and the rule.
pub fn check_name(what: &str, name: &str) -> std::result::Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "{what} ({}) must be 1-{MAX_NAME} characters of letters, digits, '-', '_' and '.'",
            name.chars().take(MAX_NAME + 8).collect::<String>()
        ));
    }
    Ok(())
}

/// Names tracked individually in metrics; the rest share `_other`.
pub const MAX_TRACKED_NAMES: usize = 100;

/// `dist_lock_*` metrics, with a cap on label cardinality.
pub struct CoordMetrics {
    acquisitions: IntCounterVec,
    wait: HistogramVec,
    active: IntGaugeVec,
    tracked: Mutex<Vec<String>>,
}

impl CoordMetrics {
    /// Register on `registry`.
    ///
    /// # Errors
    /// A [`prometheus::Error`] when the names are taken.
    pub fn new(registry: &Registry) -> std::result::Result<Self, prometheus::Error> {
        let m = CoordMetrics {
            acquisitions: IntCounterVec::new(
                Opts::new(
                    "dist_lock_acquisitions_total",
                    "Lock, permit and claim attempts by result (acquired, busy, error).",
                ),
                &["lock_name", "result"],
            )?,
            wait: HistogramVec::new(
                HistogramOpts::new(
                    "dist_lock_wait_seconds",
                    "Time from request to grant, in seconds.",
                )
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
                &["lock_name"],
            )?,
            active: IntGaugeVec::new(
                Opts::new(
                    "dist_locks_active",
                    "Locks, permits and claims granted through this sidecar and not released or expired.",
                ),
                &["lock_name"],
            )?,
            tracked: Mutex::new(Vec::new()),
        };
        registry.register(Box::new(m.acquisitions.clone()))?;
        registry.register(Box::new(m.wait.clone()))?;
        registry.register(Box::new(m.active.clone()))?;
        Ok(m)
    }

    fn label(&self, name: &str) -> String {
        let mut t = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        if t.iter().any(|n| n == name) {
            return name.to_owned();
        }
        if t.len() < MAX_TRACKED_NAMES {
            t.push(name.to_owned());
            return name.to_owned();
        }
        "_other".to_owned()
    }
}

/// The coordination service: a [`Coordinator`] plus waiting, metrics and the
/// set of grants made through this sidecar (for `dist_locks_active`).
pub struct Service {
    coord: Box<dyn Coordinator>,
    metrics: Option<CoordMetrics>,
    /// token -> (metric label, expiry)
    grants: Mutex<HashMap<String, (String, Instant)>>,
    /// Owner label used when a request names none (the sidecar's identity).
    pub default_owner: String,
}

impl Service {
    /// A service over `coord`.
    pub fn new(
        coord: Box<dyn Coordinator>,
        metrics: Option<CoordMetrics>,
        default_owner: String,
    ) -> Self {
        Service {
            coord,
            metrics,
            grants: Mutex::new(HashMap::new()),
            default_owner,
        }
    }

    /// Backend name.
    pub fn backend(&self) -> &'static str {
        self.coord.backend()
    }

    fn note(&self, name: &str, result: &str, started: Instant, grant: Option<&Grant>) {
        let Some(m) = &self.metrics else { return };
        let label = m.label(name);
        m.acquisitions
            .with_label_values(&[label.as_str(), result])
            .inc();
        if let Some(g) = grant {
            m.wait
                .with_label_values(&[label.as_str()])
                .observe(started.elapsed().as_secs_f64());
            self.grants
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    g.token.clone(),
                    (label, Instant::now() + Duration::from_millis(g.ttl_ms)),
                );
        }
        self.refresh_active();
    }

    fn forget(&self, token: &str) {
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
        self.refresh_active();
    }

    fn extend(&self, token: &str, ttl: Duration) {
        if let Some(e) = self
            .grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(token)
        {
            e.1 = Instant::now() + ttl;
        }
    }

    /// Recompute `dist_locks_active` (expired grants drop out).
    pub fn refresh_active(&self) {
        let Some(m) = &self.metrics else { return };
        let now = Instant::now();
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.retain(|_, (_, until)| *until > now);
        let mut counts: HashMap<&str, i64> = HashMap::new();
        for (label, _) in grants.values() {
            *counts.entry(label.as_str()).or_default() += 1;
        }
        m.active.reset();
        for (label, n) in counts {
            m.active.with_label_values(&[label]).set(n);
        }
    }

    /// Retry `attempt` until it grants or `wait` passes (10 ms, doubling to 50 ms).
    async fn with_wait<F, Fut>(&self, name: &str, wait: Duration, mut attempt: F) -> Result<Try>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Try>>,
    {
        let started = Instant::now();
        let deadline = started + wait;
        let mut delay = Duration::from_millis(10);
        loop {
            match attempt().await {
                Ok(Try::Acquired(g)) => {
                    self.note(name, "acquired", started, Some(&g));
                    return Ok(Try::Acquired(g));
                }
                Ok(Try::Held(h)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        self.note(name, "busy", started, None);
                        return Ok(Try::Held(h));
                    }
                    tokio::time::sleep(delay.min(deadline - now)).await;
                    delay = (delay * 2).min(Duration::from_millis(50));
                }
                Err(e) => {
                    self.note(name, "error", started, None);
                    return Err(e);
                }
            }
        }
    }

    /// Acquire lock `name`, waiting up to `wait`; in arrival order when `fair`.
    ///
    /// # Errors
    /// [`CoordError`] from the backend, or `Unsupported` for fair locks on Redis.
    pub async fn lock(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
        fair: bool,
    ) -> Result<Try> {
        if fair {
            let started = Instant::now();
            let r = self.coord.lock_fair(name, owner, ttl, wait).await;
            match &r {
                Ok(Try::Acquired(g)) => self.note(name, "acquired", started, Some(g)),
                Ok(Try::Held(_)) => self.note(name, "busy", started, None),
                Err(_) => self.note(name, "error", started, None),
            }
            return r;
        }
        self.with_wait(name, wait, || self.coord.lock(name, owner, ttl))
            .await
    }

    /// Acquire one of `permits` permits of `name`, waiting up to `wait`.
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn semaphore(
        &self,
        name: &str,
        owner: &str,
        permits: u32,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try> {
        self.with_wait(name, wait, || {
            self.coord.semaphore(name, owner, permits, ttl)
        })
        .await
    }

    /// Renew a lock or permit.
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn renew(
        &self,
        kind: Kind,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Outcome> {
        let r = self.coord.renew(kind, name, token, ttl).await?;
        match r {
            Outcome::Ok(Some(t)) => self.extend(token, t),
            Outcome::Ok(None) => self.extend(token, ttl),
            Outcome::Gone | Outcome::NotYours => self.forget(token),
        }
        Ok(r)
    }

    /// Release a lock or permit.
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn release(&self, kind: Kind, name: &str, token: &str) -> Result<Outcome> {
        let r = self.coord.release(kind, name, token).await?;
        if r == Outcome::Ok(None) || r == Outcome::Gone {
            self.forget(token);
        }
        Ok(r)
    }

    /// Claim a job.
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn claim(&self, queue: &str, job: &str, owner: &str, ttl: Duration) -> Result<Claim> {
        let started = Instant::now();
        let r = self.coord.claim(queue, job, owner, ttl).await;
        match &r {
            Ok(Claim::Claimed(g)) => self.note(queue, "acquired", started, Some(g)),
            Ok(_) => self.note(queue, "busy", started, None),
            Err(_) => self.note(queue, "error", started, None),
        }
        r
    }

    /// Complete a claimed job.
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn complete(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        let r = self.coord.complete(queue, job, token, retention).await?;
        if matches!(r, Outcome::Ok(_) | Outcome::Gone) {
            self.forget(token);
        }
        Ok(r)
    }
}
