//! Waiting on etcd: the fair lock's queue (etcd's `concurrency` lock recipe:
//! each waiter's key under the lock's prefix, ordered by `create_revision`,
//! and each waiter watches only the key just ahead of its own), and
//! [`EtcdCoord::changed_under`], the wake-up of plain waiters.

use std::collections::HashSet;
use std::time::Duration;

use etcd_client::{
    Client, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use tokio::time::Instant;

use super::hub::{Seen, Subscription};
use super::{EtcdCoord, grant};
use crate::backend::coordination::{CoordError, Result, Token, TokenKind, Try};
use crate::backend::etcd::store::revision_of;

/// Most keys ahead a joining waiter reads by name. With more ahead, it waits
/// key by key instead (the nearest key ahead, then a look).
const MAX_AHEAD: i64 = 256;

/// The nearest key ahead of ours: its name, a revision it existed at, and
/// whether it is the last key ahead.
type Ahead = Option<(Vec<u8>, i64, bool)>;

/// What became of the key ahead while we watched it.
enum Ahead1 {
    /// It was deleted.
    Gone,
    /// The watch ended or could not say: look at the keys ahead again.
    Unknown,
}

/// The nearest keys ahead of ours, newest first: with `limit(2)`, whether
/// the nearest is the only one ahead too.
fn nearest() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
}

/// The keys ahead of a joining waiter, by name, newest first, at most
/// [`MAX_AHEAD`] of them (the txn's count says whether that is all).
fn all_ahead() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(MAX_AHEAD)
}

/// What the join's read saw: the names of all keys ahead when it saw them
/// all, and the nearest key ahead.
struct Joined {
    names: Option<HashSet<Vec<u8>>>,
    first: Ahead,
}

fn joined(resp: &etcd_client::TxnResponse, my_rev: i64) -> Joined {
    let get = resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let Some(g) = get else {
        return Joined {
            names: Some(HashSet::new()),
            first: None,
        };
    };
    let kvs = g.kvs();
    let names =
        (g.count() == kvs.len() as i64).then(|| kvs.iter().map(|kv| kv.key().to_vec()).collect());
    // The keys it saw are as they were at `my_rev` too (our put touched only
    // our key): watching from `my_rev + 1` starts at the head, where etcd
    // serves a watch at once (an older start revision waits for etcd's
    // catch-up loop, up to 100 ms).
    let first = kvs
        .first()
        .map(|kv| (kv.key().to_vec(), my_rev, kvs.len() == 1));
    Joined { names, first }
}

fn read_ahead(kvs: &[KeyValue], rev: i64) -> Ahead {
    kvs.first()
        .map(|kv| (kv.key().to_vec(), rev, kvs.len() == 1))
}

/// How a waiter's time in the queue ended.
enum Queued {
    /// Every key ahead of it is gone: it holds the lock.
    Head,
    /// Its wait ran out.
    TimedOut,
    /// Its own key is gone (its lease expired or was revoked, or the key was
    /// deleted): it holds nothing, and never will by this request.
    Lost,
    /// A call failed.
    Failed(CoordError),
}

/// Keep the waiter's lease alive while it queues (every third of its TTL,
/// at least every 500 ms). Returns when etcd says the lease is gone (a
/// keep-alive answered with TTL 0): the waiter's key went with it. On any
/// other failure it stops renewing and waits for ever (the lease then
/// expires, and the waiter sees its own key go, when etcd answers again).
/// The lease was just granted or refreshed, so the keep-alive stream opens
/// only after the first third of its TTL (opening it renews once): a waiter
/// served sooner (most of them, in a busy queue) costs etcd no keep-alive.
async fn keep_queued(client: Client, lease: i64, granted: Duration) {
    let every = (granted / 3).max(Duration::from_millis(500));
    tokio::time::sleep(every).await;
    let Ok((mut k, mut s)) = client.lease_client().keep_alive(lease).await else {
        return std::future::pending::<()>().await;
    };
    loop {
        tokio::time::sleep(every).await;
        if k.keep_alive().await.is_err() {
            return std::future::pending::<()>().await;
        }
        match s.message().await {
            Ok(Some(r)) if r.ttl() <= 0 => return,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return std::future::pending::<()>().await,
        }
    }
}

