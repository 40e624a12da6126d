//! Shard records on one Redis server ([`ShardStore`]), every key under the
//! election's hash tag, `<base>` = `<prefix>{<election>}`:
//! - a **session** is the key `<base>:shards:session:<id>` = `<N>|<member>`
//!   with `PX` = the TTL, and its id in the sorted set
//!   `<base>:shards:members` scored by its expiry (the server's `TIME`, ms);
//!   a session is live while its key exists and its score is ahead of the
//!   server's clock. Scripts forget a session whose score has passed, with
//!   its records;
//! - a shard's **record** `<base>:shards:s:<shard>` =
//!   `<session>|<token>|<member>`, written with the session's `PTTL`; the
//!   set `<base>:shards:held:<session>` lists the shards the session took,
//!   so one renewal script resets the `PX` of the session and of every
//!   record still bound to it, whatever N. A record bound to a session that
//!   is not live counts as absent (read) and is taken over (acquire);
//! - a shard's **fencing counter** `<base>:shards:t:<shard>` is raised by
//!   `fence_next` (max(counter + 1, server clock in ms)), so tokens grow
//!   across a restart without persistence too while the clock does; a
//!   counter that is not a number of at most
//!   [`COUNTER_DIGITS`](super::lua::COUNTER_DIGITS) digits is refused
//!   ([`BadCounter`]), never overwritten.
//!
//! Scripts: `super::lua_shards`. Every script that changes what a read
//! answers publishes on the channel `<base>:shards`; one subscription per
//! store counts the messages for [`ShardStore::changed`]. **A session's
//! expiry publishes nothing** (the server deletes keys silently): the
//! keeper reads at least once per TTL, and every 200 ms while a shard it
//! is given is still held, so a crashed member's shards move at the next
//! such read after its TTL. A read that finds dead sessions forgets them
//! and publishes.
//!
//! **Restart without persistence**: the server forgets sessions, records
//! and counters. Tokens still grow while the server's clock does (counters
//! start at it), and an acquisition is refused while the server has been up
//! for less than the acquiring session's TTL + 1 s, as the campaign's
//! hold-off: every owner that still claims a forgotten record has seen its
//! validity end by then (its renewal answers `false`). Members of one
//! election share `--lease-duration`; a longer TTL elsewhere is not waited
//! for.
//!
//! One server only: Redlock (several independent servers), Sentinel and
//! Cluster are refused by [`RedisShards::new`] (and `--shards` with them
//! at start-up).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::Value;
use redis::aio::PubSub;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use super::group::unexpected;
use super::lua::{Lua, ms};
use super::server::{Server, text_of, uint_of};
use super::{BACKEND, BadCounter, RedisBackend};
use crate::backend::shards::{Session, ShardMember, ShardRecord, ShardSnapshot, ShardStore};
use crate::backend::{BackendError, Result};

/// The pause before a broken subscription is made again.
const RESUBSCRIBE: Duration = Duration::from_secs(1);

/// The Redis [`ShardStore`] of one election on one server.
pub struct RedisShards {
    backend: Arc<RedisBackend>,
    /// `<base>:shards:`, the keys' common prefix.
    prefix: String,
    /// `<base>:shards:members`.
    members: String,
    /// `<base>:shards`.
    channel: String,
    /// The subscription's task, started by the first [`ShardStore::changed`].
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    /// Its messages, counted.
    notices: watch::Sender<u64>,
}

impl Drop for RedisShards {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().take() {
            task.abort();
        }
    }
}

impl RedisShards {
    /// The shard store beside `backend`'s election.
    ///
    /// # Errors
    /// A message when `backend` is a Redlock group, a Sentinel-named
    /// primary or a Redis Cluster: shard records are kept on one server.
    pub fn new(backend: Arc<RedisBackend>) -> std::result::Result<RedisShards, String> {
        let servers = backend.group.servers();
        let one = servers.len() == 1 && !servers[0].is_sentinel() && !servers[0].is_cluster();
        if !one {
            return Err(
                "shard records are kept on one Redis server (--redis-url given once), not on Redlock, Sentinel or Cluster".into(),
            );
        }
        let prefix = format!("{}:shards:", backend.key);
        Ok(RedisShards {
            members: format!("{prefix}members"),
            channel: format!("{}:shards", backend.key),
            prefix,
            backend,
            task: tokio::sync::Mutex::new(None),
            notices: watch::channel(0).0,
        })
    }

