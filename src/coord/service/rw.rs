//! The service's read-write locks: a writer that may wait sends a
//! [`WriteIntent`] with every attempt; the backend records it when no other
//! writer's is live, and from then on new readers are refused until the
//! writer is granted (its intent goes with the grant), gives up at its
//! `wait` deadline (removed here), or the intent's TTL (the wait left plus
//! one second) ends. Local wake-ups of a read-write lock are filed under
//! its own [`Kind::RwLock`](crate::backend::coordination::Kind::RwLock), so
//! they never meet a lock's of the same name.

use std::time::Duration;

use tokio::time::Instant;

use super::Service;
use crate::backend::coordination::{
    Acquire, Object, Result, RwMode, Try, WriteIntent, random_token,
};

/// Added to the wait left for a writer intent's TTL.
const INTENT_SLACK: Duration = Duration::from_secs(1);

impl Service {
    /// Take read-write lock `name` in `mode`, waiting up to `wait`; a writer
    /// that waits keeps new readers out meanwhile (see the module docs).
    pub(super) async fn rwlock_in(
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
                let what = Acquire::RwLock {
                    name,
                    mode,
                    intent: intent.as_ref(),
                };
                self.coord.acquire(what, owner, ttl).await
            }
        };
        let object = Object::RwLock(name);
        let r = self.with_wait(object, wait, attempt).await;
        if let Some(id) = &intent_id
            && !matches!(r, Ok(Try::Acquired(_)))
        {
            // Gave up: let the readers in now rather than at the intent's
            // TTL; if this fails, the TTL ends it.
            if let Err(e) = self.coord.give_up(name, id).await {
                tracing::debug!(error = %e, name, "removing a writer intent failed");
            }
            self.wake(object);
        }
        r
    }
}
