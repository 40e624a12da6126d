//! Leases of released locks, kept for the next waiter of this sidecar.
//!
//! Granting a lease per acquisition and revoking it per release would be
//! two of the four Raft writes (each with its own fsync) of a lock's cycle,
//! and in a busy queue the release that hands the lock on waits behind
//! them. A lock's lease holds nothing once its key is deleted, so a release
//! keeps the lease here instead, and the next waiter with the same TTL
//! takes it instead of a grant. A plain lock takes it as it is while at
//! least [`REUSE_UNREFRESHED`] of the asked TTL remains since the lease's
//! last refresh (or grant) was sent, and the answer's TTL says what
//! remains; an older one is refreshed with one keep-alive (no Raft write)
//! sent with the transaction (a lease found gone then fails the
//! transaction, and the lock is granted a fresh lease). The other
//! primitives bind their keys in later calls, so they refresh a kept lease
//! first.
//!
//! Why this is safe: the lease's old key is gone, and every verb of the old
//! token names that key (renew and release read or delete the key first),
//! so the old token can no longer touch the lease; at worst a renewal of the
//! old token that was in flight refreshes the lease once more, which only
//! lengthens the new term's lease. The TTL the new holder is told is
//! counted from its request's arrival: either what remains of the lease,
//! counted from the send instant of its last refresh that we know of (etcd
//! handled it later, so the lease lasts at least that), or, after a
//! refresh sent after the request arrived, the granted TTL, as a fresh
//! grant would give.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;

use super::EtcdCoord;
use crate::backend::coordination::{Result, Token, TokenKind, Try};
use crate::backend::etcd::store::{Lease, revision_of, ttl_secs};

/// Most leases kept per TTL; the rest are revoked.
const KEEP: usize = 256;
/// The share of the asked TTL that must remain for a kept lease to be
/// taken without a refresh (90 %).
const REUSE_UNREFRESHED: (u32, u32) = (9, 10);
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
    /// The send instant of its last grant or refresh that we know of: it
    /// lasts at least `granted` from here.
    at: Instant,
}

/// A kept lease taken for an acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Kept {
    /// The lease id.
    pub(super) id: i64,
    /// The TTL etcd granted it.
    pub(super) granted: Duration,
    /// The send instant of its last grant or refresh that we know of.
    pub(super) at: Instant,
}

impl Kept {
    /// What remains of the lease at `now`, counted from [`Kept::at`].
    pub(super) fn left(&self, now: Instant) -> Duration {
        self.granted
            .saturating_sub(now.saturating_duration_since(self.at))
    }

    /// Whether enough of the asked TTL `asked` remains at `now` to take the
    /// lease without a refresh ([`REUSE_UNREFRESHED`]).
    pub(super) fn fresh(&self, asked: Duration, now: Instant) -> bool {
        let (num, den) = REUSE_UNREFRESHED;
        self.left(now) >= asked * num / den
    }
}

#[derive(Default)]
struct Inner {
    /// Leases granted or reused for a lock key still held: the TTL asked
    /// for, the TTL etcd granted, and when we learned them.
    held: HashMap<i64, Held>,
    /// Released leases by the TTL asked for, oldest refresh first.
    free: HashMap<Duration, Vec<Kept>>,
}

