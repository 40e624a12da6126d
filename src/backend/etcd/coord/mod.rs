//! Coordination on etcd: every lock, permit, claim and read-write lock hold
//! (`rwlock`) is a key bound to its
//! own lease; the key is `<prefix><lease hex>.<nonce>` (the whole token, so a
//! release is one delete) and its value is `<token>|<owner>`. Renew = one
//! keep-alive of that lease plus a read proving the key is still ours (an
//! expired lease answers TTL 0 and is never re-created). Fair locks follow
//! etcd's own lock recipe (`queue`): each waiter writes a key under the
//! lock's prefix and watches only the key with the next lower
//! `create_revision` (no thundering herd).
//!
//! The lease life cycle (grant → compare-and-put → revoke), the deadline and
//! the error classification are the election's: [`EtcdStore`].

mod hub;
mod jobs;
mod pool;
mod queue;
mod rwlock;
mod sem;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::backend::BackendError;
use crate::backend::coordination::{
    Acquire, CoordError, Coordinator, Grant, Kind, Object, Outcome, Result, Token, TokenKind, Try,
    nap,
};
use crate::backend::etcd::EtcdBackend;
use crate::backend::etcd::store::{Created, EtcdStore, Lease, revision_of};

/// Deadline of one etcd call when none is configured.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);

/// Pause between tries of an off-path revoke while etcd refuses connections.
const REVOKE_RETRY: Duration = Duration::from_millis(100);

/// The etcd [`Coordinator`], sharing the election's client.
pub struct EtcdCoord {
    store: Arc<EtcdStore>,
    prefix: String,
    deadline: Duration,
    /// Lease revokes run off the answer path (after a release): owned here,
    /// each bounded by the deadline, waited for by [`Coordinator::close`].
    revokes: Mutex<JoinSet<()>>,
    /// The shared watches of lock queues ([`hub`]).
    hubs: hub::Hubs,
    /// Leases of released locks, for the next acquisition ([`pool`]).
    pool: pool::Pool,
}

impl EtcdCoord {
    /// Coordination keys under `<election key>/../_coord/` (the election's
    /// prefix); every etcd call gets [`DEFAULT_DEADLINE`].
    pub fn new(backend: Arc<EtcdBackend>, prefix: &str) -> Self {
        EtcdCoord {
            store: backend.store(),
            prefix: format!("{prefix}_coord/"),
            deadline: DEFAULT_DEADLINE,
            revokes: Mutex::new(JoinSet::new()),
            hubs: hub::Hubs::default(),
            pool: pool::Pool::default(),
        }
    }

