//! The taker's swap: a term handed over by one write ([`super::handover`])
//! whose next lease was granted with another TTL than the taker's own
//! (a rolling update that changes `--lease-duration`) starts under a lease
//! of the taker's TTL instead.
//!
//! One transaction, with the lease granted (or the spare refreshed) beside
//! it as for a claim ([`super::ahead`]), compares everything the adoption
//! reads (the key still the release's put naming the taker under the next
//! lease, the release mark written by that put, the taker's adopter mark
//! bound to its own record lease and older than the put) and puts the key
//! naming the taker under its own lease. The term begins with that put: its
//! fencing token is the swap's revision, above the release put's, and the
//! key is bound at every revision to one lease that its holder keeps (the
//! next lease until the swap, the taker's after it). The next lease then
//! binds nothing and expires by itself. Followers see the swap as a put
//! under another lease than the one they followed, and follow the new term.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn};
use tokio::time::Instant;

use super::EtcdBackend;
use super::ahead::{Ahead, Spare, new_lease};
use crate::backend::{Campaign, Result};

impl EtcdBackend {
    /// Start the term the put at revision `rev` under the next lease `next`
    /// handed to `identity` (whose adopter mark is bound to
    /// `record_lease`) under a lease of `identity`'s own `ttl` (module
    /// docs): `None` when the put is no longer what the adoption read (the
    /// caller then claims).
    ///
    /// # Errors
    /// A classified [`crate::backend::BackendError`] when etcd does not
    /// answer (the lease granted for the swap is then revoked: a swap that
    /// etcd applied ends with it, and the followers take the key's
    /// deletion as the end of a term they saw begin).
    pub(super) async fn swap(
        &self,
        identity: &str,
        (next, rev): (i64, i64),
        record_lease: i64,
        ttl: Duration,
    ) -> Result<Option<Campaign>> {
        let mut client = self.client().await?;
        let (mut lease, mut at, mut ahead) = self.lease_ahead(ttl);
        loop {
            let sent = Instant::now();
            let txn = self.swap_txn(identity, (next, rev), record_lease, lease.id);
            let Some((found, keep)) = self.claim_txn(&mut client, txn, &mut lease, ahead).await?
            else {
                (lease, at, ahead) = match ahead {
                    // The swap ran before the grant beside it.
                    Ahead::Grant => (lease, at, Ahead::Ready),
                    Ahead::Refresh => (new_lease(ttl), Instant::now(), Ahead::Grant),
                    Ahead::Ready => return Ok(None),
                };
                continue;
            };
            if found.wrote {
                return Ok(Some(self.won(identity, lease, found.revision, keep).await));
            }
            if ahead == Ahead::Refresh {
                at = sent;
            }
            // The put changed: keep the lease for the claim that follows.
            *self.spare.lock().expect("spare lease") = Some(Spare { lease, at });
            return Ok(None);
        }
    }

    /// The swap's transaction (module docs).
    fn swap_txn(&self, identity: &str, (next, rev): (i64, i64), record: i64, own: i64) -> Txn {
        let adopter = self.adopter_key(identity);
        Txn::new()
            .when([
                Compare::lease(self.key.clone(), CompareOp::Equal, next),
                Compare::mod_revision(self.key.clone(), CompareOp::Equal, rev),
                Compare::value(self.key.clone(), CompareOp::Equal, identity),
                Compare::mod_revision(self.released_key(), CompareOp::Equal, rev),
                Compare::lease(adopter.clone(), CompareOp::Equal, record),
                Compare::mod_revision(adopter, CompareOp::Less, rev),
            ])
            .and_then([self.put_key(identity, own)])
    }
}