impl Pool {
    /// Note that `lease`, asked for with TTL `asked` and granted `granted`
    /// by a grant or refresh sent at `at`, now holds a lock key.
    pub(super) fn holding(&self, lease: i64, asked: Duration, granted: Duration, at: Instant) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if inner.held.len() >= REMEMBER {
            let mut at: Vec<Instant> = inner.held.values().map(|h| h.at).collect();
            at.sort_unstable();
            let cut = at[at.len() / 2];
            inner.held.retain(|_, h| h.at > cut);
        }
        inner.held.insert(lease, Held { asked, granted, at });
    }

    /// A refresh of the held `lease` (a renewal) was sent at `at` and
    /// answered: it lasts its granted TTL from there.
    pub(super) fn refreshed(&self, lease: i64, at: Instant) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = inner.held.get_mut(&lease) {
            h.at = h.at.max(at);
        }
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
        let kept = Kept {
            id: lease,
            granted: held.granted,
            at: held.at,
        };
        let at = free.partition_point(|k| k.at <= kept.at);
        free.insert(at, kept);
        true
    }

    /// Keep `kept` again after an acquisition that did not use it (the
    /// lock was held).
    pub(super) fn put_back(&self, kept: Kept, asked: Duration) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let free = inner.free.entry(asked).or_default();
        if free.len() < KEEP {
            // Keep the order by refresh instant (newest last).
            let at = free.partition_point(|k| k.at <= kept.at);
            free.insert(at, kept);
        }
    }

    /// The kept lease asked for with TTL `asked` refreshed last, if less
    /// than half its granted TTL ago (so it is certainly alive).
    pub(super) fn take(&self, asked: Duration) -> Option<Kept> {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let free = inner.free.get_mut(&asked)?;
        // Drop the stale ones from the front (they expire by themselves)
        // and take the newest.
        let stale = free.partition_point(|k| k.at.elapsed() >= k.granted / 2);
        free.drain(..stale);
        free.pop()
    }
}

impl EtcdCoord {
    /// A lease of `ttl` for a lock's key, and the send instant its TTL
    /// counts from: one a release kept ([`Pool`]), refreshed by one
    /// keep-alive (these callers bind a key to it in later calls, so a kept
    /// lease revoked by someone else must be found out first), or else a
    /// fresh grant.
    ///
    /// # Errors
    /// As [`EtcdStore::grant`].
    pub(super) async fn lock_lease(
        &self,
        client: &mut Client,
        ttl: Duration,
    ) -> Result<(Lease, Instant)> {
        let sent = Instant::now();
        if let Some(kept) = self.pool.take(asked(ttl)) {
            // Opening the keep-alive stream refreshes the lease once (its
            // first request and answer) and fails when etcd says it is gone.
            if self.refresh(client, kept.id).await.is_ok() {
                let lease = Lease {
                    id: kept.id,
                    ttl: kept.granted,
                };
                return Ok((lease, sent));
            }
        }
        let sent = Instant::now();
        Ok((self.store.grant(client, ttl, self.limit()).await?, sent))
    }

