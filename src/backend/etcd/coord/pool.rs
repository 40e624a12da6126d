//! Leases of released locks, kept for the next waiter of this sidecar.
//!
//! Granting a lease per acquisition and revoking it per release would be
//! two of the four Raft writes (each with its own fsync) of a lock's cycle,
//! and in a busy queue the release that hands the lock on waits behind
//! them. A lock's lease holds nothing once its key is deleted, so a release
//! keeps the lease here instead, and the next waiter with the same TTL
//! refreshes it with one keep-alive (no Raft write) instead of a grant.
//!
//! Why this is safe: the lease's old key is gone, and every verb of the old
//! token names that key (renew and release read or delete the key first),
//! so the old token can no longer touch the lease; at worst a renewal of the
//! old token that was in flight refreshes the lease once more, which only
//! lengthens the new term's lease. The new holder's lease is refreshed
//! after its request arrived and before it is answered, so it lasts at least
//! the TTL it is told, as a fresh grant would.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;

use super::EtcdCoord;
use crate::backend::coordination::{CoordError, Result, Token, TokenKind, Try};
use crate::backend::etcd::store::{Lease, revision_of, ttl_secs};

/// Most leases kept per TTL; the rest are revoked.
const KEEP: usize = 256;
/// Most leases whose TTL is remembered; beyond it the oldest half is
/// forgotten (their releases then revoke them, as without a pool).
const REMEMBER: usize = 16_384;

/// The pool of one coordinator.
#[derive(Default)]
pub(super) struct Pool(Mutex<Inner>);

/// A lease that holds a lock key now.
struct Held {
    asked: Duration,
    granted: Duration,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    /// Leases granted or reused for a lock key still held: the TTL asked
    /// for, the TTL etcd granted, and when we learned them.
    held: HashMap<i64, Held>,
    /// Released leases by the TTL asked for: the lease, its granted TTL and
    /// the instant of its last refresh that we know of (at the latest, the
    /// release).
    free: HashMap<Duration, Vec<(i64, Duration, Instant)>>,
}

impl Pool {
    /// Note that `lease`, asked for with TTL `asked` and granted `granted`,
    /// now holds a lock key.
    pub(super) fn holding(&self, lease: i64, asked: Duration, granted: Duration) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if inner.held.len() >= REMEMBER {
            let mut at: Vec<Instant> = inner.held.values().map(|h| h.at).collect();
            at.sort_unstable();
            let cut = at[at.len() / 2];
            inner.held.retain(|_, h| h.at > cut);
        }
        let at = Instant::now();
        inner.held.insert(lease, Held { asked, granted, at });
    }

    /// `lease`'s key was deleted: keep the lease for a later waiter. `false`
    /// when it is not kept (unknown TTL, or enough kept): revoke it then.
    pub(super) fn released(&self, lease: i64) -> bool {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = inner.held.remove(&lease) else {
            return false;
        };
        let free = inner.free.entry(held.asked).or_default();
        if free.len() >= KEEP {
            return false;
        }
        free.push((lease, held.granted, Instant::now()));
        true
    }

    /// Keep `lease` again after an acquisition that did not use it (the
    /// lock was held), refreshed just now to `granted`.
    pub(super) fn put_back(&self, lease: i64, asked: Duration, granted: Duration) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let free = inner.free.entry(asked).or_default();
        if free.len() < KEEP {
            free.push((lease, granted, Instant::now()));
        }
    }

    /// A kept lease asked for with TTL `asked`, and its granted TTL, that
    /// had its last refresh less than half that TTL ago (so it is certainly
    /// alive when the caller refreshes it).
    pub(super) fn take(&self, asked: Duration) -> Option<(i64, Duration)> {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let free = inner.free.get_mut(&asked)?;
        // Newest last: drop the stale ones from the front (they expire by
        // themselves) and take the newest.
        let stale = free.partition_point(|(_, granted, at)| at.elapsed() >= *granted / 2);
        free.drain(..stale);
        free.pop().map(|(lease, granted, _)| (lease, granted))
    }
}

impl EtcdCoord {
    /// A lease of `ttl` for a lock's key: one a release kept ([`Pool`]),
    /// refreshed by one keep-alive, or else a fresh grant.
    ///
    /// # Errors
    /// As [`EtcdStore::grant`].
    pub(super) async fn lock_lease(&self, client: &mut Client, ttl: Duration) -> Result<Lease> {
        if let Some((id, ttl)) = self.pool.take(asked(ttl)) {
            // Opening the keep-alive stream refreshes the lease once and
            // fails when etcd says it is gone.
            let mut leases = client.lease_client();
            if self
                .call("lease keep-alive", leases.keep_alive(id))
                .await
                .is_ok()
            {
                return Ok(Lease { id, ttl });
            }
        }
        Ok(self.store.grant(client, ttl, self.limit()).await?)
    }

