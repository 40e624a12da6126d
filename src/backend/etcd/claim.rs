//! The campaign's transaction, with the pause and the named successor, and
//! the release that names one.
//!
//! - **Claim**: one transaction puts the election key under our lease if
//!   the key, the pause key (`<election key>/controls/paused`) and the
//!   successor key (`<election key>/successor`) are all absent
//!   (`create_revision == 0`); else it reads all three. A pause answers
//!   [`Campaign::Waiting`] with [`WaitReason::Paused`]. A successor naming this
//!   candidate, or one this candidate has seen (the same `mod_revision`)
//!   for [`successor_wait`] of its own transaction's round trip, is taken
//!   over by a second transaction that compares the key and the pause key
//!   absent and the successor key unchanged, puts the election key and
//!   deletes the successor key: both decisions are etcd's, atomic with the
//!   write. Any other candidate waits out the rest of that wait, so a dead,
//!   unknown or hand-written successor costs at most
//!   [`SUCCESSOR_WAIT_CAP`](crate::backend::candidates::SUCCESSOR_WAIT_CAP)
//!   plus one retry.
//! - **Release naming a successor**: a transaction puts the successor key
//!   while the election key is still bound to our lease, then the lease is
//!   revoked (which deletes the election key): the name is in place before
//!   any follower's watch reports the release, and the previous lease is
//!   gone when they campaign. The successor key is bound to no lease: the
//!   next claim deletes it.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::time::Instant;

use super::EtcdBackend;
use super::store::{Lease, lease_hex, revision_of};
use crate::backend::WaitReason;
use crate::backend::candidates::successor_wait;
use crate::backend::{Campaign, Holder, Result, Term, TermId};

/// How soon a candidate kept out by a pause looks again (the Elector waits
/// at most its retry period).
pub const PAUSED_RETRY: Duration = Duration::from_millis(500);

/// What a failed first transaction read.
struct Found {
    holder: Option<Holder>,
    paused: bool,
    /// The named successor and its key's `mod_revision`.
    named: Option<(String, i64)>,
}

impl EtcdBackend {
    /// The successor key.
    pub(super) fn successor_key(&self) -> Vec<u8> {
        let mut k = self.key.clone();
        k.extend_from_slice(b"/successor");
        k
    }

    fn absent(&self, key: Vec<u8>) -> Compare {
        Compare::create_revision(key, CompareOp::Equal, 0)
    }

    fn put_key(&self, identity: &str, lease: i64) -> TxnOp {
        let opts = PutOptions::new().with_lease(lease);
        TxnOp::put(self.key.clone(), identity.as_bytes().to_vec(), Some(opts))
    }

    /// Take the free election key for `identity` under `lease` (granted
    /// already; revoked unless elected), honouring the pause and the named
    /// successor (module docs).
    pub(super) async fn claim(
        &self,
        client: &mut Client,
        identity: &str,
        lease: Lease,
    ) -> Result<Campaign> {
        let first = self.first_txn(identity, lease.id);
        let sent = Instant::now();
        let resp = match self.store.call(None, "txn", client.txn(first)).await {
            Ok(resp) => resp,
            Err(e) => {
                self.store.abandon(client, lease.id, None, &e).await;
                return Err(e);
            }
        };
        if resp.succeeded() {
            return Ok(self.elected(identity, lease, &resp));
        }
        let wait = successor_wait(sent.elapsed());
        let found = self.found(&resp);
        let named = match found {
            Found {
                holder: Some(h), ..
            } => Some(Err(Campaign::Following(h))),
            Found { paused: true, .. } => Some(Err(Campaign::Waiting {
                previous: None,
                retry_after: PAUSED_RETRY,
                why: WaitReason::Paused,
            })),
            Found {
                named: Some((who, rev)),
                ..
            } => Some(match self.yield_to(&who, rev, identity, wait) {
                None => Ok(rev),
                Some(left) => Err(Campaign::Waiting {
                    previous: None,
                    retry_after: left,
                    why: WaitReason::SuccessorHeadStart,
                }),
            }),
            _ => None,
        };
        match named {
            Some(Ok(rev)) => self.take_from_successor(client, identity, lease, rev).await,
            Some(Err(answer)) => {
                let _ = self.store.revoke(client, lease.id, None).await;
                Ok(answer)
            }
            None => {
                let _ = self.store.revoke(client, lease.id, None).await;
                Ok(self.not_elected(&resp))
            }
        }
    }