impl EtcdCoord {
    /// Take lock `name` in arrival order, waiting up to `wait`
    /// ([`crate::backend::coordination::Acquire::FairLock`]).
    ///
    /// The waiter watches the deletes under the lock's prefix from before it
    /// joins, joins (one txn: read the names of the keys ahead, put ours),
    /// and holds the lock once every key ahead is deleted: no read after any
    /// wake, so a handoff costs the holder's delete and nothing more. With
    /// more than [`MAX_AHEAD`] ahead, or when the watch ends, it waits key by
    /// key ([`EtcdCoord::queue`]).
    pub(super) async fn queue_for(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Try> {
        let deadline = Instant::now() + wait;
        let mut client = self.client().await?;
        let prefix = self.lock_prefix(name);
        // The watch must start before the join; the grant runs meanwhile.
        let watcher = client.clone();
        let (leased, deletes) = tokio::join!(
            self.lock_lease(&mut client, ttl),
            self.hubs.of(&prefix).subscribe(self, &watcher)
        );
        let (lease, at) = leased?;
        let deletes = self.or_abandon(&mut client, lease.id, deletes).await?;
        let token = Token::new(TokenKind::FairLock, lease.id);
        let mine = self.key_of(&self.lock_prefix(name), &token);
        let (my_rev, ahead) = self
            .join(
                &mut client,
                lease,
                &prefix,
                &mine,
                format!("{token}|{owner}"),
            )
            .await?;
        let mine = mine.into_bytes();
        let queue = async {
            if let Some(names) = ahead.names {
                match self.all_deleted(deletes, names, &mine).await {
                    Some(true) => return Queued::Head,
                    Some(false) => return Queued::Lost,
                    None => {}
                }
            }
            match self.queue(&client, &prefix, my_rev, ahead.first).await {
                Ok(()) => self.still_queued(&client, &mine).await,
                Err(e) => Queued::Failed(e),
            }
        };
        let outcome = tokio::select! {
            biased;
            q = queue => q,
            _ = keep_queued(client.clone(), lease.id, lease.ttl) => Queued::Lost,
            _ = tokio::time::sleep_until(deadline) => Queued::TimedOut,
        };
        let answer = self
            .queued(outcome, client, name, &prefix, &token, my_rev, lease.ttl)
            .await;
        if let Ok(Try::Acquired(_)) = answer {
            self.holding(lease, ttl, at);
        }
        answer
    }

    /// Join the queue under `prefix` as key `mine` (bound to `lease`) and
    /// look ahead in one txn: the read runs before the put, so it sees
    /// exactly the keys created before ours. Returns our key's revision and
    /// what is ahead.
    async fn join(
        &self,
        client: &mut etcd_client::Client,
        lease: crate::backend::etcd::store::Lease,
        prefix: &str,
        mine: &str,
        value: String,
    ) -> Result<(i64, Joined)> {
        let join = Txn::new().and_then([
            TxnOp::get(prefix, Some(all_ahead())),
            TxnOp::put(mine, value, Some(PutOptions::new().with_lease(lease.id))),
        ]);
        let joined = self.put_under(client, lease, join).await?;
        let my_rev = revision_of(joined.resp.header());
        Ok((my_rev, self::joined(&joined.resp, my_rev)))
    }

    /// The answer of a fair acquisition once its queueing ended.
    #[allow(clippy::too_many_arguments)]
    async fn queued(
        &self,
        outcome: Queued,
        mut client: Client,
        name: &str,
        prefix: &str,
        token: &Token,
        my_rev: i64,
        granted: Duration,
    ) -> Result<Try> {
        match outcome {
            Queued::Head => Ok(Try::Acquired(grant(name, token, my_rev, granted))),
            Queued::TimedOut => {
                // Timed out in the queue: leave it, and say who holds the
                // lock (both calls at once: one deadline, not two).
                let mut reader = client.clone();
                let (_, first) = tokio::join!(
                    self.drop_lease(&mut client, token.lease),
                    self.first(&mut reader, prefix)
                );
                Ok(Try::Held(first.ok().flatten().unwrap_or_default()))
            }
            Queued::Lost => {
                // The key is gone; its lease may live on (a key deleted by
                // hand): give it up off the answer path.
                self.revoke_later(client, token.lease);
                Err(CoordError::QueueLost {
                    name: name.to_owned(),
                })
            }
            Queued::Failed(e) => {
                // Our key would block the queue until its lease expires:
                // revoke it off the answer path, where a backend that is
                // back within the deadline still takes it.
                self.revoke_later(client, token.lease);
                Err(e)
            }
        }
    }

    /// After a wait key by key: whether our own key `mine` is still there
    /// (then every key ahead is gone and the lock is ours). That path saw
    /// only the keys ahead, not ours (etcd-io/etcd#19597: a waiter whose
    /// lease expired must not be granted the lock).
    async fn still_queued(&self, client: &Client, mine: &[u8]) -> Queued {
        let opts = GetOptions::new().with_keys_only();
        match self
            .call("get", client.clone().get(mine.to_vec(), Some(opts)))
            .await
        {
            Ok(r) if r.kvs().is_empty() => Queued::Lost,
            Ok(_) => Queued::Head,
            Err(e) => Queued::Failed(e),
        }
    }

    /// Wait until every key of `names` is deleted: `Some(true)` then,
    /// `Some(false)` when our own key `mine` is deleted first (its lease
    /// ended: the deletes come in revision order, so ours is seen before any
    /// later one), `None` when the hub could not say (then the caller looks
    /// again).
    async fn all_deleted(
        &self,
        mut seen: Subscription,
        mut names: HashSet<Vec<u8>>,
        mine: &[u8],
    ) -> Option<bool> {
        while !names.is_empty() {
            match seen.next(self).await {
                Seen::Deleted(key) if key == mine => return Some(false),
                Seen::Deleted(key) => {
                    names.remove(&key);
                }
                Seen::Ended => return None,
            }
        }
        Some(true)
    }

    /// Wait in the queue of `prefix` until no key created before `my_rev`
    /// is left; `next` is the nearest key ahead as the join saw it.
    async fn queue(&self, client: &Client, prefix: &str, my_rev: i64, first: Ahead) -> Result<()> {
        let mut next = first;
        while let Some((key, rev, last)) = next {
            // Keys are never created ahead of ours: when the last one ahead
            // goes, the lock is ours without a look.
            if let Ahead1::Gone = self.watch_ahead(client, key, rev).await?
                && last
            {
                return Ok(());
            }
            next = self.ahead(client, prefix, my_rev).await?;
        }
        Ok(())
    }

    /// A later look at the keys ahead of `my_rev`. `limit` applies after the
    /// revision filter.
    async fn ahead(&self, client: &Client, prefix: &str, my_rev: i64) -> Result<Ahead> {
        let opts = nearest().with_max_create_revision(my_rev - 1);
        let r = self
            .call("get", client.clone().get(prefix, Some(opts)))
            .await?;
        Ok(read_ahead(r.kvs(), revision_of(r.header())))
    }

    /// Watch `key`, which existed at revision `rev`, until it is deleted.
    async fn watch_ahead(&self, client: &Client, key: Vec<u8>, rev: i64) -> Result<Ahead1> {
        // Watch from the head (etcd serves such a watch at once; one from an
        // older revision waits for etcd's catch-up loop, up to 100 ms, which
        // a busy queue would feel on every handoff).
        let mut w = self
            .call("watch", client.clone().watch(key.clone(), None))
            .await?;
        // The created answer says the revision the watch starts after; if
        // anything was written since `rev`, look whether the key is still
        // there (its delete then comes later).
        let started = self
            .call("watch", w.message())
            .await?
            .filter(|m| m.created() && !m.canceled())
            .and_then(|m| m.header().map(|h| h.revision()));
        match started {
            None => return Ok(Ahead1::Unknown),
            Some(at) if at > rev => {
                let opts = GetOptions::new().with_keys_only();
                let now = self
                    .call("get", client.clone().get(key, Some(opts)))
                    .await?;
                if now.kvs().is_empty() {
                    return Ok(Ahead1::Gone);
                }
            }
            Some(_) => {}
        }
        while let Some(msg) = w.message().await.map_err(|e| self.store_err(e))? {
            if msg.canceled() {
                break;
            }
            if msg
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                return Ok(Ahead1::Gone);
            }
        }
        Ok(Ahead1::Unknown)
    }

