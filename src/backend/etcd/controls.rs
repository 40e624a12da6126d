//! Operator controls on etcd, beside the election key:
//! `<election key>/controls/paused` (present: the election is paused; its
//! value is not read) and `<election key>/controls/switchover` (the identity
//! a switchover was requested to). Neither is bound to a lease: a control
//! stays until it is cleared.
//!
//! The campaign transaction compares that the pause key does not exist
//! ([`super::claim`]): a pause written before a campaign's transaction is
//! seen by it, so no new term starts while paused. Renewals (keep-alives)
//! and releases never look at it.

use etcd_client::GetOptions;

use super::EtcdBackend;
use super::store::revision_of;
use crate::backend::Result;
use crate::backend::controls::Controls;

impl EtcdBackend {
    /// The pause key.
    pub(super) fn paused_key(&self) -> Vec<u8> {
        let mut k = self.sub_prefix("controls");
        k.extend_from_slice(b"paused");
        k
    }

    /// The switchover request key.
    pub(super) fn switchover_key(&self) -> Vec<u8> {
        let mut k = self.sub_prefix("controls");
        k.extend_from_slice(b"switchover");
        k
    }

    /// The controls and the revision they were read at.
    pub(super) async fn read_controls(&self) -> Result<(Controls, i64)> {
        let mut client = self.client().await?;
        let prefix = self.sub_prefix("controls");
        let get = client.get(prefix, Some(GetOptions::new().with_prefix()));
        let resp = self.store.call(None, "get", get).await?;
        let (paused, switchover) = (self.paused_key(), self.switchover_key());
        let mut controls = Controls::default();
        for kv in resp.kvs() {
            if kv.key() == paused.as_slice() {
                controls.paused = true;
            } else if kv.key() == switchover.as_slice() && !kv.value().is_empty() {
                controls.switchover = Some(String::from_utf8_lossy(kv.value()).into_owned());
            }
        }
        Ok((controls, revision_of(resp.header())))
    }

    /// Put `value` at `key`, or delete `key` (`None`).
    async fn set_control(&self, key: Vec<u8>, value: Option<&str>) -> Result<()> {
        let mut client = self.client().await?;
        match value {
            Some(v) => {
                let put = client.put(key, v.as_bytes().to_vec(), None);
                self.store.call(None, "put", put).await.map(|_| ())
            }
            None => {
                let del = client.delete(key, None);
                self.store.call(None, "delete", del).await.map(|_| ())
            }
        }
    }

    /// Write (`true`) or delete the pause key.
    pub(super) async fn pause(&self, paused: bool) -> Result<()> {
        self.set_control(self.paused_key(), paused.then_some("paused"))
            .await
    }

    /// Write (`Some`) or delete the switchover request.
    pub(super) async fn switchover(&self, to: Option<&str>) -> Result<()> {
        self.set_control(self.switchover_key(), to).await
    }

    /// The controls once they differ from `seen`: read, and watch the
    /// controls prefix from that read's revision until they do.
    pub(super) async fn watch_controls_from(&self, seen: &Controls) -> Result<Controls> {
        loop {
            let (now, revision) = self.read_controls().await?;
            if now != *seen {
                return Ok(now);
            }
            self.watch_prefix(self.sub_prefix("controls"), revision)
                .await?;
        }
    }
}
