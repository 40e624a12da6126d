//! The coordination service over one [`Coordinator`]: waiting (`wait=`),
//! the cap on waiters, metrics, and the grants made through this sidecar.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    Acquire, CoordError, CoordMetrics, Coordinator, Grant, Kind, Object, Outcome, Result, Try,
};

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

    /// The longest [`Service::close`] waits: the backend's call deadline,
    /// else 2 s.
    pub fn close_limit(&self) -> Duration {
        self.coord.deadline().unwrap_or(Duration::from_secs(2))
    }

    /// Backend name.
    pub fn backend(&self) -> &'static str {
        self.coord.backend()
    }

    /// Wait for the work the backend runs off the answer path (etcd: the
    /// lease revokes after releases), at most one call deadline. For the
    /// app's shutdown, after the HTTP server stopped taking requests.
    pub async fn close(&self) {
        self.coord.close().await;
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
    /// the waiter sleeps until the backend reports a change of `object`
    /// ([`Coordinator::changed`]) or a release through this sidecar wakes it
    /// ([`Service::wake`]). Counted in metrics under the object's name.
    async fn with_wait<F, Fut>(
        &self,
        object: Object<'_>,
        wait: Duration,
        mut attempt: F,
    ) -> Result<Try>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Try>>,
    {
        let name = object.name();
        let started = Instant::now();
        let deadline = started + wait;
        let mut waiter: Option<Waiting<'_>> = None;
        loop {
            let wake = self.wakeup(object);
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let busy = match through_hold_off(&mut attempt, deadline).await {
                Ok(Try::Acquired(g)) => {
                    self.note(name, "acquired", started, Some(&g));
                    return Ok(Try::Acquired(g));
                }
                Ok(busy) => busy,
                Err(e) => {
                    self.note(name, "error", started, None);
                    return Err(e);
                }
            };
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
                r = self.coord.changed(object, seen, deadline) => {
                    if let Err(e) = r {
                        // A broken watch is no reason to fail the
                        // request: fall back to a short sleep.
                        tracing::debug!(error = %e, name, "waiting for a change failed");
                        super::nap(deadline).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Run `request` within one budget: its `wait` plus one call deadline
    /// from now, where the coordinator keeps one ([`Coordinator::deadline`]).
    async fn budgeted<F: std::future::Future>(&self, wait: Duration, request: F) -> F::Output {
        match self.coord.deadline() {
            Some(d) => crate::budget::within(Instant::now() + wait + d, request).await,
            None => request.await,
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

    /// The local wake-up of waiters on `object` (released through this
    /// sidecar).
    fn wakeup(&self, object: Object<'_>) -> Arc<Notify> {
        let mut w = self.wakeups.lock().unwrap_or_else(|e| e.into_inner());
        if w.len() > 10_000 {
            // Drop entries nobody waits on (only the map holds them).
            w.retain(|_, n| Arc::strong_count(n) > 1);
        }
        w.entry((object.kind(), object.name().to_owned()))
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    /// Wake the local waiters on `object` after a release: one for a lock or
    /// a semaphore (one release frees one lock or permit; a woken waiter
    /// always retries, so the wake-up is never lost), all for a read-write
    /// lock (a writer's release may let every waiting reader in).
    fn wake(&self, object: Object<'_>) {
        let woken = self
            .wakeups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(object.kind(), object.name().to_owned()))
            .cloned();
        match (woken, object.kind()) {
            (Some(n), Kind::RwLock) => n.notify_waiters(),
            (Some(n), _) => n.notify_one(),
            (None, _) => {}
        }
    }

    /// Requests waiting right now (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Whether `what`, asked with `wait`, goes through the backend's queue
    /// (a fair lock, or a plain lock that may wait on a backend that
    /// queues, etcd): such a request answers its first backend error
    /// ([`Service::queued`]), so its 503 says it was tried once.
    pub fn is_queued(&self, what: &Acquire<'_>, wait: Duration) -> bool {
        self.queued_name(what, wait).is_some()
    }

    /// The lock name of `what` when it goes through the queue
    /// ([`Service::is_queued`]).
    fn queued_name<'a>(&self, what: &Acquire<'a>, wait: Duration) -> Option<&'a str> {
        match *what {
            Acquire::FairLock { name, .. } => Some(name),
            Acquire::Lock(name) if !wait.is_zero() && self.coord.queues() => Some(name),
            _ => None,
        }
    }

    /// Acquire `what` for `ttl`, labelled `owner`, waiting up to `wait`:
    /// a lock in arrival order where the backend queues, a read-write lock's
    /// writer keeping new readers out while it waits (the service makes its
    /// intent: one given in `what` is not used); a job claim never waits.
    ///
    /// # Errors
    /// [`CoordError`] from the backend, `Unsupported` for what it does not
    /// serve (fair locks on Redis).
    pub async fn acquire(
        &self,
        what: Acquire<'_>,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try> {
        // A plain request that may wait joins the queue where the backend
        // has one (etcd) at once: joining takes the lock when nobody holds
        // it and nobody queues (exactly a plain try), in fewer round trips
        // than a try first; one name is one lock, and each release wakes one
        // waiter.
        if let Some(name) = self.queued_name(&what, wait) {
            return self
                .budgeted(wait, self.queued(name, owner, ttl, wait))
                .await;
        }
        match what {
            // A fair lock is always queued (above).
            Acquire::Lock(_) | Acquire::FairLock { .. } | Acquire::Semaphore { .. } => {
                let attempt = || self.coord.acquire(what, owner, ttl);
                self.budgeted(wait, self.with_wait(what.object(), wait, attempt))
                    .await
            }
            Acquire::RwLock { name, mode, .. } => {
                self.budgeted(wait, self.rwlock_in(name, owner, mode, ttl, wait))
                    .await
            }
            Acquire::Job { .. } => {
                let started = Instant::now();
                let r = self
                    .budgeted(Duration::ZERO, self.coord.acquire(what, owner, ttl))
                    .await;
                self.noted(what.object().name(), started, &r);
                r
            }
        }
    }

    /// Fair lock `name` through the backend's queue, where it waits up to
    /// `wait`. A transient error is the answer, within the wait or not:
    /// the attempt's queue entry is bound to a lease that the outage may
    /// have kept the sidecar from revoking, so a retry would queue behind
    /// its own entry until that lease's TTL (seen with etcd restarted under
    /// a waiter: granted never, 409 naming the waiter itself after its
    /// whole wait). The client retries, as the 503 says.
    async fn queued(&self, name: &str, owner: &str, ttl: Duration, wait: Duration) -> Result<Try> {
        let started = Instant::now();
        let _waiting = if wait.is_zero() {
            None
        } else {
            Some(self.enter_wait()?)
        };
        let r = self
            .coord
            .acquire(Acquire::FairLock { name, wait }, owner, ttl)
            .await;
        self.noted(name, started, &r);
        r
    }

    /// Count the answer `r` to a request that started at `started`.
    fn noted(&self, name: &str, started: Instant, r: &Result<Try>) {
        match r {
            Ok(Try::Acquired(g)) => self.note(name, "acquired", started, Some(g)),
            Ok(_) => self.note(name, "busy", started, None),
            Err(_) => self.note(name, "error", started, None),
        }
    }

    /// Renew the hold `token` has on `object`.
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn renew(&self, object: Object<'_>, token: &str, ttl: Duration) -> Result<Outcome> {
        let r = self
            .budgeted(Duration::ZERO, self.coord.renew(object, token, ttl))
            .await?;
        match r {
            Outcome::Ok(Some(t)) => self.extend(token, t),
            Outcome::Ok(None) => self.extend(token, ttl),
            Outcome::Gone | Outcome::NotYours | Outcome::AlreadyReleased => self.forget(token),
        }
        Ok(r)
    }

    /// Give `object` back if `token` holds it, unless it was released
    /// through this sidecar already; once released, wake the local waiters
    /// and remember the token (a repeated DELETE answers "already released").
    ///
    /// # Errors
    /// [`CoordError`] from the backend.
    pub async fn release(&self, object: Object<'_>, token: &str) -> Result<Outcome> {
        if self
            .released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(token)
        {
            return Ok(Outcome::AlreadyReleased);
        }
        let r = self
            .budgeted(Duration::ZERO, self.coord.release(object, token))
            .await?;
        if r == Outcome::Ok(None) {
            self.wake(object);
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
        let complete = self.coord.complete(queue, job, token, retention);
        let r = self.budgeted(Duration::ZERO, complete).await?;
        if matches!(r, Outcome::Ok(_) | Outcome::Gone) {
            self.forget(token);
        }
        Ok(r)
    }
}

mod rw;

/// First pause after a transient backend error while a request may wait.
const ERROR_RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between attempts after transient backend errors.
const ERROR_RETRY_MAX: Duration = Duration::from_secs(1);

/// One attempt, repeated through what passes within the request's `wait`
/// (its budget): the rule of every request that waits (a lock, a
/// semaphore permit, a read-write lock; a job claim never waits, and a
/// queued fair lock answers its first error: see `Service::queued`).
/// A promotion hold-off ([`CoordError::HoldOff`]) that ends
/// before `deadline` is slept out, and a transient backend error (a broken
/// connection, a primary killed before its Sentinels name another) is
/// retried after a pause from 50 ms doubling to 1 s while the next attempt
/// starts before `deadline`. Anything else, and a wait that would outlast
/// `deadline`, is the answer; without a `wait` the first answer is.
async fn through_hold_off<F, Fut>(attempt: &mut F, deadline: Instant) -> Result<Try>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Try>>,
{
    let mut pause = ERROR_RETRY_FIRST;
    loop {
        match attempt().await {
            Err(CoordError::HoldOff { retry_after }) if Instant::now() + retry_after < deadline => {
                tokio::time::sleep(retry_after).await;
            }
            Err(CoordError::Backend(e))
                if e.is_retryable() && Instant::now() + pause < deadline =>
            {
                tracing::debug!(error = %e.report(), "a waiting request retries after a backend error");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(ERROR_RETRY_MAX);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests;
