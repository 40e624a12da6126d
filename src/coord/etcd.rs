//! Coordination on etcd: every lock, permit and claim is a key bound to its
//! own lease; the token is `<lease hex>.<random>` and the key's value is
//! `<token>|<owner>`. Renew = one keep-alive of that lease plus a read proving
//! the key is still ours (an expired lease answers TTL 0 and is never
//! re-created). Fair locks follow etcd's own lock recipe: each waiter writes a
//! key under the lock's prefix and watches only the key with the next lower
//! `create_revision` (no thundering herd).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};

use super::{Claim, CoordError, Coordinator, Grant, Kind, Outcome, Result, Try, random_token};
use crate::backend::etcd::EtcdBackend;

/// The etcd [`Coordinator`], sharing the election's client.
pub struct EtcdCoord {
    backend: Arc<EtcdBackend>,
    prefix: String,
}

impl EtcdCoord {
    /// Coordination keys under `<election key>/../_coord/` (the election's prefix).
    pub fn new(backend: Arc<EtcdBackend>, prefix: &str) -> Self {
        EtcdCoord {
            backend,
            prefix: format!("{prefix}_coord/"),
        }
    }

    async fn client(&self) -> Result<Client> {
        Ok(self.backend.client().await?)
    }

    fn err(&self, e: etcd_client::Error) -> CoordError {
        CoordError::Backend(self.backend.classify(e, false))
    }

    fn lock_key(&self, name: &str) -> String {
        format!("{}locks/{name}", self.prefix)
    }
    fn fair_prefix(&self, name: &str) -> String {
        format!("{}fair/{name}/", self.prefix)
    }
    fn sem_prefix(&self, name: &str) -> String {
        format!("{}sem/{name}/", self.prefix)
    }
    fn job_key(&self, queue: &str, job: &str, part: &str) -> String {
        format!("{}jobs/{queue}/{job}/{part}", self.prefix)
    }

    /// The key a token's lock or permit lives at.
    fn key_of(&self, kind: Kind, name: &str, token: &str) -> String {
        let lease = token
            .trim_start_matches('f')
            .split('.')
            .next()
            .unwrap_or("");
        match kind {
            Kind::Lock if token.starts_with('f') => format!("{}{lease}", self.fair_prefix(name)),
            Kind::Lock => self.lock_key(name),
            Kind::Semaphore => format!("{}{lease}", self.sem_prefix(name)),
        }
    }

    async fn grant(&self, client: &mut Client, ttl: Duration) -> Result<(i64, Duration)> {
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let g = client
            .lease_grant(secs, None)
            .await
            .map_err(|e| self.err(e))?;
        Ok((g.id(), Duration::from_secs(g.ttl().max(1) as u64)))
    }

    /// One keep-alive of `lease`: the TTL it now has, 0 when it is gone.
    async fn keep_alive_once(&self, client: &Client, lease: i64) -> Result<i64> {
        let (mut keeper, mut stream) = client
            .lease_client()
            .keep_alive(lease)
            .await
            .map_err(|e| self.err(e))?;
        keeper.keep_alive().await.map_err(|e| self.err(e))?;
        match stream.message().await.map_err(|e| self.err(e))? {
            Some(r) => Ok(r.ttl()),
            None => Ok(0),
        }
    }
}

fn lease_of(token: &str) -> i64 {
    let hex = token
        .trim_start_matches('f')
        .split('.')
        .next()
        .unwrap_or("");
    i64::from_str_radix(hex, 16).unwrap_or(0)
}

fn owner_of(value: &[u8]) -> String {
    let v = String::from_utf8_lossy(value);
    v.split_once('|')
        .map(|(_, o)| o.to_owned())
        .unwrap_or_default()
}

fn holds(value: &[u8], token: &str) -> bool {
    value.starts_with(token.as_bytes()) && value.get(token.len()) == Some(&b'|')
}

