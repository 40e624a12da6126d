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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use rand::Rng;
use serde::Serialize;
use tokio::sync::Notify;
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
    /// Held by someone else: the holder's owner label (locks).
    Held(String),
    /// A semaphore with all its permits live: how many are live.
    Full(u64),
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
    /// Released through this sidecar already (a repeated DELETE).
    AlreadyReleased,
}

/// Which kind of object a token belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// A coordination key holds a value of another type or shape than ours
    /// (Redis `WRONGTYPE`, or a fencing counter that is not a non-negative
    /// integer). Nothing was written.
    #[error(
        "the coordination key {key} holds {found}; delete it, or use another name or --redis-prefix"
    )]
    Corrupt {
        /// The backend key.
        key: String,
        /// What was found there.
        found: String,
    },
    /// Too many requests are already waiting on this sidecar.
    #[error(
        "{waiting} requests already wait on this sidecar (the cap is {cap}); retry later or with a shorter wait"
    )]
    TooManyWaiters {
        /// Requests waiting now.
        waiting: usize,
        /// The cap.
        cap: usize,
    },
}

/// Shorthand.
pub type Result<T, E = CoordError> = std::result::Result<T, E>;

/// The coordination verbs of one backend. Each call is one attempt; waiting
/// (`wait=`) is done by [`Service`] except for fair locks, which queue.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// Backend name.
    fn backend(&self) -> &'static str;
    /// Whether [`Coordinator::lock_fair`] queues waiters (then plain requests
    /// that may wait queue too). Default: no.
    fn queues(&self) -> bool {
        false
    }
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
    /// Wait until lock or semaphore `name` may have changed (a holder left or
    /// expired), or until `until`. `seen` is what the last attempt saw: 1
    /// holder (locks) or the live permits (semaphores). Backends that can
    /// tell (etcd: a watch; Redis: pub/sub and the holder's expiry) override
    /// it; the default sleeps 50 ms.
    async fn changed(&self, _kind: Kind, _name: &str, _seen: u64, until: Instant) -> Result<()> {
        tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(50))).await;
        Ok(())
    }
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
    /// Wait for the work this coordinator runs off the answer path (etcd:
    /// the lease revokes after releases), at most one call deadline. For the
    /// app's shutdown. Default: nothing to wait for.
    async fn close(&self) {}
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

/// What a token was issued for: one letter in the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// A lock taken without queueing (`l`).
    Lock,
    /// A lock taken in arrival order (`f`).
    FairLock,
    /// A semaphore permit (`s`).
    Permit,
    /// A job claim (`j`).
    Job,
}

impl TokenKind {
    fn letter(self) -> char {
        match self {
            TokenKind::Lock => 'l',
            TokenKind::FairLock => 'f',
            TokenKind::Permit => 's',
            TokenKind::Job => 'j',
        }
    }

    /// Whether a token of this kind may renew or release an object of `kind`.
    pub fn serves(self, kind: Kind) -> bool {
        matches!(
            (self, kind),
            (TokenKind::Lock | TokenKind::FairLock, Kind::Lock)
                | (TokenKind::Permit, Kind::Semaphore)
        )
    }
}

/// A parsed token, version 1: `v1.<kind>.<lease hex>.<32 hex random>`, where
/// `<lease hex>` is the etcd lease id (`0` on Redis, which has none).
///
/// Every field sits at a fixed position between dots, so no field is told
/// apart from another by its first character (a lease id may start with any
/// hex digit). Clients treat the whole string as opaque.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// What it was issued for.
    pub kind: TokenKind,
    /// The etcd lease id; 0 on Redis.
    pub lease: i64,
    /// The random part.
    pub nonce: String,
}

impl Token {
    /// A fresh token of `kind` bound to `lease` (0 when there is none).
    pub fn new(kind: TokenKind, lease: i64) -> Token {
        Token {
            kind,
            lease,
            nonce: random_token(""),
        }
    }

    /// Read a token; `None` when it is not a version-1 token.
    pub fn parse(text: &str) -> Option<Token> {
        let mut parts = text.split('.');
        let (Some("v1"), Some(kind), Some(lease), Some(nonce), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let kind = match kind {
            "l" => TokenKind::Lock,
            "f" => TokenKind::FairLock,
            "s" => TokenKind::Permit,
            "j" => TokenKind::Job,
            _ => return None,
        };
        if lease.is_empty() || lease.len() > 16 || nonce.len() != 32 {
            return None;
        }
        let lease = i64::from_str_radix(lease, 16).ok().filter(|l| *l >= 0)?;
        if !nonce.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        Some(Token {
            kind,
            lease,
            nonce: nonce.to_owned(),
        })
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "v1.{}.{:x}.{}",
            self.kind.letter(),
            self.lease,
            self.nonce
        )
    }
}

