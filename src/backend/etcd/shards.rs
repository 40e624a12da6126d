//! Shard records on etcd ([`ShardStore`]): a member's session is a lease of
//! its own; `<election key>/shards/members/<identity>` (JSON
//! `{"shards", "session"}`) and every shard record
//! `<election key>/shards/s/<id>` (JSON `{"member", "session"}`) are bound
//! to it, so etcd deletes them together when the lease's TTL runs out. A
//! shard's fencing token is its record's `create_revision`: a new record is
//! created at a revision above every earlier one (etcd's revision only
//! grows), and a put over our own record keeps it.
//!
//! Requests: one keep-alive per renew interval renews every record; a read
//! is one range request of the prefix; one watch of the prefix stays open
//! and reports changes (etcd docs, "Lease", "Watch").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::EtcdBackend;
use super::store::{lease_hex, revision_of};
use crate::backend::Result;
use crate::backend::shards::{Session, ShardMember, ShardRecord, ShardSnapshot, ShardStore};

#[derive(Serialize, Deserialize)]
struct MemberValue {
    shards: u32,
    session: String,
}

#[derive(Serialize, Deserialize)]
struct RecordValue {
    member: String,
    session: String,
}

/// The etcd [`ShardStore`] of one election.
pub struct EtcdShards {
    backend: Arc<EtcdBackend>,
    /// The revision of the last read (the watch starts after it).
    seen: Arc<Mutex<i64>>,
    /// The watch task, started by the first [`ShardStore::changed`].
    task: Mutex<Option<JoinHandle<()>>>,
    /// Its notices, counted.
    notices: watch::Sender<u64>,
}

impl Drop for EtcdShards {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap().take() {
            task.abort();
        }
    }
}

fn session_lease(session: &Session) -> i64 {
    i64::from_str_radix(&session.id, 16).unwrap_or(0)
}

impl EtcdShards {
    /// The shard store beside `backend`'s election.
    pub fn new(backend: Arc<EtcdBackend>) -> EtcdShards {
        EtcdShards {
            backend,
            seen: Arc::new(Mutex::new(0)),
            task: Mutex::new(None),
            notices: watch::channel(0).0,
        }
    }

    fn member_key(&self, identity: &str) -> Vec<u8> {
        let mut k = self.backend.sub_prefix("shards");
        k.extend_from_slice(format!("members/{identity}").as_bytes());
        k
    }

    fn shard_key(&self, shard: u32) -> Vec<u8> {
        let mut k = self.backend.sub_prefix("shards");
        k.extend_from_slice(format!("s/{shard}").as_bytes());
        k
    }

    /// The notices' receiver, starting the watch task when none runs.
    fn notices(&self) -> watch::Receiver<u64> {
        let mut g = self.task.lock().unwrap();
        if g.as_ref().is_none_or(|t| t.is_finished()) {
            let (backend, seen) = (self.backend.clone(), self.seen.clone());
            let tx = self.notices.clone();
            let prefix = self.backend.sub_prefix("shards");
            *g = Some(tokio::spawn(async move {
                loop {
                    let from = *seen.lock().unwrap();
                    match backend.watch_prefix(prefix.clone(), from).await {
                        Ok(revision) => {
                            let mut s = seen.lock().unwrap();
                            *s = (*s).max(revision);
                            drop(s);
                            tx.send_modify(|n| *n += 1);
                        }
                        Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                }
            }));
        }
        self.notices.subscribe()
    }
}

#[async_trait]
impl ShardStore for EtcdShards {
    async fn open(&self, member: &str, shards: u32, ttl: Duration) -> Result<Session> {
        let store = self.backend.store();
        let mut client = self.backend.client().await?;
        let lease = store.grant(&mut client, ttl, None).await?;
        let session = Session {
            id: lease_hex(lease.id),
            ttl: lease.ttl,
        };
        let value = serde_json::to_vec(&MemberValue {
            shards,
            session: session.id.clone(),
        })
        .expect("a member value serializes");
        let put = TxnOp::put(
            self.member_key(member),
            value,
            Some(PutOptions::new().with_lease(lease.id)),
        );
        let txn = Txn::new().and_then(vec![put]);
        if let Err(e) = store.call(None, "txn", client.txn(txn)).await {
            store.abandon(&mut client, lease.id, None, &e).await;
            return Err(e);
        }
        Ok(session)
    }