    /// Give every etcd call at most `deadline` (at least 1 ms): a request
    /// answers within its `wait` plus one deadline, however etcd behaves.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline.max(Duration::from_millis(1));
        self
    }

    /// The limit of the next call: the deadline, cut to what is left of the
    /// current request's budget ([`crate::budget`]).
    fn limit(&self) -> Option<Duration> {
        Some(crate::budget::limit(self.deadline))
    }

    /// Run one etcd call under the deadline.
    async fn call<T>(
        &self,
        what: &'static str,
        f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        Ok(self.store.call(self.limit(), what, f).await?)
    }

    async fn client(&self) -> Result<Client> {
        Ok(self.store.client_within(self.limit()).await?)
    }

    /// Revoke a lease we no longer need, within the request's budget; when
    /// that fails (the budget is spent, etcd is slow) it is revoked off the
    /// answer path ([`EtcdCoord::revoke_later`]), so its key does not stay
    /// for the lease's whole TTL.
    async fn drop_lease(&self, client: &mut Client, lease: i64) {
        if self
            .store
            .revoke(client, lease, self.limit())
            .await
            .is_err()
        {
            self.revoke_later(client.clone(), lease);
        }
    }

    /// Give `lease` up after `error`. When etcd did not answer in time, the
    /// failed call may still have been applied (a key bound to the lease that
    /// would block a lock's queue for the lease's whole TTL, etcd-io/etcd#21128):
    /// revoke it off the answer path, where it has a whole deadline.
    async fn abandon(&self, client: &mut Client, lease: i64, error: &CoordError) {
        if unanswered(error) {
            self.revoke_later(client.clone(), lease);
        } else {
            self.drop_lease(client, lease).await;
        }
    }

    /// `result`, after giving `lease` up when it is an error
    /// ([`EtcdCoord::abandon`]).
    async fn or_abandon<T>(&self, client: &mut Client, lease: i64, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.abandon(client, lease, e).await;
        }
        result
    }

    /// Run `txn`, a compare-and-put binding a key to `lease`
    /// ([`EtcdStore::put_under`]); when etcd does not answer in time, give
    /// the lease up off the answer path ([`EtcdCoord::abandon`]).
    async fn put_under(&self, client: &mut Client, lease: Lease, txn: Txn) -> Result<Created> {
        match self.store.put_under(client, lease, txn, self.limit()).await {
            Ok(created) => Ok(created),
            Err(e) => {
                let e = CoordError::Backend(e);
                if unanswered(&e) {
                    self.revoke_later(client.clone(), lease.id);
                }
                Err(e)
            }
        }
    }

    /// Grant a lease of `ttl`, then [`EtcdCoord::put_under`] it `txn(lease id)`.
    async fn create(
        &self,
        client: &mut Client,
        ttl: Duration,
        txn: impl FnOnce(i64) -> Txn,
    ) -> Result<Created> {
        let lease = self.store.grant(client, ttl, self.limit()).await?;
        self.put_under(client, lease, txn(lease.id)).await
    }

    /// Revoke `lease` off the answer path, in a task this coordinator owns
    /// (bounded by the deadline, tried again while etcd refuses connections;
    /// if it fails the lease expires with its TTL).
    pub(super) fn revoke_later(&self, mut client: Client, lease: i64) {
        let store = self.store.clone();
        // Off the answer path: the whole deadline, not the request's budget.
        let deadline = self.deadline;
        let limit = Some(deadline);
        let mut tasks = self.revokes.lock().unwrap_or_else(|e| e.into_inner());
        // Reap the revokes that ended, so the set holds only running ones.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            // An etcd that refuses connections (restarting) is tried again
            // until the deadline; any other answer ends it.
            let until = Instant::now() + deadline;
            while let Err(BackendError::Unreachable { .. }) =
                store.revoke(&mut client, lease, limit).await
                && Instant::now() < until
            {
                tokio::time::sleep(REVOKE_RETRY).await;
            }
        });
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
    /// The prefix under which the keys of `object` live (none for jobs:
    /// nobody waits on one).
    fn prefix_of(&self, object: Object<'_>) -> Option<String> {
        match object {
            Object::Lock(name) => Some(self.lock_prefix(name)),
            Object::Semaphore(name) => Some(self.sem_prefix(name)),
            Object::RwLock(name) => Some(self.rw_prefix(name)),
            Object::Job { .. } => None,
        }
    }
    /// The key of a lock or permit: `<prefix><lease hex>.<nonce>`. The whole
    /// token is in the key's name, so a key that exists under this name is
    /// the token's own: a release is one delete, with no read before it.
    fn key_of(&self, prefix: &str, token: &Token) -> String {
        format!("{prefix}{:x}.{}", token.lease, token.nonce)
    }
    /// The token and key of the hold `token` has on a lock, permit or
    /// read-write lock; `None` when the token cannot hold `object`.
    fn held(&self, object: Object<'_>, token: &str) -> Option<(Token, String)> {
        match object {
            Object::Lock(_) | Object::Semaphore(_) => {
                let t = parse(object.kind(), token)?;
                let key = self.key_of(&self.prefix_of(object)?, &t);
                Some((t, key))
            }
            Object::RwLock(name) => self.rw_parts(name, token),
            Object::Job { .. } => None,
        }
    }

    /// One keep-alive of `lease`: the TTL it now has, 0 when it is gone.
    async fn keep_alive_once(&self, client: &Client, lease: i64) -> Result<i64> {
        // etcd-client's opening of the stream sends a first request and
        // reads its answer without giving us its TTL: this second one is
        // the one read (renewals report the TTL left).
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
                backend: crate::backend::etcd::store::BACKEND,
                reason: "the lease keep-alive stream ended without an answer".into(),
            })),
        }
    }

    /// The compare-and-put of a plain lock: free only when no key at all
    /// lives under the name's prefix (no holder and no fair waiter; an empty
    /// range compares as revision 0), else read the holder.
    fn lock_txn(&self, name: &str, owner: &str, token: &Token) -> Txn {
        let prefix = self.lock_prefix(name);
        Txn::new()
            .when([Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put(
                self.key_of(&prefix, token),
                format!("{token}|{owner}"),
                Some(PutOptions::new().with_lease(token.lease)),
            )])
            .or_else([TxnOp::get(prefix, Some(oldest()))])
    }

    /// The first (oldest) key under `prefix`: the lock's holder.
    async fn first(&self, client: &mut Client, prefix: &str) -> Result<Option<String>> {
        let r = self.call("get", client.get(prefix, Some(oldest()))).await?;
        Ok(r.kvs().first().map(|kv| owner_of(kv.value())))
    }
}