    fn server(&self) -> &Server {
        &self.backend.group.servers()[0]
    }

    fn counter_key(&self, shard: u32) -> String {
        format!("{}t:{shard}", self.prefix)
    }

    /// Run `lua` with the members key (and `more` keys) and the common
    /// arguments (prefix, `session`, channel) followed by `args`.
    async fn eval(&self, lua: Lua, more: &[&str], session: &str, args: &[&str]) -> Result<Value> {
        let mut keys = vec![self.members.as_str()];
        keys.extend_from_slice(more);
        let mut all = vec![self.prefix.as_str(), session, self.channel.as_str()];
        all.extend_from_slice(args);
        self.server().eval(lua, &keys, &all).await
    }

    /// The notices' receiver, subscribing first when no subscription runs.
    async fn notices(&self) -> watch::Receiver<u64> {
        let mut g = self.task.lock().await;
        if g.as_ref().is_none_or(|t| t.is_finished()) {
            let first = subscribe(self.server(), &self.channel).await.ok();
            let (backend, channel) = (self.backend.clone(), self.channel.clone());
            let tx = self.notices.clone();
            *g = Some(tokio::spawn(follow(backend, channel, tx, first)));
        }
        self.notices.subscribe()
    }
}

/// A subscription to `channel`, within the server's timeout.
async fn subscribe(server: &Server, channel: &str) -> Result<PubSub> {
    let work = async {
        let mut ps = server.pubsub().await?;
        ps.subscribe(channel)
            .await
            .map_err(|e| server.classify(e))?;
        Ok(ps)
    };
    match timeout(server.timeout(), work).await {
        Ok(r) => r,
        Err(_) => Err(BackendError::Timeout {
            backend: BACKEND,
            call: "subscribe",
            timeout_ms: server.timeout().as_millis() as u64,
        }),
    }
}

/// Count every message of the subscription into `tx`; when it breaks (or
/// there is none yet), subscribe again after [`RESUBSCRIBE`] and count one
/// notice for what may have been missed meanwhile.
async fn follow(
    backend: Arc<RedisBackend>,
    channel: String,
    tx: watch::Sender<u64>,
    mut sub: Option<PubSub>,
) {
    loop {
        if let Some(mut ps) = sub.take() {
            let mut stream = ps.on_message();
            while stream.next().await.is_some() {
                tx.send_modify(|n| *n += 1);
            }
        }
        tokio::time::sleep(RESUBSCRIBE).await;
        if let Ok(ps) = subscribe(&backend.group.servers()[0], &channel).await {
            tx.send_modify(|n| *n += 1);
            sub = Some(ps);
        }
    }
}

/// The members of a read's answer: `{sid, value, ...}`, `value` =
/// `<N>|<member>`; sorted by identity, one per identity.
fn members_of(listed: &[Value]) -> Result<Vec<ShardMember>> {
    let mut members = Vec::new();
    for pair in listed.chunks(2) {
        let [_, value] = pair else {
            return Err(unexpected(&Value::Array(listed.to_vec())));
        };
        let value = text_of(value).unwrap_or_default();
        let Some((n, identity)) = value.split_once('|') else {
            continue;
        };
        let Ok(shards) = n.parse() else { continue };
        members.push(ShardMember {
            identity: identity.to_owned(),
            shards,
        });
    }
    members.sort_by(|a, b| a.identity.cmp(&b.identity));
    members.dedup_by(|a, b| a.identity == b.identity);
    Ok(members)
}

/// A record `<session>|<token>|<member>`; `None` for '' (free) or a value
/// of another shape (written by hand: no token of ours to trust).
fn record_of(v: &Value) -> Option<ShardRecord> {
    let text = text_of(v)?;
    let mut parts = text.splitn(3, '|');
    let (session, token, member) = (parts.next()?, parts.next()?, parts.next()?);
    Some(ShardRecord {
        member: member.to_owned(),
        session: session.to_owned(),
        token: token.parse().ok()?,
    })
}