    /// A plain lock under a kept lease in one round trip: its
    /// compare-and-put and the lease's keep-alive sent together (both after
    /// the request arrived, so the lease lasts at least the TTL the answer
    /// gives, as a fresh grant would). `None` when no lease of this TTL is
    /// kept, or the kept one has expired (etcd: "requested lease not found";
    /// the caller then grants one). A held lock puts the lease back. A key
    /// written whose lease's refresh failed is given up (revoked: the key
    /// goes with it) and the error returned, never a grant shorter than
    /// told.
    ///
    /// # Errors
    /// The transaction's or the keep-alive's classified error.
    pub(super) async fn lock_pooled(
        &self,
        client: &Client,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Try>> {
        let Some((id, granted)) = self.pool.take(asked(ttl)) else {
            return Ok(None);
        };
        let token = Token::new(TokenKind::Lock, id);
        let txn = self.lock_txn(name, owner, &token);
        let mut kv = client.clone();
        let put = self.call("txn", async move {
            match kv.txn(txn).await {
                Err(etcd_client::Error::GRpcStatus(s))
                    if s.code() == tonic::Code::NotFound
                        && s.message().contains("lease not found") =>
                {
                    Ok(None)
                }
                other => other.map(Some),
            }
        });
        let (alive, put) = tokio::join!(self.keep_alive_once(client, id), put);
        let resp = match put {
            Ok(Some(resp)) => resp,
            Ok(None) => return Ok(None),
            Err(e) => {
                // Unanswered: the put may still apply; revoking removes it.
                self.revoke_later(client.clone(), id);
                return Err(e);
            }
        };
        let left = match alive {
            Ok(left) if left > 0 => Duration::from_secs(left as u64).min(granted),
            other => {
                self.revoke_later(client.clone(), id);
                if !resp.succeeded() {
                    return Ok(Some(Try::Held(super::held_by(&resp))));
                }
                return Err(other.err().unwrap_or_else(|| {
                    CoordError::Backend(crate::backend::BackendError::WatchEnded {
                        backend: crate::backend::etcd::store::BACKEND,
                        reason: "the lock's lease expired while it was taken".into(),
                    })
                }));
            }
        };
        if !resp.succeeded() {
            self.pool.put_back(id, asked(ttl), left);
            return Ok(Some(Try::Held(super::held_by(&resp))));
        }
        self.pool.holding(id, asked(ttl), left);
        let rev = revision_of(resp.header());
        Ok(Some(Try::Acquired(super::grant(name, &token, rev, left))))
    }

    /// Note that `lease`, asked with `ttl`, holds a lock now, so that its
    /// release keeps it for the next acquisition.
    pub(super) fn holding(&self, lease: Lease, ttl: Duration) {
        self.pool.holding(lease.id, asked(ttl), lease.ttl);
    }
}

/// The TTL a caller asked for, as etcd is asked for it (the pool's key).
fn asked(ttl: Duration) -> Duration {
    Duration::from_secs(ttl_secs(ttl) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_serves_the_next_waiter_of_its_ttl_while_fresh() {
        let pool = Pool::default();
        let ttl = Duration::from_secs(10);
        assert_eq!(pool.take(ttl), None, "nothing released yet");
        assert!(!pool.released(7), "a lease we never noted is revoked");
        pool.holding(7, ttl, ttl);
        assert!(pool.released(7));
        assert_eq!(pool.take(Duration::from_secs(5)), None, "other TTL");
        assert_eq!(pool.take(ttl), Some((7, ttl)));
        assert_eq!(pool.take(ttl), None, "taken once");
        pool.holding(8, ttl, ttl);
        assert!(pool.released(8));
        // Half its TTL after the release it is no longer handed out.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(pool.take(ttl), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pool_keeps_at_most_its_cap() {
        let pool = Pool::default();
        let ttl = Duration::from_secs(2);
        for lease in 0..(KEEP as i64 + 10) {
            pool.holding(lease, ttl, ttl);
        }
        let kept = (0..(KEEP as i64 + 10))
            .filter(|l| pool.released(*l))
            .count();
        assert_eq!(kept, KEEP);
    }
}