    pub(super) fn store_err(&self, e: etcd_client::Error) -> CoordError {
        CoordError::Backend(self.store.classify(e, false))
    }

    /// Wait until one of the keys under `prefix` now is deleted, or until
    /// `until` ([`crate::backend::coordination::Coordinator::changed`]). `lock`: an empty
    /// prefix means the lock is free, so answer at once.
    pub(super) async fn changed_under(
        &self,
        prefix: &str,
        lock: bool,
        until: Instant,
    ) -> Result<()> {
        let mut client = self.client().await?;
        // Read first so the watch starts where the read saw the range: a
        // release between the caller's attempt and this read shows here.
        // Wake only when one of the keys seen now goes: keys that come and
        // go meanwhile are losing acquirers (a semaphore's losers write and
        // revoke a key) or waiters, and waking on them would have every
        // waiter's retry wake every other waiter, for ever.
        let opts = GetOptions::new().with_prefix().with_keys_only();
        let r = self.call("get", client.get(prefix, Some(opts))).await?;
        let present: HashSet<Vec<u8>> = r.kvs().iter().map(|kv| kv.key().to_vec()).collect();
        if lock && present.is_empty() {
            return Ok(());
        }
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision_of(r.header()) + 1);
        let mut w = self.call("watch", client.watch(prefix, Some(opts))).await?;
        let deleted = async {
            loop {
                let Some(msg) = w.message().await.map_err(|e| self.store_err(e))? else {
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
}
