//! The release: one transaction, while the election key is still bound to
//! our lease, deletes it, puts the release mark and the successor key when
//! one is named; then the lease is revoked ([`super::claim`] says why the
//! mark lets a follower take the term at once).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::EtcdBackend;
use super::store::lease_hex;
use crate::backend::{Result, Term};

impl EtcdBackend {
    /// End `term` naming `successor`: one transaction deletes the election
    /// key while it is still ours, puts the release mark and the successor
    /// key; then the lease is revoked (module docs).
    pub(super) async fn release_to(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        let mut client = self.client().await?;
        let lease = term.holder.term_id.number().unwrap_or(0);
        self.forget_keep_alive(lease).await;
        let mut ops = vec![
            TxnOp::delete(self.key.clone(), None),
            TxnOp::put(self.released_key(), lease_hex(lease).into_bytes(), None),
        ];
        if let Some(to) = successor {
            ops.push(TxnOp::put(
                self.successor_key(),
                to.as_bytes().to_vec(),
                None,
            ));
        }
        let txn = Txn::new()
            .when([Compare::lease(self.key.clone(), CompareOp::Equal, lease)])
            .and_then(ops);
        // On failure (the key is no longer ours, or etcd did not answer) the
        // revoke still ends the term, naming nobody.
        let _ = self.store.call(None, "txn", client.txn(txn)).await;
        self.store.revoke(&mut client, lease, None).await
    }
}
