//! The campaign's transaction, with the pause and the named successor, and
//! the release that names one.
//!
//! - **Lease ahead**: a campaign that does not win keeps its lease as the
//!   spare of the next one (no revoke); the next campaign takes it while
//!   at least half its TTL remains and refreshes it with one keep-alive sent
//!   beside its transaction, so a handover campaign is one round trip, not a
//!   grant and then a transaction. A spare nobody takes expires by itself
//!   (it holds no key).
//! - **Claim**: one transaction (nested) puts the election key under our
//!   lease if the key and the pause key (`<election key>/controls/paused`)
//!   are absent, the previous term's release mark (below) names the
//!   previous holder's lease, and the successor key (`<election
//!   key>/successor`) names this candidate (then it deletes it) or is
//!   absent; else it reads them. Without the mark (a crash: the lease
//!   expired; or a key deleted by hand) the previous lease is checked with
//!   `LeaseTimeToLive` and, once it is gone, the transaction runs again
//!   without the mark. A pause answers [`Campaign::Waiting`] with
//!   [`WaitReason::Paused`]. A successor naming another candidate that this candidate
//!   has seen (the same `mod_revision`) for [`successor_wait`] of its own
//!   transaction's round trip is taken over by a second transaction that
//!   compares the key and the pause key absent and the successor key
//!   unchanged, puts the election key and deletes the successor key: both
//!   decisions are etcd's, atomic with the write. Any other candidate waits
//!   out the rest of that wait, so a dead, unknown or hand-written successor
//!   costs at most
//!   [`SUCCESSOR_WAIT_CAP`](crate::backend::candidates::SUCCESSOR_WAIT_CAP)
//!   plus one retry.
//! - **Release**: one transaction, while the election key is still bound to
//!   our lease, deletes it, puts the release mark `<election key>/released`
//!   (our lease id) and the successor key when one is named; then the lease
//!   is revoked. The holder writes the mark only after it stopped claiming,
//!   so the mark proves the previous term over as the lease's end would:
//!   followers campaign on the delete event at once, without waiting for the
//!   revoke or checking the lease (DESIGN.md, "A follower takes over only
//!   when the previous term is over"). The successor key and the mark are
//!   bound to no lease: the next claim deletes the successor key, the next
//!   release overwrites the mark.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::time::Instant;

use super::ahead::{Ahead, Beside, Spare, new_lease, send_beside};
use super::store::{Lease, lease_hex, revision_of};
use super::{EtcdBackend, KeepAlive};
use crate::backend::WaitReason;
use crate::backend::candidates::successor_wait;
use crate::backend::{Campaign, Holder, Result, Term, TermId};

/// How soon a candidate kept out by a pause looks again (the Elector waits
/// at most its retry period).
pub const PAUSED_RETRY: Duration = Duration::from_millis(500);

/// What comes after a claim that did not put the key.
enum Next {
    Answer(Campaign),
    /// The previous lease is gone: claim again without the release mark.
    WithoutMark,
    /// Take the term from the named successor whose key is at this
    /// `mod_revision`.
    Take(i64),
}

/// Run `txn`; `None` when etcd answers that its lease does not exist.
pub(super) async fn txn_or_no_lease(
    mut kv: Client,
    txn: Txn,
) -> std::result::Result<Option<TxnResponse>, etcd_client::Error> {
    match kv.txn(txn).await {
        Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => Ok(None),
        other => other.map(Some),
    }
}

/// What a claim transaction read or did.
#[derive(Default)]
pub(super) struct Found {
    /// The transaction put the election key.
    pub(super) wrote: bool,
    holder: Option<Holder>,
    paused: bool,
    /// The named successor and its key's `mod_revision`.
    named: Option<(String, i64)>,
    /// The lease id the release mark names.
    mark: Option<Vec<u8>>,
    /// The revision of the answer (of the put, when it wrote).
    pub(super) revision: i64,
}

impl EtcdBackend {
    /// The successor key.
    pub(super) fn successor_key(&self) -> Vec<u8> {
        let mut k = self.key.clone();
        k.extend_from_slice(b"/successor");
        k
    }

    /// The release mark's key.
    pub(super) fn released_key(&self) -> Vec<u8> {
        let mut k = self.key.clone();
        k.extend_from_slice(b"/released");
        k
    }

    fn absent(&self, key: Vec<u8>) -> Compare {
        Compare::create_revision(key, CompareOp::Equal, 0)
    }

    pub(super) fn put_key(&self, identity: &str, lease: i64) -> TxnOp {
        let opts = PutOptions::new().with_lease(lease);
        TxnOp::put(self.key.clone(), identity.as_bytes().to_vec(), Some(opts))
    }

