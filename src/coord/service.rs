//! The coordination service over one [`Coordinator`]: waiting (`wait=`),
//! the cap on waiters, metrics, and the grants made through this sidecar.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Claim, CoordError, CoordMetrics, Coordinator, Grant, Kind, Outcome, Result, Try};

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
    /// the waiter sleeps until the backend reports a change of `name`
    /// ([`Coordinator::changed`]) or a release through this sidecar wakes it.
    async fn with_wait<F, Fut>(
        &self,
        kind: Kind,
        name: &str,
        wait: Duration,
        attempt: F,
    ) -> Result<Try>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Try>>,
    {
        let changed = |seen, deadline| self.coord.changed(kind, name, seen, deadline);
        self.wait_on((kind, name), name, wait, attempt, changed)
            .await
    }

    /// [`Service::with_wait`] for any object: woken by the local releases
    /// filed under `wake` ([`Service::wake`]) or by `changed(seen, until)`,
    /// counted in metrics under `name`.
    async fn wait_on<F, Fut, C, CFut>(
        &self,
        wake: (Kind, &str),
        name: &str,
        wait: Duration,
        mut attempt: F,
        changed: C,
    ) -> Result<Try>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Try>>,
        C: Fn(u64, Instant) -> CFut,
        CFut: std::future::Future<Output = Result<()>>,
    {
        let started = Instant::now();
        let deadline = started + wait;
        let mut waiter: Option<Waiting<'_>> = None;
        loop {
            let wake = self.wakeup(wake.0, wake.1);
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
                r = changed(seen, deadline) => {
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
        if let Some(n) = self.woken(kind, name) {
            // One release frees one lock or permit: wake one waiter (it
            // always retries once woken, so the wake-up is never lost).
            n.notify_one();
        }
    }

    /// The wake-up of waiters on `name`, if anyone made one.
    fn woken(&self, kind: Kind, name: &str) -> Option<Arc<Notify>> {
        self.wakeups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(kind, name.to_owned()))
            .cloned()
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
        self.budgeted(wait, self.lock_in(name, owner, ttl, wait, queue))
            .await
    }

    /// [`Service::lock`] within its budget; `queue`: through the backend's
    /// queue.
    async fn lock_in(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
        queue: bool,
    ) -> Result<Try> {
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
        let request = self.with_wait(Kind::Semaphore, name, wait, || {
            self.coord.semaphore(name, owner, permits, ttl)
        });
        self.budgeted(wait, request).await
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
        self.renew_by(token, ttl, self.coord.renew(kind, name, token, ttl))
            .await
    }

    /// Run the renewal `renew` of `token` within its budget and keep the
    /// grants of this sidecar up to date with its answer.
    async fn renew_by(
        &self,
        token: &str,
        ttl: Duration,
        renew: impl std::future::Future<Output = Result<Outcome>>,
    ) -> Result<Outcome> {
        let r = self.budgeted(Duration::ZERO, renew).await?;
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
        let release = || self.coord.release(kind, name, token);
        self.release_by(token, release, || self.wake(kind, name))
            .await
    }

    /// Run `release` of `token` within its budget unless it was released
    /// through this sidecar already; once released, `wake` the local waiters
    /// and remember the token (a repeated DELETE answers "already released").
    async fn release_by<Fut>(
        &self,
        token: &str,
        release: impl FnOnce() -> Fut,
        wake: impl FnOnce(),
    ) -> Result<Outcome>
    where
        Fut: std::future::Future<Output = Result<Outcome>>,
    {
        if self
            .released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(token)
        {
            return Ok(Outcome::AlreadyReleased);
        }
        let r = self.budgeted(Duration::ZERO, release()).await?;
        if r == Outcome::Ok(None) {
            wake();
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
        let r = self
            .budgeted(Duration::ZERO, self.coord.claim(queue, job, owner, ttl))
            .await;
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
        let complete = self.coord.complete(queue, job, token, retention);
        let r = self.budgeted(Duration::ZERO, complete).await?;
        if matches!(r, Outcome::Ok(_) | Outcome::Gone) {
            self.forget(token);
        }
        Ok(r)
    }
}

#[path = "service_rw.rs"]
mod rw;

/// One attempt; while the backend answers a promotion hold-off
/// ([`CoordError::HoldOff`]) that ends before `deadline`, again once it
/// ended. A request that may not wait that long gets the hold-off.
async fn through_hold_off<F, Fut>(attempt: &mut F, deadline: Instant) -> Result<Try>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Try>>,
{
    loop {
        match attempt().await {
            Err(CoordError::HoldOff { retry_after }) if Instant::now() + retry_after < deadline => {
                tokio::time::sleep(retry_after).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
