//! The in-memory shard store on the tokio clock: sessions with a TTL,
//! records bound to them, a fencing counter per shard. For the keeper's
//! unit tests (`start_paused`) and for embedding tests. Faults: every call
//! can be made to fail, as an unreachable backend would.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use super::ABOUT;
use crate::backend::shards::{Session, ShardMember, ShardRecord, ShardSnapshot, ShardStore};
use crate::backend::{BackendError, Result};

#[derive(Default)]
struct Inner {
    /// Session id → (member, its `--shards`, expiry).
    sessions: BTreeMap<String, (String, u32, Instant)>,
    /// Shard id → record.
    records: BTreeMap<u32, ShardRecord>,
    /// Shard id → the last token given.
    counters: BTreeMap<u32, u64>,
    unreachable: bool,
}

impl Inner {
    /// Forget the sessions whose TTL ran out, with their records.
    fn expire(&mut self, now: Instant) {
        self.sessions.retain(|_, s| s.2 > now);
        let live = &self.sessions;
        self.records.retain(|_, r| live.contains_key(&r.session));
    }
}

/// The in-memory [`ShardStore`].
pub struct MemoryShards {
    inner: Mutex<Inner>,
    next: AtomicU64,
    /// Calls answered (or refused), for tests of the request rate.
    calls: AtomicU64,
    notices: watch::Sender<u64>,
}

impl Default for MemoryShards {
    fn default() -> Self {
        MemoryShards {
            inner: Mutex::default(),
            next: AtomicU64::default(),
            calls: AtomicU64::default(),
            notices: watch::channel(0).0,
        }
    }
}

impl MemoryShards {
    /// An empty store.
    pub fn new() -> MemoryShards {
        MemoryShards::default()
    }

    /// Make every call fail (as an unreachable server would) or succeed again.
    pub fn set_unreachable(&self, on: bool) {
        self.inner.lock().unwrap().unreachable = on;
    }

    /// End `member`'s sessions now, as the server does at their TTL (a
    /// crash seen from the store's side, for tests).
    pub fn expire_member(&self, member: &str) {
        let mut g = self.inner.lock().unwrap();
        g.sessions.retain(|_, s| s.0 != member);
        g.expire(Instant::now());
        drop(g);
        self.notices.send_modify(|n| *n += 1);
    }

    /// How many calls the store has had (each would be a request to a server).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> Result<T> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut g = self.inner.lock().unwrap();
        if g.unreachable {
            return Err(BackendError::Unreachable {
                backend: ABOUT,
                endpoints: "memory".into(),
                source: "switched off by the test".into(),
            });
        }
        g.expire(Instant::now());
        Ok(f(&mut g))
    }

    /// Notice a change when `r` is a success (a refused call changed nothing).
    fn changed_now<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_ok() {
            self.notices.send_modify(|n| *n += 1);
        }
        r
    }
}

#[async_trait]
impl ShardStore for MemoryShards {
    async fn open(&self, member: &str, shards: u32, ttl: Duration) -> Result<Session> {
        let id = format!("{:x}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let at = Instant::now() + ttl;
        let r = self.with(|g| {
            g.sessions
                .insert(id.clone(), (member.to_owned(), shards, at));
            Session { id, ttl }
        });
        self.changed_now(r)
    }

    async fn renew(&self, session: &Session) -> Result<bool> {
        let at = Instant::now() + session.ttl;
        self.with(|g| match g.sessions.get_mut(&session.id) {
            Some(s) => {
                s.2 = at;
                true
            }
            None => false,
        })
    }

    async fn read(&self, shards: u32) -> Result<ShardSnapshot> {
        self.with(|g| {
            let mut members: Vec<ShardMember> = g
                .sessions
                .values()
                .map(|(m, n, _)| ShardMember {
                    identity: m.clone(),
                    shards: *n,
                })
                .collect();
            members.sort_by(|a, b| a.identity.cmp(&b.identity));
            members.dedup_by(|a, b| a.identity == b.identity);
            let shards = (0..shards).map(|i| g.records.get(&i).cloned()).collect();
            ShardSnapshot { members, shards }
        })
    }

    async fn acquire(&self, session: &Session, member: &str, shard: u32) -> Result<Option<u64>> {
        let r = self.with(|g| {
            if !g.sessions.contains_key(&session.id) {
                return None;
            }
            if g.records
                .get(&shard)
                .is_some_and(|r| r.session != session.id)
            {
                return None;
            }
            let token = g.counters.get(&shard).copied().unwrap_or(0) + 1;
            g.counters.insert(shard, token);
            g.records.insert(
                shard,
                ShardRecord {
                    member: member.to_owned(),
                    session: session.id.clone(),
                    token,
                },
            );
            Some(token)
        });
        self.changed_now(r)
    }

    async fn release(&self, session: &Session, shard: u32) -> Result<()> {
        let r = self.with(|g| {
            if g.records
                .get(&shard)
                .is_some_and(|r| r.session == session.id)
            {
                g.records.remove(&shard);
            }
        });
        self.changed_now(r)
    }

    async fn close(&self, session: &Session) -> Result<()> {
        let r = self.with(|g| {
            g.sessions.remove(&session.id);
            g.expire(Instant::now());
        });
        self.changed_now(r)
    }

    async fn changed(&self, seen: &mut u64, at_most: Duration) -> bool {
        let mut rx = self.notices.subscribe();
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
