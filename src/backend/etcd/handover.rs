//! The handover by one write: a graceful release elects the named successor
//! in the same transaction, so the successor needs no write of its own.
//!
//! Why: a release that deletes the key and lets the successor claim it costs
//! two Raft writes in a row (the release, then the claim), each waiting for
//! a WAL fsync; `etcdctl elect`'s successor is already queued under its own
//! key and is elected by the delete alone. Here the leader keeps a spare
//! lease for its successor (the **next lease**), granted at the start of
//! its term and refreshed after a renewal once less than half its TTL is
//! known to remain (a keep-alive, no Raft write; both off the campaign's
//! and the renewal's path). Its release transaction then, while the key is
//! still bound to the leader's lease, no pause is set and the successor
//! keeps its adopter mark (below), **puts the key naming the successor,
//! bound to the next lease**, and puts the release mark (the leader's
//! lease) in the same revision.
//!
//! The successor sees that put on the watch it already holds and **adopts**
//! the term with one round trip and no write: a keep-alive of the next lease
//! (its validity, counted from the campaign's start as for a claim) beside
//! one read-only transaction proving that the key is still that put (its
//! lease and `mod_revision`), that the release mark was written by the
//! same transaction (its `mod_revision` is the put's: the previous holder
//! released, the proof a claim requires; a hand put elects nobody), and
//! that its adopter mark is bound to its own record lease and older than
//! the put (of two processes with one identity, only the one whose mark
//! the leader saw adopts; a process restarted after the put waits for the
//! lease, as before). A process adopts a put once: after a term it adopted
//! ended with no release, its campaign follows that term (the Elector then
//! releases it as abandoned) rather than start a second term with the same
//! token under a lease a late-applied release of the first could delete.
//! A campaign whose claim finds the key naming it (its watch missed the
//! put: it was waiting) tries the same adoption. A successor whose TTL
//! differs from the next lease's (granted with the old leader's) does not
//! keep that lease: it swaps the key onto a lease of its own TTL in one
//! transaction ([`super::swap`]). Any failed check falls back to the claim. The other followers take the put as the new holder
//! without a transaction.
//!
//! **Adopter mark**: `<key>/adopters/<identity>`, written with the
//! candidate's record under the record's lease (one transaction). The
//! release puts the key only when the successor's mark exists (compared in
//! the same transaction); a successor of an older version writes none and
//! gets the old release (delete, mark, successor key) in that same write,
//! so a rolling upgrade never hands a term to a process that cannot take
//! it.
//!
//! Invariants:
//! - The fencing token of a term is the `mod_revision` of the write that
//!   began it (the claim's put, the release's put, or the taker's swap),
//!   and the key is
//!   written by nobody else during a term: a renewal that finds another
//!   `mod_revision` ends the term (a foreign write).
//! - Nobody revokes the next lease once a release may have bound the key to
//!   it: a release that etcd did not answer leaves it to expire by its TTL.
//!   An unused next lease holds no key and expires by itself.
//! - A named successor that is dead or does not campaign costs at most the
//!   next lease's TTL after the release: nobody starts a refresh of it after
//!   the release (one already sent may land just after it, and then counts
//!   from there), and the followers take over when etcd says it is gone
//!   (the mark names the old leader's lease, not the next lease).
//! - Off with failsafe (the roster is written by the term's own claim).
//!   On etcd the Elector always keeps the registry, so every leader keeps a
//!   next lease (granted at the start of its term, so that at rest a
//!   leader sends only keep-alives); a successor adopts only while it keeps
//!   its own record.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use super::store::{Lease, lease_hex, revision_of, ttl_secs};
use super::{EtcdBackend, KeepAlive};
use crate::backend::{Campaign, Holder, Result, Term, TermId};

/// The spare lease a leader keeps for its successor.
#[derive(Clone, Copy, Debug)]
pub(super) struct NextLease {
    lease: Lease,
    /// The send instant of its grant or last refresh.
    at: Instant,
}

/// A put of the election key that a follower's watch saw end the term it
/// watched.
#[derive(Clone, Debug)]
pub(super) struct Handed {
    /// The key as put.
    pub(super) kv: KeyValue,
    /// The revision of the watch answer that carried it.
    pub(super) revision: i64,
    /// The lease of the holder the watch was following.
    pub(super) seen_lease: i64,
}

