//! The service's read-write locks and the renewal and give-back of job
//! claims.
//!
//! A writer that may wait sends a [`WriteIntent`] with every attempt; the
//! backend records it when no other writer's is live, and from then on new
//! readers are refused until the writer is granted (its intent goes with the
//! grant), gives up at its `wait` deadline (removed here), or the intent's
//! TTL (the wait left plus one second) ends. Local wake-ups of a read-write
//! lock are filed under `(Kind::Lock, "rw/<name>")`: names hold no `/`, so
//! they never meet a lock's.

use std::time::Duration;

use tokio::time::Instant;

use super::Service;
use crate::backend::coordination::{Kind, Outcome, Result, RwMode, Try, WriteIntent, random_token};

/// Added to the wait left for a writer intent's TTL.
const INTENT_SLACK: Duration = Duration::from_secs(1);

/// The key of the local wake-ups of read-write lock `name`.
fn rw_wake(name: &str) -> String {
    format!("rw/{name}")
}

impl Service {
    /// Take read-write lock `name` in `mode`, waiting up to `wait`; a writer
    /// that waits keeps new readers out meanwhile (see the module docs).
    ///
    /// # Errors
    /// [`super::CoordError`] from the backend, `Unsupported` where it serves
    /// no read-write locks.
    pub async fn rwlock(
        &self,
        name: &str,
        owner: &str,
        mode: RwMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try> {
        self.budgeted(wait, self.rwlock_in(name, owner, mode, ttl, wait))
            .await
    }

    async fn rwlock_in(
        &self,
        name: &str,
        owner: &str,
        mode: RwMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try> {
        let deadline = Instant::now() + wait;
        let intent_id = (mode == RwMode::Write && !wait.is_zero()).then(|| random_token(""));
        let attempt = || {
            let intent = intent_id.as_ref().map(|id| WriteIntent {
                id: id.clone(),
                ttl: deadline.saturating_duration_since(Instant::now()) + INTENT_SLACK,
            });
            async move {
                self.coord
                    .rwlock(name, owner, mode, ttl, intent.as_ref())
                    .await
            }
        };
        let changed = |_seen, until| self.coord.rw_changed(name, until);
        let wake = rw_wake(name);
        let r = self
            .wait_on((Kind::Lock, &wake), name, wait, attempt, changed)
            .await;
        if let Some(id) = &intent_id
            && !matches!(r, Ok(Try::Acquired(_)))
        {
            // Gave up: let the readers in now rather than at the intent's
            // TTL; if this fails, the TTL ends it.
            if let Err(e) = self.coord.rw_give_up(name, id).await {
                tracing::debug!(error = %e, name, "removing a writer intent failed");
            }
            self.wake_all(&wake);
        }
        r
    }

    /// Renew a reader's or writer's hold of read-write lock `name`.
    ///
    /// # Errors
    /// [`super::CoordError`] from the backend.
    pub async fn rw_renew(&self, name: &str, token: &str, ttl: Duration) -> Result<Outcome> {
        self.renew_by(token, ttl, self.coord.rw_renew(name, token, ttl))
            .await
    }

    /// Release a reader's or writer's hold of read-write lock `name`.
    ///
    /// # Errors
    /// [`super::CoordError`] from the backend.
    pub async fn rw_release(&self, name: &str, token: &str) -> Result<Outcome> {
        let release = || self.coord.rw_release(name, token);
        // A writer's release may let every waiting reader in: wake them all.
        self.release_by(token, release, || self.wake_all(&rw_wake(name)))
            .await
    }

    /// Renew the claim `token` holds on job `job` of `queue`.
    ///
    /// # Errors
    /// [`super::CoordError`] from the backend.
    pub async fn job_renew(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Outcome> {
        let renew = self.coord.job_renew(queue, job, token, ttl);
        self.renew_by(token, ttl, renew).await
    }

    /// Give back the claim `token` holds on job `job` of `queue`.
    ///
    /// # Errors
    /// [`super::CoordError`] from the backend.
    pub async fn job_release(&self, queue: &str, job: &str, token: &str) -> Result<Outcome> {
        let release = || self.coord.job_release(queue, job, token);
        self.release_by(token, release, || {}).await
    }

    /// Wake every local waiter filed under `(Kind::Lock, key)`.
    fn wake_all(&self, key: &str) {
        if let Some(n) = self.woken(Kind::Lock, key) {
            n.notify_waiters();
        }
    }
}