#[async_trait]
impl ShardStore for RedisShards {
    async fn open(&self, member: &str, shards: u32, ttl: Duration) -> Result<Session> {
        let id = super::election::new_token();
        let ttl = Duration::from_millis(ms(ttl).parse().unwrap_or(1));
        let value = format!("{shards}|{member}");
        self.eval(Lua::ShardOpen, &[], &id, &[&ms(ttl), &value])
            .await?;
        Ok(Session { id, ttl })
    }

    async fn renew(&self, session: &Session) -> Result<bool> {
        let answer = self
            .eval(Lua::ShardRenew, &[], &session.id, &[&ms(session.ttl)])
            .await?;
        match answer {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(unexpected(&other)),
        }
    }

    async fn read(&self, shards: u32) -> Result<ShardSnapshot> {
        let answer = self
            .eval(Lua::ShardRead, &[], "", &[&shards.to_string()])
            .await?;
        let Value::Array(parts) = &answer else {
            return Err(unexpected(&answer));
        };
        let [Value::Array(listed), Value::Array(records)] = parts.as_slice() else {
            return Err(unexpected(&answer));
        };
        let mut snap = ShardSnapshot {
            members: members_of(listed)?,
            shards: records.iter().map(record_of).collect(),
        };
        snap.shards.resize(shards as usize, None);
        Ok(snap)
    }

    async fn acquire(&self, session: &Session, member: &str, shard: u32) -> Result<Option<u64>> {
        let counter = self.counter_key(shard);
        let id = shard.to_string();
        let answer = self
            .eval(
                Lua::ShardAcquire,
                &[&counter],
                &session.id,
                &[&id, member, &ms(session.ttl)],
            )
            .await?;
        let Value::Array(items) = &answer else {
            return Err(unexpected(&answer));
        };
        match items.as_slice() {
            [Value::Int(1), token] => uint_of(token).map(Some).ok_or_else(|| unexpected(&answer)),
            // Refused, or the server is too fresh (restart hold-off).
            [Value::Int(0)] | [Value::Int(3), _] => Ok(None),
            [Value::Int(-2), value] => Err(BackendError::Rejected {
                backend: BACKEND,
                code: "fencing_counter",
                source: Box::new(BadCounter {
                    key: counter,
                    value: text_of(value).unwrap_or_default(),
                }),
            }),
            _ => Err(unexpected(&answer)),
        }
    }

    async fn release(&self, session: &Session, shard: u32) -> Result<()> {
        let id = shard.to_string();
        self.eval(Lua::ShardRelease, &[], &session.id, &[&id])
            .await
            .map(|_| ())
    }

    async fn close(&self, session: &Session) -> Result<()> {
        self.eval(Lua::ShardClose, &[], &session.id, &[])
            .await
            .map(|_| ())
    }

    async fn changed(&self, seen: &mut u64, at_most: Duration) -> bool {
        let start = Instant::now();
        let Ok(mut rx) = timeout(at_most, self.notices()).await else {
            return false;
        };
        let wait = rx.wait_for(|n| n != seen);
        match timeout(at_most.saturating_sub(start.elapsed()), wait).await {
            Ok(Ok(n)) => {
                *seen = *n;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn records_and_members_read_back() {
        let r = record_of(&bulk("abc|42|pod|x")).expect("a record");
        assert_eq!(
            (r.session.as_str(), r.token, r.member.as_str()),
            ("abc", 42, "pod|x")
        );
        assert_eq!(record_of(&bulk("")), None);
        assert_eq!(record_of(&bulk("abc|x|pod")), None);
        let listed = ["s2", "16|b", "s1", "16|a", "s3", "8|a", "s4", "junk"].map(bulk);
        let m = members_of(&listed).unwrap();
        let ids: Vec<_> = m.iter().map(|m| (m.identity.as_str(), m.shards)).collect();
        assert_eq!(ids, [("a", 16), ("b", 16)]);
    }
}