impl EtcdBackend {
    /// After a renewal of a term of `ttl`: grant the next lease if there
    /// is none, or refresh it once less than half its TTL is known to
    /// remain — in a task of its own, so the renewal's answer never waits
    /// for it. The task writes back only into a slot that still holds what
    /// it started from (a release may have taken the lease meanwhile).
    /// Failures are ignored: the release then falls back to the claim.
    pub(super) fn keep_next_lease(&self, client: &Client, ttl: Duration) {
        if self.failsafe.load(Ordering::Relaxed) {
            return;
        }
        let current = *self.next_lease.lock().expect("next lease");
        let now = Instant::now();
        if current.is_some_and(|n| now.saturating_duration_since(n.at) < n.lease.ttl / 2) {
            return;
        }
        let (slot, store, mut client) =
            (self.next_lease.clone(), self.store.clone(), client.clone());
        tokio::spawn(async move {
            let next = match current {
                Some(n) => {
                    let alive = client.lease_client().keep_alive(n.lease.id).await.is_ok();
                    alive.then_some(NextLease { at: now, ..n })
                }
                None => store
                    .grant(&mut client, ttl, None)
                    .await
                    .ok()
                    .map(|lease| NextLease { lease, at: now }),
            };
            let mut slot = slot.lock().expect("next lease");
            if slot.map(|n| n.lease.id) == current.map(|n| n.lease.id) {
                *slot = next;
            }
        });
    }