/// The holder a failed [`EtcdCoord::lock_txn`] read.
fn held_by(resp: &etcd_client::TxnResponse) -> String {
    resp.op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| owner_of(kv.value())),
            _ => None,
        })
        .unwrap_or_default()
}

/// Whether `error` says etcd did not answer (in time): what was asked may
/// still have been applied.
fn unanswered(error: &CoordError) -> bool {
    matches!(
        error,
        CoordError::Backend(BackendError::Timeout { .. } | BackendError::Unreachable { .. })
    )
}

/// The oldest key under a prefix (the lock's holder).
fn oldest() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
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

    fn deadline(&self) -> Option<Duration> {
        Some(self.deadline)
    }

    async fn acquire(&self, what: Acquire<'_>, owner: &str, ttl: Duration) -> Result<Try> {
        match what {
            Acquire::Lock(name) => self.try_lock(name, owner, ttl).await,
            Acquire::FairLock { name, wait } => self.queue_for(name, owner, ttl, wait).await,
            Acquire::Semaphore { name, permits } => self.permit(name, owner, permits, ttl).await,
            Acquire::RwLock { name, mode, intent } => {
                self.rw_acquire(name, owner, mode, ttl, intent).await
            }
            Acquire::Job { queue, job } => self.claim_job(queue, job, owner, ttl).await,
        }
    }

    async fn changed(&self, object: Object<'_>, _seen: u64, until: Instant) -> Result<()> {
        let Some(prefix) = self.prefix_of(object) else {
            // Nobody waits on a job claim.
            nap(until).await;
            return Ok(());
        };
        // An empty lock (or read-write lock) is free: answer at once.
        let lock = object.kind() != Kind::Semaphore;
        self.changed_under(&prefix, lock, until).await
    }

    async fn renew(&self, object: Object<'_>, token: &str, _ttl: Duration) -> Result<Outcome> {
        if let Object::Job { queue, job } = object {
            return self.renew_job(queue, job, token).await;
        }
        let Some((t, key)) = self.held(object, token) else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        self.renew_key(&mut client, &key, token, t.lease).await
    }

    async fn release(&self, object: Object<'_>, token: &str) -> Result<Outcome> {
        if let Object::Job { queue, job } = object {
            return self.release_job(queue, job, token).await;
        }
        let Some((t, key)) = self.held(object, token) else {
            return Ok(Outcome::Gone);
        };
        let mut client = self.client().await?;
        // The key's name holds the whole token: if it exists it is ours, and
        // one delete releases it (the next waiter's watch sees the delete).
        let deleted = self.call("delete", client.delete(key, None)).await?;
        if deleted.deleted() == 0 {
            return Ok(Outcome::Gone);
        }
        // The lease holds no key any more: keep it for the next acquisition,
        // or revoke it off the answer path.
        if !self.pool.released(t.lease) {
            self.revoke_later(client, t.lease);
        }
        Ok(Outcome::Ok(None))
    }

    async fn complete(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        self.complete_job(queue, job, token, retention).await
    }

    async fn give_up(&self, name: &str, id: &str) -> Result<()> {
        self.rw_drop_intent(name, id).await
    }

    async fn close(&self) {
        let mut tasks =
            std::mem::take(&mut *self.revokes.lock().unwrap_or_else(|e| e.into_inner()));
        let waited = tokio::time::timeout(self.deadline, async {
            while tasks.join_next().await.is_some() {}
        });
        let _ = waited.await;
    }
}

impl EtcdCoord {
    /// One attempt at plain lock `name` ([`Acquire::Lock`]).
    async fn try_lock(&self, name: &str, owner: &str, ttl: Duration) -> Result<Try> {
        let mut client = self.client().await?;
        // A lease kept by a release: one round trip ([`EtcdCoord::lock_pooled`]).
        if let Some(answer) = self.lock_pooled(&client, name, owner, ttl).await? {
            return Ok(answer);
        }
        let prefix = self.lock_prefix(name);
        // Cheap look first: a busy lock costs one read, not a lease.
        if let Some(holder) = self.first(&mut client, &prefix).await? {
            return Ok(Try::Held(holder));
        }
        let (lease, at) = self.lock_lease(&mut client, ttl).await?;
        let token = Token::new(TokenKind::Lock, lease.id);
        let txn = self.lock_txn(name, owner, &token);
        let created = self.put_under(&mut client, lease, txn).await?;
        if created.resp.succeeded() {
            self.holding(lease, ttl, at);
            let rev = revision_of(created.resp.header());
            return Ok(Try::Acquired(grant(name, &token, rev, created.lease.ttl)));
        }
        Ok(Try::Held(held_by(&created.resp)))
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