    /// Campaign for `identity` after `previous` (module docs).
    pub(super) async fn campaign_after(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign> {
        let mut client = self.client().await?;
        let prev = previous.map_or(0, |p| p.term_id.number().unwrap_or(0));
        let (mut lease, mut at, mut ahead) = self.lease_ahead(ttl);
        let mut mark = (prev != 0).then_some(prev);
        loop {
            let sent = Instant::now();
            let txn = self.claim_ops(identity, lease.id, mark);
            let claimed = self.claim_txn(&mut client, txn, &mut lease, ahead).await?;
            let Some((found, keep_alive)) = claimed else {
                (lease, at, ahead) = match ahead {
                    // The claim ran before the grant beside it: the lease
                    // exists now.
                    Ahead::Grant => (lease, at, Ahead::Ready),
                    // A spare that expired after all: a new lease.
                    Ahead::Refresh => (new_lease(ttl), Instant::now(), Ahead::Grant),
                    Ahead::Ready => {
                        let lost = "etcd lost the lease granted for the campaign";
                        return Err(self.store.unreachable(lost.into()));
                    }
                };
                continue;
            };
            if ahead == Ahead::Refresh {
                at = sent;
            }
            ahead = Ahead::Ready;
            if found.wrote {
                return Ok(self.won(identity, lease, found.revision, keep_alive).await);
            }
            let latency = sent.elapsed();
            let next = self
                .after_claim(&client, identity, &found, previous, mark, latency)
                .await;
            let answer = match next {
                Ok(Next::WithoutMark) => {
                    mark = None;
                    continue;
                }
                Ok(Next::Take(rev)) => {
                    self.take_from_successor(&mut client, identity, lease, rev)
                        .await
                }
                Ok(Next::Answer(answer)) => Ok(answer),
                Err(e) => Err(e),
            };
            if !matches!(answer, Ok(Campaign::Elected(_))) {
                *self.spare.lock().expect("spare lease") = Some(Spare { lease, at });
            }
            return answer;
        }
    }

    /// Run `txn`, a transaction that may bind the key to `lease` (the
    /// claim, module docs; or the taker's swap, [`super::swap`]), with what
    /// `ahead` sends beside it: the spare's keep-alive, or the grant of a new
    /// lease with our id (sent first on the same connection, so etcd
    /// nearly always applies it first; when it did not, the claim found no
    /// lease and is sent again). `None` when etcd says the lease is gone
    /// (`lease.ttl` is then the granted TTL when a grant went beside). The
    /// lease is abandoned when the call fails.
    pub(super) async fn claim_txn(
        &self,
        client: &mut Client,
        txn: Txn,
        lease: &mut Lease,
        ahead: Ahead,
    ) -> Result<Option<(Found, Option<KeepAlive>)>> {
        let put = txn_or_no_lease(client.clone(), txn);
        let beside = send_beside(client.lease_client(), *lease, ahead);
        // The grant or keep-alive is polled first: it is on the wire first.
        let (beside, put) = tokio::join!(beside, self.store.call(None, "txn", put));
        let keep = match beside {
            Beside::Granted(Ok(g)) => {
                lease.ttl = Duration::from_secs(g.ttl().max(1) as u64);
                None
            }
            Beside::Granted(Err(e)) => {
                let e = self.store.failed(e).await;
                if matches!(put, Ok(Some(_))) {
                    self.store.abandon(client, lease.id, None, &e).await;
                }
                return Err(e);
            }
            Beside::Kept(k) => Some(k),
            Beside::Nothing => None,
        };
        let resp = match put {
            Ok(Some(resp)) => resp,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.store.abandon(client, lease.id, None, &e).await;
                return Err(e);
            }
        };
        let found = self.found(&resp);
        let keep_alive = match keep {
            None => None,
            Some(Ok((keeper, stream))) => Some(KeepAlive {
                lease: lease.id,
                keeper,
                stream,
                in_flight: false,
            }),
            // Gone (expired between the two): the key, if written, with it.
            Some(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                let _ = self.store.revoke(client, lease.id, None).await;
                return Ok(None);
            }
            Some(Err(e)) => {
                let e = self.store.failed(e).await;
                self.store.abandon(client, lease.id, None, &e).await;
                return Err(e);
            }
        };
        Ok(Some((found, keep_alive)))
    }

    /// The nested claim transaction: when the key and the pause key are
    /// absent (and the release mark names `mark`, when given), put the key
    /// if the successor key names `identity` (deleting it) or is absent;
    /// every other branch reads the key, the pause, the successor key and
    /// the mark.
    fn claim_ops(&self, identity: &str, lease: i64, mark: Option<i64>) -> Txn {
        let reads = || {
            [
                TxnOp::get(self.key.clone(), None),
                TxnOp::get(self.paused_key(), None),
                TxnOp::get(self.successor_key(), None),
                TxnOp::get(self.released_key(), None),
            ]
        };
        // The failsafe roster, when staged, is written with the term.
        let puts = || {
            let roster = self.staged_roster_put();
            std::iter::once(self.put_key(identity, lease)).chain(roster)
        };
        let unnamed = Txn::new()
            .when([self.absent(self.successor_key())])
            .and_then(puts().collect::<Vec<_>>())
            .or_else(reads());
        let named = Compare::value(self.successor_key(), CompareOp::Equal, identity);
        let mut inner = Txn::new()
            .when([named])
            .and_then(
                puts()
                    .chain([TxnOp::delete(self.successor_key(), None)])
                    .collect::<Vec<_>>(),
            )
            .or_else([TxnOp::txn(unnamed)]);
        if let Some(prev) = mark {
            let marked = Compare::value(self.released_key(), CompareOp::Equal, lease_hex(prev));
            inner = Txn::new()
                .when([marked])
                .and_then([TxnOp::txn(inner)])
                .or_else(reads());
        }
        Txn::new()
            .when([
                self.absent(self.key.clone()),
                self.absent(self.paused_key()),
            ])
            .and_then([TxnOp::txn(inner)])
            .or_else(reads())
    }