    /// At the start of a term of `ttl`: grant the next lease off the
    /// campaign's path (a task of its own), so a handover soon after the
    /// term began needs no claim either. A grant that lands after the term
    /// ended leaves a lease that holds no key and expires by itself.
    pub(super) async fn start_next_lease(&self, ttl: Duration) {
        if self.failsafe.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut client) = self.client().await else {
            return;
        };
        self.set_next(None);
        let (slot, store) = (self.next_lease.clone(), self.store.clone());
        tokio::spawn(async move {
            let at = Instant::now();
            if let Ok(lease) = store.grant(&mut client, ttl, None).await {
                *slot.lock().expect("next lease") = Some(NextLease { lease, at });
            }
        });
    }

    fn set_next(&self, next: Option<NextLease>) {
        *self.next_lease.lock().expect("next lease") = next;
    }

    /// The next lease, taken for a release (the term is ending: whatever
    /// happens, it is not used again).
    pub(super) fn take_next_lease(&self) -> Option<i64> {
        if self.failsafe.load(Ordering::Relaxed) {
            return None;
        }
        self.next_lease
            .lock()
            .expect("next lease")
            .take()
            .map(|n| n.lease.id)
    }

    /// The release transaction that elects `successor` under `next`: while
    /// the key is bound to `lease`, when no pause is set and the successor
    /// keeps its adopter mark, put the key naming it under `next`, the
    /// release mark, and delete a stale successor key; else (paused, or a
    /// successor that cannot adopt: an older version) the old release:
    /// delete the key, put the mark and the successor key.
    pub(super) fn release_put(&self, lease: i64, successor: &str, next: i64) -> Txn {
        let absent = |key| Compare::create_revision(key, CompareOp::Equal, 0);
        let present = Compare::create_revision(self.adopter_key(successor), CompareOp::Greater, 0);
        let handed = Txn::new()
            .when([absent(self.paused_key()), present])
            .and_then([
                TxnOp::put(
                    self.key.clone(),
                    successor.as_bytes().to_vec(),
                    Some(PutOptions::new().with_lease(next)),
                ),
                self.release_mark(lease),
                TxnOp::delete(self.successor_key(), None),
            ])
            .or_else(self.deleting_release(lease, Some(successor)));
        Txn::new()
            .when([Compare::lease(self.key.clone(), CompareOp::Equal, lease)])
            .and_then([TxnOp::txn(handed)])
    }

    /// The release mark of `lease`: its term is over.
    fn release_mark(&self, lease: i64) -> TxnOp {
        TxnOp::put(self.released_key(), lease_hex(lease).into_bytes(), None)
    }

    /// The release that deletes the key: the delete, the release mark of
    /// `lease` and, when one is named, the successor key.
    pub(super) fn deleting_release(&self, lease: i64, successor: Option<&str>) -> Vec<TxnOp> {
        let mut ops = vec![
            TxnOp::delete(self.key.clone(), None),
            self.release_mark(lease),
        ];
        if let Some(to) = successor {
            ops.push(TxnOp::put(
                self.successor_key(),
                to.as_bytes().to_vec(),
                None,
            ));
        }
        ops
    }

    /// Remember a put of the key that ended the watched term of
    /// `seen_lease` (a delete forgets it).
    pub(super) fn saw_put(&self, kv: Option<&KeyValue>, revision: i64, seen_lease: i64) {
        *self.handed.lock().expect("handed") = kv.map(|kv| Handed {
            kv: kv.clone(),
            revision,
            seen_lease,
        });
    }

    /// What the watch's last put says to a campaign after `previous`:
    /// `Some(Following)` when it named another holder, `Some(Elected)` when
    /// it named `identity` and the adoption's checks pass; `None`: claim.
    pub(super) async fn after_put(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Option<Campaign>> {
        let Some(h) = self.handed.lock().expect("handed").take() else {
            return Ok(None);
        };
        let prev = previous.map_or(0, |p| p.term_id.number().unwrap_or(0));
        if prev == 0 || h.seen_lease != prev || h.kv.lease() == 0 {
            return Ok(None);
        }
        if h.kv.value() != identity.as_bytes() {
            return Ok(Some(Campaign::Following(
                self.holder_from(&h.kv, h.revision),
            )));
        }
        self.adopt(identity, ttl, h.kv.lease(), h.kv.mod_revision())
            .await
    }

    /// Whether the adoption's reads (`read`: the key, the release mark, the
    /// adopter mark of `identity`) show the key still the put at `rev`
    /// naming `identity` under `lease`, the release mark written by that
    /// same transaction (a release's put, not a hand edit), and the
    /// adopter mark bound to `record_lease` (this process's own) since
    /// before it (a process of the same identity started after the put
    /// adopts nothing: ownership stays by lease).
    fn still_handed(
        &self,
        read: &etcd_client::TxnResponse,
        (lease, rev): (i64, i64),
        identity: &str,
        record_lease: i64,
    ) -> bool {
        let got: Vec<Option<KeyValue>> = read
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                _ => None,
            })
            .collect();
        let [Some(now), Some(mark), Some(record)] = got.as_slice() else {
            return false;
        };
        now.lease() == lease
            && now.mod_revision() == rev
            && now.value() == identity.as_bytes()
            && mark.mod_revision() == rev
            && record.lease() == record_lease
            && record.mod_revision() < rev
    }

    /// Whether the put at `rev` under `lease` may start a term of ours: not
    /// with failsafe, not an unleased key, and not a put we adopted already
    /// (a put starts one term: a term of ours it started that ended with no
    /// release is followed, then released as abandoned, never adopted again;
    /// its token would not grow, and a late-applied release of that term
    /// could delete the key under the new one).
    fn may_adopt(&self, lease: i64, rev: i64) -> bool {
        !self.failsafe.load(Ordering::Relaxed)
            && lease != 0
            && *self.adopted.lock().expect("adopted") != Some((lease, rev))
    }

    /// Adopt the term a release handed to `identity` (whose TTL is `ttl`)
    /// by its put of the key under `lease` at revision `rev` (module docs):
    /// `None` when a check fails (the caller then claims, or follows).
    pub(super) async fn adopt(
        &self,
        identity: &str,
        ttl: Duration,
        lease: i64,
        rev: i64,
    ) -> Result<Option<Campaign>> {
        if !self.may_adopt(lease, rev) {
            return Ok(None);
        }
        let Some((record_lease, _)) = self.registry_lease.lock().await.get(identity).cloned()
        else {
            return Ok(None);
        };
        let client = self.client().await?;
        // Three requests in one round trip: the keep-alive (etcd-client's
        // opening of the stream sends one and fails unless the lease is
        // alive: it then lasts its granted TTL from etcd's handling of it,
        // after this send), the lease's granted TTL, and the reads.
        let (mut keeping, mut leases) = (client.lease_client(), client.lease_client());
        let keep = keeping.keep_alive(lease);
        let granted = leases.time_to_live(lease, None);
        let reads = Txn::new().and_then([
            TxnOp::get(self.key.clone(), None),
            TxnOp::get(self.released_key(), None),
            TxnOp::get(self.adopter_key(identity), None),
        ]);
        let mut kv_client = client.kv_client();
        let (keep, granted, read) = tokio::join!(keep, granted, kv_client.txn(reads));
        let read = read.map_err(|e| self.classify(e, false))?;
        let (Ok((keeper, stream)), Ok(granted)) = (keep, granted) else {
            return Ok(None);
        };
        if granted.granted_ttl() <= 0
            || !self.still_handed(&read, (lease, rev), identity, record_lease)
        {
            return Ok(None);
        }
        if granted.granted_ttl() != ttl_secs(ttl) {
            // Kept ahead with the old leader's TTL: the term starts under
            // a lease of ours ([`super::swap`]).
            let swapped = self.swap(identity, (lease, rev), record_lease, ttl).await?;
            if swapped.is_some() {
                *self.adopted.lock().expect("adopted") = Some((lease, rev));
            }
            return Ok(swapped);
        }
        *self.adopted.lock().expect("adopted") = Some((lease, rev));
        let ttl = Duration::from_secs(granted.granted_ttl() as u64);
        self.start_next_lease(ttl).await;
        *self.keep_alive.lock().await = Some(KeepAlive {
            lease,
            keeper,
            stream,
            in_flight: false,
        });
        let revision = revision_of(read.header());
        Ok(Some(adopted(identity, (lease, rev), ttl, revision)))
    }
}

/// The term `identity` adopted: the put at `rev` under `lease`, of `ttl`,
/// read at `revision`.
fn adopted(identity: &str, (lease, rev): (i64, i64), ttl: Duration, revision: i64) -> Campaign {
    Campaign::Elected(Term {
        holder: Holder {
            identity: identity.to_owned(),
            fencing_token: rev.max(0) as u64,
            term_id: TermId::numbered(lease, lease_hex(lease)),
            revision: Some(revision),
            expires_in: None,
        },
        ttl,
        granted: ttl,
        servers: None,
    })
}