    /// The first transaction: put the key if it, the pause key and the
    /// successor key are absent; else read all three.
    fn first_txn(&self, identity: &str, lease: i64) -> Txn {
        Txn::new()
            .when([
                self.absent(self.key.clone()),
                self.absent(self.paused_key()),
                self.absent(self.successor_key()),
            ])
            .and_then([self.put_key(identity, lease)])
            .or_else([
                TxnOp::get(self.key.clone(), None),
                TxnOp::get(self.paused_key(), None),
                TxnOp::get(self.successor_key(), None),
            ])
    }

    /// How much longer `identity` leaves the term to the successor `who`
    /// (its key at `rev`): `None` when it is `identity`, or when this
    /// backend first saw that key at least `wait` ago.
    fn yield_to(&self, who: &str, rev: i64, identity: &str, wait: Duration) -> Option<Duration> {
        if who == identity {
            return None;
        }
        let now = Instant::now();
        let first = {
            let mut seen = self.named_seen.lock().expect("named successor");
            match *seen {
                Some((r, at)) if r == rev => at,
                _ => {
                    *seen = Some((rev, now));
                    now
                }
            }
        };
        (first + wait)
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }

    /// The second transaction: the key and the pause still absent, the
    /// successor key still at `rev` → put the key, delete the successor key.
    async fn take_from_successor(
        &self,
        client: &mut Client,
        identity: &str,
        lease: Lease,
        rev: i64,
    ) -> Result<Campaign> {
        let txn = Txn::new()
            .when([
                self.absent(self.key.clone()),
                self.absent(self.paused_key()),
                Compare::mod_revision(self.successor_key(), CompareOp::Equal, rev),
            ])
            .and_then([
                self.put_key(identity, lease.id),
                TxnOp::delete(self.successor_key(), None),
            ])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        let created = self.store.put_under(client, lease, txn, None).await?;
        if created.resp.succeeded() {
            Ok(self.elected(identity, lease, &created.resp))
        } else {
            Ok(self.not_elected(&created.resp))
        }
    }

    fn found(&self, resp: &TxnResponse) -> Found {
        let revision = revision_of(resp.header());
        let mut kvs = resp.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
        let holder = kvs
            .next()
            .flatten()
            .map(|kv| self.holder_from(&kv, revision));
        let paused = kvs.next().flatten().is_some();
        let named = kvs.next().flatten().map(|kv| {
            let who = String::from_utf8_lossy(kv.value()).into_owned();
            (who, kv.mod_revision())
        });
        Found {
            holder,
            paused,
            named,
        }
    }

    /// The term won by the transaction `resp` for `identity` under `lease`.
    pub(super) fn elected(&self, identity: &str, lease: Lease, resp: &TxnResponse) -> Campaign {
        let revision = revision_of(resp.header());
        Campaign::Elected(Term {
            holder: Holder {
                identity: identity.to_owned(),
                fencing_token: revision.max(0) as u64,
                term_id: TermId::numbered(lease.id, lease_hex(lease.id)),
                revision: Some(revision),
                expires_in: None,
            },
            ttl: lease.ttl,
            granted: lease.ttl,
            servers: None,
        })
    }

    /// End `term` naming `successor`: put the successor key while the
    /// election key is still ours, then revoke the lease.
    pub(super) async fn release_to(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        let mut client = self.client().await?;
        let lease = term.holder.term_id.number().unwrap_or(0);
        self.forget_keep_alive(lease).await;
        if let Some(to) = successor {
            let txn = Txn::new()
                .when([Compare::lease(self.key.clone(), CompareOp::Equal, lease)])
                .and_then([TxnOp::put(
                    self.successor_key(),
                    to.as_bytes().to_vec(),
                    None,
                )]);
            // On failure the release still goes ahead, naming nobody.
            let _ = self.store.call(None, "txn", client.txn(txn)).await;
        }
        self.store.revoke(&mut client, lease, None).await
    }
}