#[async_trait]
impl Coordinator for EtcdCoord {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn lock(&self, name: &str, owner: &str, ttl: Duration) -> Result<Try> {
        let mut client = self.client().await?;
        let key = self.lock_key(name);
        // Cheap look first: a busy lock costs one read, not a lease.
        let peek = client
            .get(key.clone(), None)
            .await
            .map_err(|e| self.err(e))?;
        if let Some(kv) = peek.kvs().first() {
            return Ok(Try::Held(owner_of(kv.value())));
        }
        let (lease, granted) = self.grant(&mut client, ttl).await?;
        let token = format!("{lease:x}.{}", random_token(""));
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                format!("{token}|{owner}"),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = client.txn(txn).await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                let _ = client.lease_revoke(lease).await;
                return Err(self.err(e));
            }
        };
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            return Ok(Try::Acquired(Grant {
                name: name.to_owned(),
                token,
                fencing_token: rev.max(0) as u64,
                ttl_ms: granted.as_millis() as u64,
            }));
        }
        let _ = client.lease_revoke(lease).await;
        let holder = resp
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| owner_of(kv.value())),
                _ => None,
            })
            .unwrap_or_default();
        Ok(Try::Held(holder))
    }

    async fn lock_fair(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try> {
        let mut client = self.client().await?;
        let (lease, granted) = self.grant(&mut client, ttl).await?;
        let token = format!("f{lease:x}.{}", random_token(""));
        let prefix = self.fair_prefix(name);
        let my_key = format!("{prefix}{lease:x}");
        let put = client
            .put(
                my_key.clone(),
                format!("{token}|{owner}"),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| self.err(e))?;
        let my_rev = put.header().map_or(0, |h| h.revision());
        let deadline = tokio::time::Instant::now() + wait;
        // Keep the waiter's lease alive while it queues.
        let keeper = {
            let client = client.clone();
            let every = (granted / 3).max(Duration::from_millis(500));
            async move {
                let Ok((mut k, mut s)) = client.lease_client().keep_alive(lease).await else {
                    return std::future::pending::<()>().await;
                };
                loop {
                    tokio::time::sleep(every).await;
                    if k.keep_alive().await.is_err() || s.message().await.is_err() {
                        return std::future::pending::<()>().await;
                    }
                }
            }
        };
        // The waiter just ahead of us: (its key, the read's revision, its owner).
        let ahead = |client: Client| {
            let prefix = prefix.clone();
            async move {
                let mut client = client;
                let r = client
                    .get(
                        prefix,
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_max_create_revision(my_rev - 1)
                                .with_sort(SortTarget::Create, SortOrder::Descend)
                                .with_limit(1),
                        ),
                    )
                    .await
                    .map_err(|e| self.err(e))?;
                let rev = r.header().map_or(0, |h| h.revision());
                Ok::<_, CoordError>(
                    r.kvs()
                        .first()
                        .map(|kv| (kv.key().to_vec(), rev, owner_of(kv.value()))),
                )
            }
        };
        // First look: free now means acquired, whatever the wait.
        let first = match ahead(client.clone()).await {
            Ok(a) => a,
            Err(e) => {
                let _ = client.lease_revoke(lease).await;
                return Err(e);
            }
        };
        let queue = async {
            let mut next = first;
            while let Some((key, rev, _holder)) = next {
                let mut w = client
                    .clone()
                    .watch(key, Some(WatchOptions::new().with_start_revision(rev + 1)))
                    .await
                    .map_err(|e| self.err(e))?;
                loop {
                    let Some(msg) = w.message().await.map_err(|e| self.err(e))? else {
                        break;
                    };
                    if msg.canceled()
                        || msg
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                    {
                        break;
                    }
                }
                next = ahead(client.clone()).await?;
            }
            Ok::<(), CoordError>(())
        };
        // `None`: the wait ran out while queued.
        let outcome = tokio::select! {
            biased;
            r = queue => Some(r.map(|_| ())),
            _ = keeper => None,
            _ = tokio::time::sleep_until(deadline) => None,
        };
        match outcome {
            Some(Ok(())) => Ok(Try::Acquired(Grant {
                name: name.to_owned(),
                token,
                fencing_token: my_rev.max(0) as u64,
                ttl_ms: granted.as_millis() as u64,
            })),
            None => {
                // Timed out in the queue: leave it.
                let _ = client.lease_revoke(lease).await;
                let first = client
                    .get(
                        prefix.clone(),
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(SortTarget::Create, SortOrder::Ascend)
                                .with_limit(1),
                        ),
                    )
                    .await
                    .ok()
                    .and_then(|r| r.kvs().first().map(|kv| owner_of(kv.value())))
                    .unwrap_or_default();
                Ok(Try::Held(first))
            }
            Some(Err(e)) => {
                let _ = client.lease_revoke(lease).await;
                Err(e)
            }
        }
    }

    async fn semaphore(&self, name: &str, owner: &str, permits: u32, ttl: Duration) -> Result<Try> {
        let mut client = self.client().await?;
        let (lease, granted) = self.grant(&mut client, ttl).await?;
        let token = format!("{lease:x}.{}", random_token(""));
        let prefix = self.sem_prefix(name);
        let put = client
            .put(
                format!("{prefix}{lease:x}"),
                format!("{token}|{owner}"),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| self.err(e))?;
        let my_rev = put.header().map_or(0, |h| h.revision());
        // Live permits created before ours: ours counts only if fewer than N.
        // Every later acquirer sees ours too, so live holders never exceed N.
        let before = client
            .get(
                prefix.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_max_create_revision(my_rev - 1)
                        .with_count_only(),
                ),
            )
            .await
            .map_err(|e| self.err(e))?
            .count();
        if before < i64::from(permits) {
            return Ok(Try::Acquired(Grant {
                name: name.to_owned(),
                token,
                fencing_token: my_rev.max(0) as u64,
                ttl_ms: granted.as_millis() as u64,
            }));
        }
        let _ = client.lease_revoke(lease).await;
        Ok(Try::Held(before.to_string()))
    }

    async fn renew(&self, kind: Kind, name: &str, token: &str, _ttl: Duration) -> Result<Outcome> {
        let mut client = self.client().await?;
        let lease = lease_of(token);
        if lease == 0 {
            return Ok(Outcome::Gone);
        }
        let key = self.key_of(kind, name, token);
        let current = client
            .get(key.clone(), None)
            .await
            .map_err(|e| self.err(e))?;
        match current.kvs().first() {
            None => return Ok(Outcome::Gone),
            Some(kv) if !holds(kv.value(), token) => return Ok(Outcome::NotYours),
            Some(_) => {}
        }
        let left = self.keep_alive_once(&client, lease).await?;
        if left <= 0 {
            return Ok(Outcome::Gone);
        }
        Ok(Outcome::Ok(Some(Duration::from_secs(left as u64))))
    }

    async fn release(&self, kind: Kind, name: &str, token: &str) -> Result<Outcome> {
        let mut client = self.client().await?;
        let key = self.key_of(kind, name, token);
        let current = client
            .get(key.clone(), None)
            .await
            .map_err(|e| self.err(e))?;
        let Some(kv) = current.kvs().first() else {
            return Ok(Outcome::Gone);
        };
        if !holds(kv.value(), token) {
            return Ok(Outcome::NotYours);
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(key.clone(), None)]);
        let resp = client.txn(txn).await.map_err(|e| self.err(e))?;
        if !resp.succeeded() {
            return Ok(Outcome::NotYours);
        }
        let _ = client.lease_revoke(lease_of(token)).await;
        Ok(Outcome::Ok(None))
    }

    async fn claim(&self, queue: &str, job: &str, owner: &str, ttl: Duration) -> Result<Claim> {
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        let done = self.job_key(queue, job, "done");
        // Cheap look first: a claimed or completed job costs one read.
        let peek = client
            .txn(Txn::new().and_then([
                TxnOp::get(done.clone(), None),
                TxnOp::get(claim.clone(), None),
            ]))
            .await
            .map_err(|e| self.err(e))?;
        let ops = peek.op_responses();
        if matches!(ops.first(), Some(TxnOpResponse::Get(g)) if !g.kvs().is_empty()) {
            return Ok(Claim::Completed);
        }
        if let Some(TxnOpResponse::Get(g)) = ops.get(1)
            && let Some(kv) = g.kvs().first()
        {
            return Ok(Claim::ClaimedByOther(owner_of(kv.value())));
        }
        let (lease, granted) = self.grant(&mut client, ttl).await?;
        let token = format!("{lease:x}.{}", random_token(""));
        let txn = Txn::new()
            .when([
                Compare::create_revision(done.clone(), CompareOp::Equal, 0),
                Compare::create_revision(claim.clone(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                claim.clone(),
                format!("{token}|{owner}"),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([
                TxnOp::get(done.clone(), None),
                TxnOp::get(claim.clone(), None),
            ]);
        let resp = match client.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                let _ = client.lease_revoke(lease).await;
                return Err(self.err(e));
            }
        };
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            return Ok(Claim::Claimed(Grant {
                name: format!("{queue}/{job}"),
                token,
                fencing_token: rev.max(0) as u64,
                ttl_ms: granted.as_millis() as u64,
            }));
        }
        let _ = client.lease_revoke(lease).await;
        let ops = resp.op_responses();
        let done_exists = matches!(ops.first(), Some(TxnOpResponse::Get(g)) if !g.kvs().is_empty());
        if done_exists {
            return Ok(Claim::Completed);
        }
        let holder = match ops.get(1) {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .map(|kv| owner_of(kv.value()))
                .unwrap_or_default(),
            _ => String::new(),
        };
        Ok(Claim::ClaimedByOther(holder))
    }

    async fn complete(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        let done = self.job_key(queue, job, "done");
        let current = client
            .get(claim.clone(), None)
            .await
            .map_err(|e| self.err(e))?;
        let Some(kv) = current.kvs().first() else {
            // Completed by us already (a retry)? Then it is done.
            let d = client
                .get(done.clone(), None)
                .await
                .map_err(|e| self.err(e))?;
            return Ok(match d.kvs().first() {
                Some(kv) if holds(kv.value(), token) => Outcome::Ok(None),
                Some(_) => Outcome::NotYours,
                None => Outcome::Gone,
            });
        };
        if !holds(kv.value(), token) {
            return Ok(Outcome::NotYours);
        }
        let (keep, _) = self.grant(&mut client, retention).await?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                claim.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([
                TxnOp::put(
                    done.clone(),
                    kv.value().to_vec(),
                    Some(PutOptions::new().with_lease(keep)),
                ),
                TxnOp::delete(claim.clone(), None),
            ]);
        let resp = client.txn(txn).await.map_err(|e| self.err(e))?;
        if !resp.succeeded() {
            let _ = client.lease_revoke(keep).await;
            return Ok(Outcome::NotYours);
        }
        let _ = client.lease_revoke(lease_of(token)).await;
        Ok(Outcome::Ok(None))
    }
}