    /// What a claim that did not put the key leads to: an answer, the
    /// claim again without the release mark (the previous lease is gone),
    /// or the takeover of the successor key at a `mod_revision`.
    async fn after_claim(
        &self,
        client: &Client,
        identity: &str,
        found: &Found,
        previous: Option<&Holder>,
        mark: Option<i64>,
        latency: Duration,
    ) -> Result<Next> {
        if let Some(h) = &found.holder {
            return Ok(Next::Answer(Campaign::Following(h.clone())));
        }
        if found.paused {
            return Ok(Next::Answer(Campaign::Waiting {
                previous: None,
                retry_after: PAUSED_RETRY,
                why: WaitReason::Paused,
            }));
        }
        if let Some(prev) = mark
            && found.mark.as_deref() != Some(lease_hex(prev).as_bytes())
        {
            // Not released by its holder: over only once its lease is gone.
            let left = self.store.time_to_live(client, prev, None).await?;
            if left > 0 {
                return Ok(Next::Answer(Campaign::Waiting {
                    previous: previous.cloned(),
                    retry_after: Duration::from_secs(left as u64),
                    why: WaitReason::PreviousTerm,
                }));
            }
            return Ok(Next::WithoutMark);
        }
        Ok(Next::Answer(match &found.named {
            Some((who, rev)) => match self.yield_to(who, *rev, identity, successor_wait(latency)) {
                None => return Ok(Next::Take(*rev)),
                Some(left) => Campaign::Waiting {
                    previous: None,
                    retry_after: left,
                    why: WaitReason::SuccessorHeadStart,
                },
            },
            // The key vanished between the compare and the read: nobody
            // holds it and its previous term is over; try again at once.
            None => Campaign::Waiting {
                previous: None,
                why: WaitReason::LostRace,
                retry_after: Duration::ZERO,
            },
        }))
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
        let resp = match self.store.call(None, "txn", client.txn(txn)).await {
            Ok(resp) => resp,
            Err(e) => {
                self.store.abandon(client, lease.id, None, &e).await;
                return Err(e);
            }
        };
        let found = self.found(&resp);
        if found.wrote {
            return Ok(self.won(identity, lease, found.revision, None).await);
        }
        Ok(match found.holder {
            Some(h) => Campaign::Following(h),
            None => Campaign::Waiting {
                previous: None,
                why: WaitReason::LostRace,
                retry_after: Duration::ZERO,
            },
        })
    }

    /// What a (nested) transaction's answer wrote and read.
    fn found(&self, resp: &TxnResponse) -> Found {
        let revision = revision_of(resp.header());
        let mut found = Found {
            revision,
            ..Found::default()
        };
        let mut kvs: Vec<KeyValue> = Vec::new();
        let mut stack = vec![resp.clone()];
        while let Some(r) = stack.pop() {
            for op in r.op_responses() {
                match op {
                    TxnOpResponse::Put(_) => found.wrote = true,
                    TxnOpResponse::Get(get) => kvs.extend(get.kvs().iter().cloned()),
                    TxnOpResponse::Txn(t) => stack.push(t),
                    TxnOpResponse::Delete(_) => {}
                }
            }
        }
        let (paused, named, released) =
            (self.paused_key(), self.successor_key(), self.released_key());
        for kv in &kvs {
            if kv.key() == self.key.as_slice() {
                found.holder = Some(self.holder_from(kv, revision));
            } else if kv.key() == paused.as_slice() {
                found.paused = true;
            } else if kv.key() == named.as_slice() {
                let who = String::from_utf8_lossy(kv.value()).into_owned();
                found.named = Some((who, kv.mod_revision()));
            } else if kv.key() == released.as_slice() {
                found.mark = Some(kv.value().to_vec());
            }
        }
        found
    }

    /// The term won at `revision` for `identity` under `lease`; the
    /// lease's keep-alive stream, when the campaign opened one, serves its
    /// renewals.
    pub(super) async fn won(
        &self,
        identity: &str,
        lease: Lease,
        revision: i64,
        keep_alive: Option<KeepAlive>,
    ) -> Campaign {
        if let Some(ka) = keep_alive {
            *self.keep_alive.lock().await = Some(ka);
        }
        self.start_next_lease(lease.ttl).await;
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
}