    async fn renew(&self, session: &Session) -> Result<bool> {
        let store = self.backend.store();
        let client = self.backend.client().await?;
        let mut leases = client.lease_client();
        // etcd-client's keep_alive sends one keep-alive and reads its answer:
        // a TTL of 0 (the lease is gone) is its LeaseKeepAliveError.
        match leases.keep_alive(session_lease(session)).await {
            Ok(_) => Ok(true),
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
            Err(e) => Err(store.failed(e).await),
        }
    }

    async fn read(&self, shards: u32) -> Result<ShardSnapshot> {
        let store = self.backend.store();
        let mut client = self.backend.client().await?;
        let prefix = self.backend.sub_prefix("shards");
        let opts = GetOptions::new().with_prefix();
        let resp = store
            .call(None, "range", client.get(prefix.clone(), Some(opts)))
            .await?;
        {
            let mut s = self.seen.lock().unwrap();
            *s = (*s).max(revision_of(resp.header()));
        }
        let mut snap = ShardSnapshot {
            members: Vec::new(),
            shards: vec![None; shards as usize],
        };
        for kv in resp.kvs() {
            let rest = &kv.key()[prefix.len()..];
            let rest = String::from_utf8_lossy(rest);
            if let Some(identity) = rest.strip_prefix("members/") {
                if let Ok(v) = serde_json::from_slice::<MemberValue>(kv.value()) {
                    snap.members.push(ShardMember {
                        identity: identity.to_owned(),
                        shards: v.shards,
                    });
                }
            } else if let Some(id) = rest.strip_prefix("s/") {
                let Ok(id) = id.parse::<u32>() else { continue };
                let Ok(v) = serde_json::from_slice::<RecordValue>(kv.value()) else {
                    continue;
                };
                if id < shards {
                    snap.shards[id as usize] = Some(ShardRecord {
                        member: v.member,
                        // The lease the key is bound to, not what its value
                        // says: a hand edit cannot move a record.
                        session: lease_hex(kv.lease()),
                        token: kv.create_revision() as u64,
                    });
                }
            }
        }
        Ok(snap)
    }

    async fn acquire(&self, session: &Session, member: &str, shard: u32) -> Result<Option<u64>> {
        let store = self.backend.store();
        let mut client = self.backend.client().await?;
        let key = self.shard_key(shard);
        let lease = session_lease(session);
        let value = serde_json::to_vec(&RecordValue {
            member: member.to_owned(),
            session: session.id.clone(),
        })
        .expect("a record value serializes");
        let put = TxnOp::put(
            key.clone(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        );
        let get = TxnOp::get(key.clone(), None);
        // Created when absent, or put again when bound to our lease (a lost
        // answer); a put with a lease etcd forgot is refused (NotFound).
        let free = Compare::create_revision(key.clone(), CompareOp::Equal, 0);
        let ours = Compare::lease(key.clone(), CompareOp::Equal, lease);
        for compare in [free, ours] {
            let txn = Txn::new()
                .when(vec![compare])
                .and_then(vec![put.clone(), get.clone()]);
            let resp = match client.txn(txn).await {
                Ok(r) => r,
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => {
                    return Ok(None);
                }
                Err(e) => return Err(store.failed(e).await),
            };
            if resp.succeeded() {
                return Ok(created_revision(&resp));
            }
        }
        Ok(None)
    }

    async fn release(&self, session: &Session, shard: u32) -> Result<()> {
        let store = self.backend.store();
        let mut client = self.backend.client().await?;
        let key = self.shard_key(shard);
        let txn = Txn::new()
            .when(vec![Compare::lease(
                key.clone(),
                CompareOp::Equal,
                session_lease(session),
            )])
            .and_then(vec![TxnOp::delete(key, None)]);
        store.call(None, "txn", client.txn(txn)).await.map(|_| ())
    }

    async fn close(&self, session: &Session) -> Result<()> {
        let store = self.backend.store();
        let mut client = self.backend.client().await?;
        store
            .revoke(&mut client, session_lease(session), None)
            .await
    }

    async fn changed(&self, seen: &mut u64, at_most: Duration) -> bool {
        let mut rx = self.notices();
        let wait = rx.wait_for(|n| n != seen);
        match tokio::time::timeout(at_most, wait).await {
            Ok(Ok(n)) => {
                *seen = *n;
                true
            }
            _ => false,
        }
    }
}

/// The `create_revision` of the record the transaction's get read back.
fn created_revision(resp: &etcd_client::TxnResponse) -> Option<u64> {
    resp.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision() as u64),
        _ => None,
    })
}