    /// A plain lock under a kept lease in one round trip: its
    /// compare-and-put alone while the lease is fresh ([`Kept::fresh`]: the
    /// answer's TTL is what remains of it), else with the lease's keep-alive
    /// sent together (both after the request arrived, so the lease lasts at
    /// least the granted TTL the answer gives, as a fresh grant would).
    /// `None` when no lease of this TTL is kept, or the kept one has expired
    /// (etcd: "requested lease not found"; the caller then grants one). A
    /// held lock puts the lease back. A key written whose lease's refresh
    /// failed is given up (revoked: the key goes with it) and the error
    /// returned, never a grant shorter than told.
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
        let Some(kept) = self.pool.take(asked(ttl)) else {
            return Ok(None);
        };
        let sent = Instant::now();
        let fresh = kept.fresh(asked(ttl), sent);
        let id = kept.id;
        let token = Token::new(TokenKind::Lock, id);
        let put = self.txn_unless_gone(client, self.lock_txn(name, owner, &token));
        let refresh = async {
            if fresh {
                Ok(())
            } else {
                self.refresh(client, id).await
            }
        };
        let (alive, put) = tokio::join!(refresh, put);
        let resp = match put {
            Ok(Some(resp)) => resp,
            Ok(None) => return Ok(None),
            Err(e) => {
                // Unanswered: the put may still apply; revoking removes it.
                self.revoke_later(client.clone(), id);
                return Err(e);
            }
        };
        if let Err(e) = alive {
            self.revoke_later(client.clone(), id);
            if !resp.succeeded() {
                return Ok(Some(Try::Held(super::held_by(&resp))));
            }
            return Err(e);
        }
        // Unrefreshed: what remains since its last refresh; refreshed: its
        // granted TTL from this request's send instant.
        let kept = if fresh {
            kept
        } else {
            Kept { at: sent, ..kept }
        };
        if !resp.succeeded() {
            self.pool.put_back(kept, asked(ttl));
            return Ok(Some(Try::Held(super::held_by(&resp))));
        }
        self.pool.holding(id, asked(ttl), kept.granted, kept.at);
        let rev = revision_of(resp.header());
        let left = kept.left(sent);
        Ok(Some(Try::Acquired(super::grant(name, &token, rev, left))))
    }

    /// Run `txn`, binding a key to a kept lease: `None` when etcd says the
    /// lease is gone ("requested lease not found").
    async fn txn_unless_gone(
        &self,
        client: &Client,
        txn: etcd_client::Txn,
    ) -> Result<Option<etcd_client::TxnResponse>> {
        let mut kv = client.clone();
        self.call("txn", async move {
            match kv.txn(txn).await {
                Err(etcd_client::Error::GRpcStatus(s))
                    if s.code() == tonic::Code::NotFound
                        && s.message().contains("lease not found") =>
                {
                    Ok(None)
                }
                other => other.map(Some),
            }
        })
        .await
    }

    /// Refresh `lease` with one keep-alive: etcd-client's opening of the
    /// keep-alive stream sends one request and reads its answer, failing
    /// when the lease is gone (TTL 0); the lease then lasts its granted TTL
    /// from etcd's handling of it.
    ///
    /// # Errors
    /// The keep-alive's classified error (a gone lease included).
    async fn refresh(&self, client: &Client, lease: i64) -> Result<()> {
        let mut leases = client.lease_client();
        self.call("lease keep-alive", leases.keep_alive(lease))
            .await
            .map(|_| ())
    }

    /// Note that `lease`, asked with `ttl`, holds a lock now (its TTL
    /// counted from `at`), so that its release keeps it for the next
    /// acquisition.
    pub(super) fn holding(&self, lease: Lease, ttl: Duration, at: Instant) {
        self.pool.holding(lease.id, asked(ttl), lease.ttl, at);
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
        let at = Instant::now();
        pool.holding(7, ttl, ttl, at);
        assert!(pool.released(7));
        assert_eq!(pool.take(Duration::from_secs(5)), None, "other TTL");
        let kept = pool.take(ttl).expect("kept");
        assert_eq!((kept.id, kept.granted, kept.at), (7, ttl, at));
        assert_eq!(pool.take(ttl), None, "taken once");
        pool.holding(8, ttl, ttl, Instant::now());
        assert!(pool.released(8));
        // Half its TTL after its last refresh it is no longer handed out.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(pool.take(ttl), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_lease_is_taken_unrefreshed_while_90_percent_of_the_asked_ttl_remains() {
        let pool = Pool::default();
        let ttl = Duration::from_secs(10);
        let at = Instant::now();
        pool.holding(7, ttl, ttl, at);
        // A renewal sent later moves the instant its TTL counts from.
        tokio::time::advance(Duration::from_millis(300)).await;
        pool.refreshed(7, Instant::now());
        assert!(pool.released(7));
        let kept = pool.take(ttl).expect("kept");
        assert_eq!(kept.at, at + Duration::from_millis(300));
        let now = kept.at + Duration::from_millis(1000);
        assert!(kept.fresh(ttl, now), "9 s of 10 s remain");
        assert_eq!(kept.left(now), Duration::from_secs(9), "the answer's TTL");
        assert!(!kept.fresh(ttl, now + Duration::from_millis(1)));
        pool.put_back(kept, ttl);
        assert_eq!(pool.take(ttl), Some(kept), "put back as it was");
    }

    #[tokio::test(start_paused = true)]
    async fn the_pool_keeps_at_most_its_cap() {
        let pool = Pool::default();
        let ttl = Duration::from_secs(2);
        for lease in 0..(KEEP as i64 + 10) {
            pool.holding(lease, ttl, ttl, Instant::now());
        }
        let kept = (0..(KEEP as i64 + 10))
            .filter(|l| pool.released(*l))
            .count();
        assert_eq!(kept, KEEP);
    }
}