/// Check a client-chosen owner label: 1-253 printable characters, no `|`.
///
/// # Errors
/// A message naming the field and the rule.
pub fn check_owner(owner: &str) -> std::result::Result<(), String> {
    if owner.is_empty()
        || owner.len() > 253
        || owner.contains('|')
        || owner.chars().any(char::is_control)
    {
        return Err(
            "query parameter owner must be 1-253 characters without '|' or control characters"
                .into(),
        );
    }
    Ok(())
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
    /// Waiters per (kind, name), woken by a release through this sidecar.
    wakeups: Mutex<HashMap<(Kind, String), Arc<Notify>>>,
    /// Requests waiting now.
    waiting: AtomicUsize,
    /// Most requests waiting at once; more answer [`CoordError::TooManyWaiters`].
    max_waiters: usize,
    /// Tokens released through this sidecar lately, so a repeated DELETE
    /// answers "already released" rather than "expired".
    released: Mutex<HashSet<String>>,
}

/// Default of [`Service::with_max_waiters`].
pub const DEFAULT_MAX_WAITERS: usize = 1024;
/// Released tokens remembered for a repeated DELETE.
const REMEMBERED_RELEASES: usize = 4096;

/// One counted waiter; uncounted on drop.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
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
            wakeups: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            max_waiters: DEFAULT_MAX_WAITERS,
            released: Mutex::new(HashSet::new()),
        }
    }

    /// Cap the requests that wait at once (`wait` > 0 and not granted at
    /// once); beyond it an acquisition answers [`CoordError::TooManyWaiters`]
    /// (HTTP 429). At least 1.
    pub fn with_max_waiters(mut self, cap: usize) -> Self {
        self.max_waiters = cap.max(1);
        self
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

    /// Retry `attempt` until it grants or `wait` passes. Between attempts
    /// the waiter sleeps until the backend reports a change of `name`
    /// ([`Coordinator::changed`]) or a release through this sidecar wakes it.
    async fn with_wait<F, Fut>(
        &self,
        kind: Kind,
        name: &str,
        wait: Duration,
        mut attempt: F,
    ) -> Result<Try>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Try>>,
    {
        let started = Instant::now();
        let deadline = started + wait;
        let mut waiter: Option<Waiting<'_>> = None;
        loop {
            let wake = self.wakeup(kind, name);
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match attempt().await {
                Ok(Try::Acquired(g)) => {
                    self.note(name, "acquired", started, Some(&g));
                    return Ok(Try::Acquired(g));
                }
                Ok(busy) => {
                    let seen = match busy {
                        Try::Full(n) => n,
                        _ => 1,
                    };
                    if Instant::now() >= deadline {
                        self.note(name, "busy", started, None);
                        return Ok(busy);
                    }
                    if waiter.is_none() {
                        waiter = Some(self.enter_wait()?);
                    }
                    tokio::select! {
                        _ = notified => {}
                        r = self.coord.changed(kind, name, seen, deadline) => {
                            if let Err(e) = r {
                                // A broken watch is no reason to fail the
                                // request: fall back to a short sleep.
                                tracing::debug!(error = %e, name, "waiting for a change failed");
                                tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(50))).await;
                            }
                        }
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
                Err(e) => {
                    self.note(name, "error", started, None);
                    return Err(e);
                }
            }
        }
    }

    /// Count one more waiter, or refuse when [`Service::max_waiters`] wait already.
    fn enter_wait(&self) -> Result<Waiting<'_>> {
        let now = self.waiting.fetch_add(1, Ordering::SeqCst);
        if now >= self.max_waiters {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(CoordError::TooManyWaiters {
                waiting: now,
                cap: self.max_waiters,
            });
        }
        Ok(Waiting(&self.waiting))
    }

    /// The local wake-up of waiters on `name` (released through this sidecar).
    fn wakeup(&self, kind: Kind, name: &str) -> Arc<Notify> {
        let mut w = self.wakeups.lock().unwrap_or_else(|e| e.into_inner());
        if w.len() > 10_000 {
            // Drop entries nobody waits on (only the map holds them).
            w.retain(|_, n| Arc::strong_count(n) > 1);
        }
        w.entry((kind, name.to_owned()))
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    fn wake(&self, kind: Kind, name: &str) {
        let n = self
            .wakeups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(kind, name.to_owned()))
            .cloned();
        // One release frees one lock or permit: wake one waiter (it always
        // retries once woken, so the wake-up is never lost).
        if let Some(n) = n {
            n.notify_one();
        }
    }

    /// Requests waiting right now (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
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
        // A plain request that may wait joins the queue where the backend
        // has one (etcd) at once: joining takes the lock when nobody holds it
        // and nobody queues (exactly a plain try), in fewer round trips than
        // a try first; one name is one lock, and each release wakes one waiter.
        let queue = fair || (!wait.is_zero() && self.coord.queues());
        if queue {
            let started = Instant::now();
            let _waiting = if wait.is_zero() {
                None
            } else {
                Some(self.enter_wait()?)
            };
            let r = self.coord.lock_fair(name, owner, ttl, wait).await;
            match &r {
                Ok(Try::Acquired(g)) => self.note(name, "acquired", started, Some(g)),
                Ok(_) => self.note(name, "busy", started, None),
                Err(_) => self.note(name, "error", started, None),
            }
            return r;
        }
        self.with_wait(Kind::Lock, name, wait, || self.coord.lock(name, owner, ttl))
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
        self.with_wait(Kind::Semaphore, name, wait, || {
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
            Outcome::Gone | Outcome::NotYours | Outcome::AlreadyReleased => self.forget(token),
        }
        Ok(r)
    }

    /// Release a lock or permit.
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn release(&self, kind: Kind, name: &str, token: &str) -> Result<Outcome> {
        if self
            .released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(token)
        {
            return Ok(Outcome::AlreadyReleased);
        }
        let r = self.coord.release(kind, name, token).await?;
        if r == Outcome::Ok(None) {
            self.wake(kind, name);
            let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
            if released.len() >= REMEMBERED_RELEASES {
                released.clear();
            }
            released.insert(token.to_owned());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One lock in memory; `changed` never reports anything, so only a
    /// release through the [`Service`] can wake a waiter.
    #[derive(Default)]
    struct OneLock(Mutex<Option<String>>);

    #[async_trait]
    impl Coordinator for OneLock {
        fn backend(&self) -> &'static str {
            "memory"
        }
        async fn lock(&self, name: &str, _: &str, ttl: Duration) -> Result<Try> {
            let mut held = self.0.lock().unwrap();
            if held.is_some() {
                return Ok(Try::Held("someone".into()));
            }
            let token = Token::new(TokenKind::Lock, 0).to_string();
            *held = Some(token.clone());
            Ok(Try::Acquired(Grant {
                name: name.into(),
                token,
                fencing_token: 1,
                ttl_ms: ttl.as_millis() as u64,
            }))
        }
        async fn lock_fair(&self, _: &str, _: &str, _: Duration, _: Duration) -> Result<Try> {
            Err(CoordError::Unsupported("no".into()))
        }
        async fn semaphore(&self, _: &str, _: &str, _: u32, _: Duration) -> Result<Try> {
            Err(CoordError::Unsupported("no".into()))
        }
        async fn changed(&self, _: Kind, _: &str, _: u64, until: Instant) -> Result<()> {
            tokio::time::sleep_until(until).await;
            Ok(())
        }
        async fn renew(&self, _: Kind, _: &str, _: &str, _: Duration) -> Result<Outcome> {
            Ok(Outcome::Gone)
        }
        async fn release(&self, _: Kind, _: &str, token: &str) -> Result<Outcome> {
            let mut held = self.0.lock().unwrap();
            if held.as_deref() == Some(token) {
                *held = None;
                return Ok(Outcome::Ok(None));
            }
            Ok(Outcome::Gone)
        }
        async fn claim(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Claim> {
            Err(CoordError::Unsupported("no".into()))
        }
        async fn complete(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Outcome> {
            Err(CoordError::Unsupported("no".into()))
        }
    }

    fn service(cap: usize) -> Arc<Service> {
        Arc::new(
            Service::new(Box::new(OneLock::default()), None, "me".into()).with_max_waiters(cap),
        )
    }

    fn token(t: Try) -> String {
        match t {
            Try::Acquired(g) => g.token,
            other => panic!("not granted: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_beyond_the_cap_are_refused_and_those_within_it_are_served() {
        let s = service(2);
        let ttl = Duration::from_secs(30);
        let wait = Duration::from_secs(60);
        let mut holder = token(s.lock("l", "me", ttl, Duration::ZERO, false).await.unwrap());
        let mut waiters = Vec::new();
        for _ in 0..2 {
            let s = s.clone();
            waiters.push(tokio::spawn(async move {
                s.lock("l", "w", ttl, wait, false).await
            }));
        }
        while s.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        // The third waiter is refused at once, with the cap in the message.
        match s.lock("l", "w3", ttl, wait, false).await {
            Err(e @ CoordError::TooManyWaiters { cap: 2, .. }) => {
                assert!(e.to_string().contains("cap is 2"), "{e}")
            }
            other => panic!("expected TooManyWaiters, got {other:?}"),
        }
        // Liveness twin: both waiters within the cap are granted, one per
        // release, woken by the release itself (the backend never reports).
        let started = Instant::now();
        for _ in 0..2 {
            assert_eq!(
                s.release(Kind::Lock, "l", &holder).await.unwrap(),
                Outcome::Ok(None)
            );
            let mut next = None;
            while next.is_none() {
                tokio::task::yield_now().await;
                for w in waiters.iter_mut() {
                    if w.is_finished() {
                        next = Some(token(w.await.unwrap().unwrap()));
                        break;
                    }
                }
                waiters.retain(|w| !w.is_finished());
            }
            holder = next.unwrap();
        }
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a waiter slept instead of being woken"
        );
        assert_eq!(s.waiting(), 0);
        // A repeated release says so.
        s.release(Kind::Lock, "l", &holder).await.unwrap();
        assert_eq!(
            s.release(Kind::Lock, "l", &holder).await.unwrap(),
            Outcome::AlreadyReleased
        );
    }

    #[test]
    fn owners_with_control_characters_are_refused() {
        assert!(check_owner("worker-1").is_ok());
        for bad in ["", "a|b", "a\nb", "a\u{7f}b", &"x".repeat(254)] {
            assert!(check_owner(bad).is_err(), "{bad:?}");
        }
    }
}
