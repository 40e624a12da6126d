//! The release: one transaction, while the election key is still bound to
//! our lease, either puts the key naming the successor under the next lease
//! (the handover by one write, [`super::handover`]) or deletes it, and puts
//! the release mark (and the successor key when a successor is named but
//! no next lease is kept); then our lease is revoked ([`super::claim`] says
//! why the mark lets a follower take the term at once).

use etcd_client::{Compare, CompareOp, Txn};

use super::EtcdBackend;
use super::claim::txn_or_no_lease;
use crate::backend::{Result, Term};

impl EtcdBackend {
    /// End `term` naming `successor` (module docs).
    pub(super) async fn release_to(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        let mut client = self.client().await?;
        let lease = term.holder.term_id.number().unwrap_or(0);
        self.forget_keep_alive(lease).await;
        let next = self.take_next_lease();
        let mut released = false;
        let mut handed = false;
        if let (Some(to), Some(next)) = (successor, next) {
            let txn = self.release_put(lease, to, next);
            let put = txn_or_no_lease(client.clone(), txn);
            // Handed over, paused (deleted), or no longer ours: done. The
            // next lease expired (`None`): release by the delete below. An
            // error: it may have been applied, so the delete below (which
            // compares our lease) is harmless, and the next lease is left
            // to expire by itself.
            let answer = self.store.call(None, "txn", put).await;
            released = matches!(answer, Ok(Some(_)));
            handed = matches!(&answer, Ok(Some(r)) if r.succeeded() && handed_over(r));
        }
        if !released {
            let txn = Txn::new()
                .when([Compare::lease(self.key.clone(), CompareOp::Equal, lease)])
                .and_then(self.deleting_release(lease, successor));
            // On failure (the key is no longer ours, or etcd did not answer)
            // the revoke still ends the term, naming nobody.
            let _ = self.store.call(None, "txn", client.txn(txn)).await;
        }
        if handed {
            // Our lease binds nothing now: it expires by itself, and no
            // write of ours competes with the successor's first reads.
            return Ok(());
        }
        self.store.revoke(&mut client, lease, None).await
    }
}

/// Whether a release transaction's answer put the key (the handover
/// branch, not the paused delete).
fn handed_over(resp: &etcd_client::TxnResponse) -> bool {
    resp.op_responses().into_iter().any(|op| match op {
        etcd_client::TxnOpResponse::Txn(t) => t.succeeded(),
        _ => false,
    })
}
