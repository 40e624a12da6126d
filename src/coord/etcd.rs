//! Coordination on etcd: every lock, permit and claim is a key bound to its
//! own lease; the key is `<prefix><lease hex>.<nonce>` (the whole token, so a
//! release is one delete) and its value is `<token>|<owner>`. Renew = one keep-alive of that lease plus a read proving
//! the key is still ours (an expired lease answers TTL 0 and is never
//! re-created). Fair locks follow etcd's own lock recipe: each waiter writes a
//! key under the lock's prefix and watches only the key with the next lower
//! `create_revision` (no thundering herd).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::time::Instant;

use super::{Claim, CoordError, Coordinator, Grant, Kind, Outcome, Result, Token, TokenKind, Try};
use crate::backend::BackendError;
use crate::backend::etcd::EtcdBackend;

/// Deadline of one etcd call when none is configured.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);

/// The etcd [`Coordinator`], sharing the election's client.
pub struct EtcdCoord {
    backend: Arc<EtcdBackend>,
    prefix: String,
    deadline: Duration,
}

impl EtcdCoord {
    /// Coordination keys under `<election key>/../_coord/` (the election's
    /// prefix); every etcd call gets [`DEFAULT_DEADLINE`].
    pub fn new(backend: Arc<EtcdBackend>, prefix: &str) -> Self {
        EtcdCoord {
            backend,
            prefix: format!("{prefix}_coord/"),
            deadline: DEFAULT_DEADLINE,
        }
    }

    /// Give every etcd call at most `deadline` (at least 1 ms): a request
    /// answers within its `wait` plus one deadline, however etcd behaves.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline.max(Duration::from_millis(1));
        self
    }

    /// Run one etcd call under the deadline.
    async fn call<T>(
        &self,
        what: &'static str,
        f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.deadline, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.err(e)),
            Err(_) => Err(CoordError::Backend(BackendError::Timeout {
                backend: "etcd",
                call: what,
                timeout_ms: self.deadline.as_millis() as u64,
            })),
        }
    }

    async fn client(&self) -> Result<Client> {
        match tokio::time::timeout(self.deadline, self.backend.client()).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(CoordError::Backend(BackendError::Timeout {
                backend: "etcd",
                call: "connect",
                timeout_ms: self.deadline.as_millis() as u64,
            })),
        }
    }

    fn err(&self, e: etcd_client::Error) -> CoordError {
        CoordError::Backend(self.backend.classify(e, false))
    }

    /// Revoke a lease we no longer need, under the deadline; a failure is
    /// harmless (the lease expires with its TTL).
    async fn drop_lease(&self, client: &mut Client, lease: i64) {
        let _ = self.call("lease revoke", client.lease_revoke(lease)).await;
    }

    /// Revoke `lease` after `error`, unless etcd did not answer in time
    /// (then the revoke would only add a deadline; the lease expires anyway).
    async fn abandon(&self, client: &mut Client, lease: i64, error: &CoordError) {
        if !matches!(
            error,
            CoordError::Backend(BackendError::Timeout { .. } | BackendError::Unreachable { .. })
        ) {
            self.drop_lease(client, lease).await;
        }
    }

    /// One prefix per lock name, shared by plain and fair acquirers: the
    /// holder is the key with the lowest `create_revision`.
    fn lock_prefix(&self, name: &str) -> String {
        format!("{}locks/{name}/", self.prefix)
    }
    fn sem_prefix(&self, name: &str) -> String {
        format!("{}sem/{name}/", self.prefix)
    }
    fn job_key(&self, queue: &str, job: &str, part: &str) -> String {
        format!("{}jobs/{queue}/{job}/{part}", self.prefix)
    }
    fn prefix_of(&self, kind: Kind, name: &str) -> String {
        match kind {
            Kind::Lock => self.lock_prefix(name),
            Kind::Semaphore => self.sem_prefix(name),
        }
    }
    /// The key of a lock or permit: `<prefix><lease hex>.<nonce>`. The whole
    /// token is in the key's name, so a key that exists under this name is
    /// the token's own: a release is one delete, with no read before it.
    fn key_of(&self, kind: Kind, name: &str, token: &Token) -> String {
        format!(
            "{}{:x}.{}",
            self.prefix_of(kind, name),
            token.lease,
            token.nonce
        )
    }

    async fn grant(&self, client: &mut Client, ttl: Duration) -> Result<(i64, Duration)> {
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let g = self
            .call("lease grant", client.lease_grant(secs, None))
            .await?;
        Ok((g.id(), Duration::from_secs(g.ttl().max(1) as u64)))
    }

    /// One keep-alive of `lease`: the TTL it now has, 0 when it is gone.
    async fn keep_alive_once(&self, client: &Client, lease: i64) -> Result<i64> {
        let once = async {
            let (mut keeper, mut stream) = client.lease_client().keep_alive(lease).await?;
            keeper.keep_alive().await?;
            stream.message().await
        };
        match self.call("lease keep-alive", once).await? {
            Some(r) => Ok(r.ttl()),
            // The stream ended without an answer (etcd restarting): that says
            // nothing about the lease, so it is an error, not "gone".
            None => Err(CoordError::Backend(BackendError::WatchEnded {
                backend: "etcd",
                reason: "the lease keep-alive stream ended without an answer".into(),
            })),
        }
    }

    /// The first (oldest) key under `prefix`: the lock's holder.
    async fn first(&self, client: &mut Client, prefix: &str) -> Result<Option<String>> {
        let r = self
            .call(
                "get",
                client.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(1),
                    ),
                ),
            )
            .await?;
        Ok(r.kvs().first().map(|kv| owner_of(kv.value())))
    }
}

