//! The etcd backend's failsafe roster: the key `<key>/failsafe/roster`
//! without a lease (it outlives the term: the model's first
//! counterexample), put in the campaign's own transaction and, when it
//! changes, by a transaction that compares the term's key with the term's
//! lease; the applications under `<key>/failsafe/members/`, each bound to a
//! lease of its own.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::EtcdBackend;
use crate::backend::roster::{Member, Roster, RosterStore};
use crate::backend::{BackendError, Result};

impl EtcdBackend {
    fn roster_key(&self) -> Vec<u8> {
        let mut k = self.sub_prefix("failsafe");
        k.extend_from_slice(b"roster");
        k
    }

    fn members_prefix(&self) -> Vec<u8> {
        let mut k = self.sub_prefix("failsafe");
        k.extend_from_slice(b"members/");
        k
    }

    /// The put of the staged roster, for the campaign's transaction.
    pub(super) fn staged_roster_put(&self) -> Option<TxnOp> {
        let staged = self.staged.lock().expect("the staged roster").clone()?;
        Some(TxnOp::put(self.roster_key(), staged.to_json(), None))
    }

    /// After a renewal of the term bound to `lease`: write the roster
    /// staged for it, if any, comparing the term's key with its lease.
    /// `Ok(false)`: the key is no longer the term's.
    pub(super) async fn write_staged_roster(&self, lease: i64) -> Result<bool> {
        let Some(roster) = self.staged.lock().expect("the staged roster").take() else {
            return Ok(true);
        };
        let mut client = self.client().await?;
        let txn = Txn::new()
            .when([Compare::lease(self.key.clone(), CompareOp::Equal, lease)])
            .and_then([TxnOp::put(self.roster_key(), roster.to_json(), None)]);
        let resp = self.store.call(None, "txn", client.txn(txn)).await?;
        Ok(resp.succeeded())
    }
}

#[async_trait]
impl RosterStore for EtcdBackend {
    async fn roster(&self) -> Result<Option<Roster>, BackendError> {
        let mut client = self.client().await?;
        let resp = self
            .store
            .call(None, "get", client.get(self.roster_key(), None))
            .await?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| Roster::from_json(&String::from_utf8_lossy(kv.value())).ok()))
    }

    async fn apply(&self, member: &Member, ttl: Duration) -> Result<(), BackendError> {
        let mut client = self.client().await?;
        let lease = self.store.grant(&mut client, ttl, None).await?;
        let mut key = self.members_prefix();
        key.extend_from_slice(member.identity.as_bytes());
        let value = serde_json::to_string(member).expect("a member serializes");
        let opts = PutOptions::new().with_lease(lease.id);
        self.store
            .call(None, "put", client.put(key, value, Some(opts)))
            .await
            .map(|_| ())
    }

    async fn withdraw(&self, identity: &str) -> Result<(), BackendError> {
        let mut client = self.client().await?;
        let mut key = self.members_prefix();
        key.extend_from_slice(identity.as_bytes());
        self.store
            .call(None, "delete", client.delete(key, None))
            .await
            .map(|_| ())
    }

    async fn applicants(&self) -> Result<Vec<Member>, BackendError> {
        let mut client = self.client().await?;
        let opts = GetOptions::new().with_prefix();
        let resp = self
            .store
            .call(None, "get", client.get(self.members_prefix(), Some(opts)))
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect())
    }

    fn stage(&self, _identity: &str, roster: Roster) {
        self.failsafe
            .store(true, std::sync::atomic::Ordering::Relaxed);
        *self.staged.lock().expect("the staged roster") = Some(roster);
    }
}
