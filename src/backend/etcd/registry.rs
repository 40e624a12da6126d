//! The candidate registry on etcd: one key per candidate,
//! `<election key>/candidates/<identity>`, whose value is the JSON record
//! `{"identity", "priority", "revision", "ready", "ttl"}` (`ttl` in whole
//! seconds, what the reader reports as the record's TTL), bound to a lease of the
//! record's TTL so that etcd deletes it when its candidate stops renewing.
//!
//! Each publish grants a fresh lease, puts the record under it (a put over
//! the key keeps its `create_revision`, the record's place in the order of
//! creation) and then revokes the previous publish's lease, which no key is
//! bound to any more: three requests per renewal (one a minute at the
//! default timing) and no keep-alive stream to keep. A reader never judges
//! a record's age: etcd expires it (`Listed::age` is `None`).
//!
//! The registry and the controls are watched by prefix from the revision
//! of the last read, so a change between a read and the next watch is not
//! missed ([`EtcdBackend::watch_prefix`]).

use std::time::Duration;

use etcd_client::{EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use serde::{Deserialize, Serialize};

use super::EtcdBackend;
use super::store::{BACKEND, revision_of, ttl_secs};
use crate::backend::candidates::{Candidate, DEFAULT_PRIORITY, Listed, from_unix_ms, unix_ms};
use crate::backend::{BackendError, Result};

/// The JSON value of a record.
#[derive(Serialize, Deserialize)]
struct Record {
    identity: String,
    #[serde(default = "default_priority")]
    priority: u32,
    #[serde(default)]
    revision: String,
    #[serde(default = "ready")]
    ready: bool,
    /// The record's TTL in whole seconds (0: unknown).
    #[serde(default)]
    ttl: u64,
    /// Until when the candidate is frozen, in ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frozen_until_ms: Option<u64>,
    /// The candidate's `--preempt-after` in ms (election-wide: the
    /// leader's counts; followers compare theirs with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preempt_after_ms: Option<u64>,
    /// When the value was written, in ms since the Unix epoch by the
    /// writer's clock (`status` shows the record's age from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    written_ms: Option<u64>,
}

fn default_priority() -> u32 {
    DEFAULT_PRIORITY
}

fn ready() -> bool {
    true
}

impl EtcdBackend {
    /// `<election key>/<what>/`, the prefix of the registry
    /// (`candidates`) or of the controls (`controls`).
    pub(super) fn sub_prefix(&self, what: &str) -> Vec<u8> {
        let mut p = self.key.clone();
        p.extend_from_slice(format!("/{what}/").as_bytes());
        p
    }

    /// The key of `identity`'s record.
    fn record_key(&self, identity: &str) -> Vec<u8> {
        let mut k = self.sub_prefix("candidates");
        k.extend_from_slice(identity.as_bytes());
        k
    }

    /// The key that says `identity` adopts a term handed over by one write
    /// ([`super::handover`]): bound to its record's lease, written with it
    /// (a candidate of an older version writes none, and is handed terms
    /// the old way).
    pub(super) fn adopter_key(&self, identity: &str) -> Vec<u8> {
        let mut k = self.sub_prefix("adopters");
        k.extend_from_slice(identity.as_bytes());
        k
    }

    /// Write `candidate`'s record under a fresh lease of `ttl`, then revoke
    /// the lease of the previous write.
    pub(super) async fn publish(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        let mut client = self.client().await?;
        let record = Record {
            identity: candidate.identity.clone(),
            priority: candidate.priority,
            revision: candidate.revision.clone(),
            ready: candidate.ready,
            ttl: ttl_secs(ttl) as u64,
            frozen_until_ms: candidate
                .frozen_until
                .map(crate::backend::candidates::unix_ms),
            preempt_after_ms: candidate.preempt_after.map(|d| d.as_millis() as u64),
            written_ms: None,
        };
        // Every publish writes, an unchanged record too: its `written_ms`
        // is how a reader sees a member alive again after it was known dead
        // (a leader that stopped claiming, a restarted process), and a
        // keep-alive would not move it.
        let value = serde_json::to_vec(&record).expect("a record serializes");
        let written = Record {
            written_ms: Some(unix_ms(std::time::SystemTime::now())),
            ..record
        };
        let written = serde_json::to_vec(&written).expect("a record serializes");
        let lease = self.store.grant(&mut client, ttl, None).await?;
        // The record and this process's adopter mark, bound to one lease
        // in one write ([`super::handover`]).
        let under = || Some(PutOptions::new().with_lease(lease.id));
        let txn = Txn::new().and_then([
            TxnOp::put(self.record_key(&candidate.identity), written, under()),
            TxnOp::put(self.adopter_key(&candidate.identity), "", under()),
        ]);
        let put = client.txn(txn);
        if let Err(e) = self.store.call(None, "txn", put).await {
            self.store.abandon(&mut client, lease.id, None, &e).await;
            return Err(e);
        }
        let old = self
            .registry_lease
            .lock()
            .await
            .insert(candidate.identity.clone(), (lease.id, value))
            .map(|(id, _)| id);
        if let Some(old) = old.filter(|o| *o != lease.id) {
            // Nothing is bound to it now; it would expire anyway.
            let _ = self.store.revoke(&mut client, old, None).await;
        }
        Ok(())
    }

    /// Remove `identity`'s record: one revoke of the lease of our last
    /// write (etcd deletes the record with it: one Raft write, not two);
    /// a delete when that lease is unknown or the revoke failed.
    pub(super) async fn withdraw(&self, identity: &str) -> Result<()> {
        let mut client = self.client().await?;
        let kept = self.registry_lease.lock().await.remove(identity);
        if let Some((lease, _)) = kept
            && self.store.revoke(&mut client, lease, None).await.is_ok()
        {
            return Ok(());
        }
        let del = client.delete(self.record_key(identity), None);
        self.store.call(None, "delete", del).await?;
        let del = client.delete(self.adopter_key(identity), None);
        self.store.call(None, "delete", del).await?;
        Ok(())
    }

    /// Every record, read at one revision (kept for the next
    /// [`watch_candidates`](Self::watch_registry)).
    pub(super) async fn list(&self) -> Result<Vec<Listed>> {
        let mut client = self.client().await?;
        let prefix = self.sub_prefix("candidates");
        let get = client.get(prefix, Some(GetOptions::new().with_prefix()));
        let resp = self.store.call(None, "get", get).await?;
        self.seen_registry(revision_of(resp.header()));
        let mut listed = Vec::new();
        for kv in resp.kvs() {
            // A value that is not a record (written by someone else) is skipped.
            let Ok(r) = serde_json::from_slice::<Record>(kv.value()) else {
                continue;
            };
            listed.push(Listed {
                candidate: Candidate {
                    identity: r.identity,
                    priority: r.priority,
                    revision: r.revision,
                    ready: r.ready,
                    frozen_until: r
                        .frozen_until_ms
                        .map(crate::backend::candidates::from_unix_ms),
                    preempt_after: r.preempt_after_ms.map(Duration::from_millis),
                },
                age: None,
                ttl: Duration::from_secs(r.ttl.max(1)),
                created: Some(kv.create_revision().max(0) as u64),
                written_ago: r.written_ms.map(|ms| {
                    let at = from_unix_ms(ms);
                    std::time::SystemTime::now()
                        .duration_since(at)
                        .unwrap_or_default()
                }),
            });
        }
        Ok(listed)
    }

    fn seen_registry(&self, revision: i64) {
        let mut seen = self.registry_rev.lock().expect("registry revision");
        *seen = (*seen).max(revision);
    }

    /// Resolve at the registry's first change after the last list (or the
    /// last change this reported).
    pub(super) async fn watch_registry(&self) -> Result<()> {
        let from = *self.registry_rev.lock().expect("registry revision");
        let prefix = self.sub_prefix("candidates");
        let revision = self.watch_prefix(prefix, from).await?;
        self.seen_registry(revision);
        Ok(())
    }

    /// Watch every key under `prefix` from the revision after `seen` (0:
    /// from now) until one changes; returns the revision of that change.
    /// A compacted history counts as a change (the caller reads again).
    ///
    /// # Errors
    /// A transport error, or [`BackendError::WatchEnded`] when the server
    /// closes or cancels the watch.
    pub(super) async fn watch_prefix(&self, prefix: Vec<u8>, seen: i64) -> Result<i64> {
        let mut client = self.client().await?;
        let mut opts = WatchOptions::new().with_prefix();
        if seen > 0 {
            opts = opts.with_start_revision(seen + 1);
        }
        let mut stream = self
            .store
            .call(None, "watch", client.watch(prefix, Some(opts)))
            .await?;
        loop {
            let msg = stream.message().await.map_err(|e| self.classify(e, false));
            let Some(msg) = msg? else {
                return Err(ended("stream closed".into()));
            };
            if msg.canceled() {
                if msg.compact_revision() > 0 {
                    return Ok(msg.compact_revision());
                }
                return Err(ended(format!("cancelled: {}", msg.cancel_reason())));
            }
            let changed = msg.events().iter().find_map(|e| {
                let kv = e.kv()?;
                matches!(e.event_type(), EventType::Put | EventType::Delete)
                    .then_some(kv.mod_revision())
            });
            if let Some(revision) = changed {
                return Ok(revision.max(revision_of(msg.header())));
            }
        }
    }
}

fn ended(reason: String) -> BackendError {
    BackendError::WatchEnded {
        backend: BACKEND,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_with_defaults_for_what_is_missing() {
        let r: Record = serde_json::from_slice(br#"{"identity":"a"}"#).unwrap();
        assert_eq!((r.priority, r.ready, r.revision.as_str()), (1, true, ""));
        let json = serde_json::to_string(&Record {
            identity: "b".into(),
            priority: 3,
            revision: "r1".into(),
            ready: false,
            frozen_until_ms: None,
            preempt_after_ms: None,
            written_ms: None,
            ttl: 2,
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"identity":"b","priority":3,"revision":"r1","ready":false,"ttl":2}"#
        );
    }
}