/// The token's parts, when it is a version-1 token of a kind that serves `kind`.
fn parse(kind: Kind, token: &str) -> Option<Token> {
    Token::parse(token).filter(|t| t.kind.serves(kind) && t.lease > 0)
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

fn grant(name: &str, token: &Token, fencing: i64, ttl: Duration) -> Grant {
    Grant {
        name: name.to_owned(),
        token: token.to_string(),
        fencing_token: fencing.max(0) as u64,
        ttl_ms: ttl.as_millis() as u64,
    }
}

#[async_trait]
impl Coordinator for EtcdCoord {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn queues(&self) -> bool {
        true
    }

    async fn lock(&self, name: &str, owner: &str, ttl: Duration) -> Result<Try> {
        let mut client = self.client().await?;
        let prefix = self.lock_prefix(name);
        // Cheap look first: a busy lock costs one read, not a lease.
        if let Some(holder) = self.first(&mut client, &prefix).await? {
            return Ok(Try::Held(holder));
        }
        let (lease, granted) = self.grant(&mut client, ttl).await?;
        let token = Token::new(TokenKind::Lock, lease);
        let key = self.key_of(Kind::Lock, name, &token);
        // Free only when no key at all lives under the name's prefix: no
        // holder and no fair waiter (an empty range compares as revision 0).
        let txn = Txn::new()
            .when([Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put(
                key,
                format!("{token}|{owner}"),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(
                prefix.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            )]);
        let resp = match self.call("txn", client.txn(txn)).await {
            Ok(r) => r,
            Err(e) => {
                self.abandon(&mut client, lease, &e).await;
                return Err(e);
            }
        };
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            return Ok(Try::Acquired(grant(name, &token, rev, granted)));
        }
        self.drop_lease(&mut client, lease).await;
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
        let deadline = Instant::now() + wait;
        let mut client = self.client().await?;
        let (lease, granted) = self.grant(&mut client, ttl).await?;
        let token = Token::new(TokenKind::FairLock, lease);
        let prefix = self.lock_prefix(name);
        let my_key = self.key_of(Kind::Lock, name, &token);
        // The nearest key ahead of ours (a plain holder or a fair waiter):
        // with `limit(2)`, whether it is the only one ahead too.
        let nearest = || {
            GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(2)
        };
        // Join the queue and look ahead in one txn: the read runs before the
        // put, so it sees exactly the keys created before ours.
        let join = Txn::new().and_then([
            TxnOp::get(prefix.clone(), Some(nearest())),
            TxnOp::put(
                my_key.clone(),
                format!("{token}|{owner}"),
                Some(PutOptions::new().with_lease(lease)),
            ),
        ]);
        let joined = match self.call("txn", client.txn(join)).await {
            Ok(r) => r,
            Err(e) => {
                self.abandon(&mut client, lease, &e).await;
                return Err(e);
            }
        };
        let my_rev = joined.header().map_or(0, |h| h.revision());
        // (the nearest key ahead, a revision it existed at, whether it is
        // the last key ahead)
        type Ahead = Option<(Vec<u8>, i64, bool)>;
        let read_ahead = |kvs: &[etcd_client::KeyValue], rev: i64| -> Ahead {
            kvs.first()
                .map(|kv| (kv.key().to_vec(), rev, kvs.len() == 1))
        };
        let first = joined
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                // The keys it saw are as they were at `my_rev` too (our put
                // touched only our key): watching from `my_rev + 1` starts at
                // the head, where etcd serves a watch at once (an older start
                // revision waits for etcd's catch-up loop, up to 100 ms).
                TxnOpResponse::Get(g) => Some(read_ahead(g.kvs(), my_rev)),
                _ => None,
            })
            .flatten();
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
        // A later look at the keys ahead. `limit` applies after the
        // revision filter.
        let ahead = |client: Client| {
            let prefix = prefix.clone();
            async move {
                let mut client = client;
                let r = self
                    .call(
                        "get",
                        client.get(prefix, Some(nearest().with_max_create_revision(my_rev - 1))),
                    )
                    .await?;
                let rev = r.header().map_or(0, |h| h.revision());
                Ok::<_, CoordError>(read_ahead(r.kvs(), rev))
            }
        };
        let queue = async {
            let mut next = first;
            while let Some((key, rev, last)) = next {
                // Watch from the head (etcd serves such a watch at once; one
                // from an older revision waits for etcd's catch-up loop, up
                // to 100 ms, which a busy queue would feel on every handoff).
                let mut w = self
                    .call("watch", client.clone().watch(key.clone(), None))
                    .await?;
                // The created answer says the revision the watch starts
                // after; if anything was written since `rev`, look whether
                // the key is still there (its delete then comes later).
                let started = self
                    .call("watch", w.message())
                    .await?
                    .filter(|m| m.created() && !m.canceled())
                    .and_then(|m| m.header().map(|h| h.revision()));
                let gone = match started {
                    None => false,
                    Some(at) if at <= rev => false,
                    Some(_) => self
                        .call(
                            "get",
                            client
                                .clone()
                                .get(key.clone(), Some(GetOptions::new().with_keys_only())),
                        )
                        .await?
                        .kvs()
                        .is_empty(),
                };
                if gone {
                    if last {
                        return Ok(());
                    }
                    next = ahead(client.clone()).await?;
                    continue;
                }
                if started.is_none() {
                    next = ahead(client.clone()).await?;
                    continue;
                }
                loop {
                    let Some(msg) = w.message().await.map_err(|e| self.err(e))? else {
                        break;
                    };
                    if msg.canceled() {
                        break;
                    }
                    if msg
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        // Keys are never created ahead of ours: when the last
                        // one ahead goes, the lock is ours without a look.
                        if last {
                            return Ok(());
                        }
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
            r = queue => Some(r),
            _ = keeper => None,
            _ = tokio::time::sleep_until(deadline) => None,
        };
        match outcome {
            Some(Ok(())) => Ok(Try::Acquired(grant(name, &token, my_rev, granted))),
            None => {
                // Timed out in the queue: leave it, and say who holds the
                // lock (both calls at once: one deadline, not two).
                let mut reader = client.clone();
                let (_, first) = tokio::join!(
                    self.drop_lease(&mut client, lease),
                    self.first(&mut reader, &prefix)
                );
                Ok(Try::Held(first.ok().flatten().unwrap_or_default()))
            }
            Some(Err(e)) => {
                self.abandon(&mut client, lease, &e).await;
                Err(e)
            }
        }
    }

    async fn semaphore(&self, name: &str, owner: &str, permits: u32, ttl: Duration) -> Result<Try> {
        let mut client = self.client().await?;
        let (lease, granted) = self.grant(&mut client, ttl).await?;
        let token = Token::new(TokenKind::Permit, lease);
        let prefix = self.sem_prefix(name);
        let put = match self
            .call(
                "put",
                client.put(
                    self.key_of(Kind::Semaphore, name, &token),
                    format!("{token}|{owner}"),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            )
            .await
        {
            Ok(p) => p,
            Err(e) => {
                self.abandon(&mut client, lease, &e).await;
                return Err(e);
            }
        };
        let my_rev = put.header().map_or(0, |h| h.revision());
        // Live permits created before ours: ours counts only if fewer than N.
        // Every later acquirer sees ours too, so live holders never exceed N.
        // Count the keys returned: etcd computes a range's `count` before the
        // `max_create_revision` filter, so `count` would include ours.
        let before = match self
            .call(
                "get",
                client.get(
                    prefix.clone(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_max_create_revision(my_rev - 1),
                    ),
                ),
            )
            .await
        {
            Ok(r) => r.kvs().len() as u64,
            Err(e) => {
                self.abandon(&mut client, lease, &e).await;
                return Err(e);
            }
        };
        if before < u64::from(permits) {
            return Ok(Try::Acquired(grant(name, &token, my_rev, granted)));
        }
        self.drop_lease(&mut client, lease).await;
        Ok(Try::Full(before))
    }

    async fn changed(&self, kind: Kind, name: &str, _seen: u64, until: Instant) -> Result<()> {
        let mut client = self.client().await?;
        let prefix = self.prefix_of(kind, name);
        // Read first so the watch starts where the read saw the range: a
        // release between the caller's attempt and this read shows here.
        // Wake only when one of the keys seen now goes: keys that come and
        // go meanwhile are losing acquirers (a semaphore's losers write and
        // revoke a key) or waiters, and waking on them would have every
        // waiter's retry wake every other waiter, for ever.
        let r = self
            .call(
                "get",
                client.get(
                    prefix.clone(),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                ),
            )
            .await?;
        let present: std::collections::HashSet<Vec<u8>> =
            r.kvs().iter().map(|kv| kv.key().to_vec()).collect();
        if kind == Kind::Lock && present.is_empty() {
            return Ok(());
        }
        let rev = r.header().map_or(0, |h| h.revision());
        let mut w = self
            .call(
                "watch",
                client.watch(
                    prefix,
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(rev + 1),
                    ),
                ),
            )
            .await?;
        let deleted = async {
            loop {
                let Some(msg) = w.message().await.map_err(|e| self.err(e))? else {
                    return Ok(());
                };
                if msg.canceled()
                    || msg.events().iter().any(|e| {
                        e.event_type() == EventType::Delete
                            && e.kv().is_some_and(|kv| present.contains(kv.key()))
                    })
                {
                    return Ok(());
                }
            }
        };
        tokio::select! {
            r = deleted => r,
            _ = tokio::time::sleep_until(until) => Ok(()),
        }
    }

    async fn renew(&self, kind: Kind, name: &str, token: &str, _ttl: Duration) -> Result<Outcome> {
        let Some(t) = parse(kind, token) else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        let key = self.key_of(kind, name, &t);
        let current = self.call("get", client.get(key, None)).await?;
        match current.kvs().first() {
            None => return Ok(Outcome::Gone),
            Some(kv) if !holds(kv.value(), token) => return Ok(Outcome::NotYours),
            Some(_) => {}
        }
        let left = self.keep_alive_once(&client, t.lease).await?;
        if left <= 0 {
            return Ok(Outcome::Gone);
        }
        Ok(Outcome::Ok(Some(Duration::from_secs(left as u64))))
    }

    async fn release(&self, kind: Kind, name: &str, token: &str) -> Result<Outcome> {
        let Some(t) = parse(kind, token) else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        // The key's name holds the whole token: if it exists it is ours, and
        // one delete releases it (the next waiter's watch sees the delete).
        let key = self.key_of(kind, name, &t);
        let deleted = self.call("delete", client.delete(key, None)).await?;
        if deleted.deleted() == 0 {
            return Ok(Outcome::Gone);
        }
        // The lease holds no key any more: revoke it off the answer path
        // (under the deadline; if that fails it expires with its TTL).
        let deadline = self.deadline;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(deadline, client.lease_revoke(t.lease)).await;
        });
        Ok(Outcome::Ok(None))
    }

    async fn claim(&self, queue: &str, job: &str, owner: &str, ttl: Duration) -> Result<Claim> {
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        let done = self.job_key(queue, job, "done");
        // Cheap look first: a claimed or completed job costs one read.
        let peek = self
            .call(
                "txn",
                client.txn(Txn::new().and_then([
                    TxnOp::get(done.clone(), None),
                    TxnOp::get(claim.clone(), None),
                ])),
            )
            .await?;
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
        let token = Token::new(TokenKind::Job, lease);
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
        let resp = match self.call("txn", client.txn(txn)).await {
            Ok(r) => r,
            Err(e) => {
                self.abandon(&mut client, lease, &e).await;
                return Err(e);
            }
        };
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            return Ok(Claim::Claimed(grant(
                &format!("{queue}/{job}"),
                &token,
                rev,
                granted,
            )));
        }
        self.drop_lease(&mut client, lease).await;
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
        let Some(t) = Token::parse(token).filter(|t| t.kind == TokenKind::Job && t.lease > 0)
        else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        let claim = self.job_key(queue, job, "claim");
        let done = self.job_key(queue, job, "done");
        let current = self.call("get", client.get(claim.clone(), None)).await?;
        let Some(kv) = current.kvs().first() else {
            // Completed by us already (a retry)? Then it is done.
            let d = self.call("get", client.get(done.clone(), None)).await?;
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
        let resp = match self.call("txn", client.txn(txn)).await {
            Ok(r) => r,
            Err(e) => {
                self.abandon(&mut client, keep, &e).await;
                return Err(e);
            }
        };
        if !resp.succeeded() {
            self.drop_lease(&mut client, keep).await;
            return Ok(Outcome::NotYours);
        }
        self.drop_lease(&mut client, t.lease).await;
        Ok(Outcome::Ok(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_lease_whatever_its_first_hex_digit() {
        // Lease ids of a cluster whose member id starts with 0x0f print as
        // "f…": the kind and the lease must still be read right.
        for lease in [0x0f90_1234_5678_9abc_i64, 0x7fff_ffff_ffff_ffff, 1, 0xabc] {
            for kind in [
                TokenKind::Lock,
                TokenKind::FairLock,
                TokenKind::Permit,
                TokenKind::Job,
            ] {
                let t = Token::new(kind, lease);
                let back = Token::parse(&t.to_string()).expect("a token we issued parses");
                assert_eq!((back.kind, back.lease), (kind, lease), "{t}");
            }
        }
        let plain = Token::new(TokenKind::Lock, 0x0f90_1234_5678_9abc).to_string();
        assert!(plain.starts_with("v1.l.f901234"), "{plain}");
        assert!(parse(Kind::Lock, &plain).is_some());
        assert!(parse(Kind::Semaphore, &plain).is_none());
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for bad in [
            "",
            "f90.abc",
            "v2.l.1.00000000000000000000000000000000",
            "v1.x.1.00000000000000000000000000000000",
            "v1.l.1.0000",
            "v1.l.zz.00000000000000000000000000000000",
            "v1.l.1.00000000000000000000000000000000.extra",
        ] {
            assert!(Token::parse(bad).is_none(), "{bad:?} parsed");
        }
    }
}
