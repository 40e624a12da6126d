//! Coordination on a single Redis server, each verb one Lua script (atomic):
//! - locks: `SET NX PX` of `<token>|<fencing>|<owner>` with a fencing counter
//!   beside the key (same hash tag); renew = check-then-`PEXPIRE`; release =
//!   check-then-`DEL`;
//! - semaphores: a sorted set of tokens scored by expiry (Redis `TIME`); one
//!   script drops expired holders, counts, and adds — never more than N live;
//! - job claims: `SET NX PX` on the claim unless a `done` key exists;
//!   complete = check-then-(`SET done PX retention`, `DEL claim`).
//!
//! A missing fencing counter starts at the server's clock in milliseconds,
//! so tokens keep growing across a restart without persistence.
//!
//! Redlock groups (several `--redis-url`) serve leadership only; fair locks
//! need etcd. Both answer [`CoordError::Unsupported`] (HTTP 400).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::PubSub;
use redis::{Script, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Claim, CoordError, Coordinator, Grant, Kind, Outcome, Result, Token, TokenKind, Try};
use crate::backend::BackendError;
use crate::backend::redis::RedisBackend;

/// Every acquiring script starts with this: read the fencing counter at
/// `KEYS[2]`-like `fkey` and refuse (`{-2, value}`) one that is not a
/// non-negative integer, before anything is written. Scripts validate first
/// and write last, so a refusal leaves no trace.
const FENCE_CHECK: &str = r"
local function fence_ok(fkey)
  local c = redis.call('GET', fkey)
  if c == false then return true, nil end
  if string.match(c, '^%d+$') and string.len(c) <= 18 then return true, nil end
  return false, c
end
local function fence_next(fkey)
  if redis.call('EXISTS', fkey) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', fkey, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  end
  return redis.call('INCR', fkey)
end
";

const LOCK: &str = r"
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local f = fence_next(KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
return {1, f}
";

/// Live permits of a semaphore (by the server's clock), read-only.
const LIVE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
";

const RENEW: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
if string.sub(current, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. '|' then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

const RELEASE: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
if string.sub(current, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. '|' then return -1 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'released')
return 1
";

const SEM_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
if live >= tonumber(ARGV[2]) then return {0, live} end
local f = fence_next(KEYS[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return {1, f}
";

const SEM_RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
";

const SEM_RELEASE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZREM', KEYS[1], ARGV[1])
if n == 1 then redis.call('PUBLISH', KEYS[1], 'released') end
return n
";

const CLAIM: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then return {2} end
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
local ok, bad = fence_ok(KEYS[3])
if not ok then return {-2, bad} end
local f = fence_next(KEYS[3])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
return {1, f}
";

const COMPLETE: &str = r"
local current = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. '|'
if current and string.sub(current, 1, string.len(mine)) == mine then
  redis.call('SET', KEYS[2], current, 'PX', ARGV[2])
  redis.call('DEL', KEYS[1])
  return 1
end
local done = redis.call('GET', KEYS[2])
if done and string.sub(done, 1, string.len(mine)) == mine then return 1 end
if current or done then return -1 end
return 0
";

/// The Redis [`Coordinator`], sharing the election's connection.
///
/// Waiters are woken by the release scripts' `PUBLISH` on the key's own
/// channel (one pattern subscription per sidecar, read by whichever waiter
/// holds it, dropped when nobody waits) or at the holder's expiry, whichever
/// comes first; at most [`MAX_NAP`] passes without a look.
pub struct RedisCoord {
    backend: Arc<RedisBackend>,
    scripts: [Script; 8],
    /// The pattern subscription; its holder reads and dispatches notices.
    pubsub: tokio::sync::Mutex<Option<PubSub>>,
    /// Waiters per channel (= key).
    notices: std::sync::Mutex<HashMap<String, Arc<Notify>>>,
    /// Waiters in [`Coordinator::changed`] now.
    waiters: AtomicUsize,
    /// Whether the pattern subscription is confirmed and open.
    subscribed: AtomicBool,
}

/// Longest a Redis waiter sleeps without looking (covers a notice lost while
/// the subscription was being set up).
pub const MAX_NAP: Duration = Duration::from_secs(1);
/// Longest nap once the subscription is known to be active.
pub const MAX_NAP_SUBSCRIBED: Duration = Duration::from_secs(30);

impl RedisCoord {
    /// Coordination keys under the election's prefix.
    pub fn new(backend: Arc<RedisBackend>) -> Self {
        RedisCoord {
            backend,
            scripts: [
                LOCK,
                RENEW,
                RELEASE,
                SEM_ACQUIRE,
                SEM_RENEW,
                SEM_RELEASE,
                CLAIM,
                COMPLETE,
            ]
            .map(|body| Script::new(&format!("{FENCE_CHECK}{body}"))),
            pubsub: tokio::sync::Mutex::new(None),
            notices: std::sync::Mutex::new(HashMap::new()),
            waiters: AtomicUsize::new(0),
            subscribed: AtomicBool::new(false),
        }
    }

    /// The pattern matching every lock and semaphore channel (glob-escaped prefix).
    fn pattern(&self) -> String {
        let mut p = String::new();
        for c in self.backend.prefix().chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                p.push('\\');
            }
            p.push(c);
        }
        p.push_str("{*");
        p
    }

    fn notice(&self, channel: &str) -> Arc<Notify> {
        let mut n = self.notices.lock().unwrap_or_else(|e| e.into_inner());
        if n.len() > 10_000 {
            n.retain(|_, v| Arc::strong_count(v) > 1);
        }
        n.entry(channel.to_owned())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    fn dispatch(&self, channel: &str) {
        let n = self
            .notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(channel)
            .cloned();
        if let Some(n) = n {
            n.notify_one();
        }
    }

    /// When the next change of `key` is due without a notice: `None` when it
    /// changed already (fewer than `seen` holders), else the next expiry.
    async fn due(&self, kind: Kind, key: &str, seen: u64) -> Result<Option<Duration>> {
        let mut conn = self.backend.connection_to(0).await?;
        let fail = |e| CoordError::Backend(self.backend.classify_error(0, e));
        match kind {
            Kind::Lock => {
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .map_err(fail)?;
                Ok((pttl > 0).then(|| Duration::from_millis(pttl as u64)))
            }
            Kind::Semaphore => {
                let (live, next): (u64, Vec<(String, f64)>) = redis::pipe()
                    .cmd("EVAL")
                    .arg(LIVE)
                    .arg(1)
                    .arg(key)
                    .cmd("ZRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await
                    .map_err(fail)?;
                if live < seen {
                    return Ok(None);
                }
                Ok(Some(next.first().map_or(MAX_NAP, |(_, at)| {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis() as f64;
                    Duration::from_millis((at - now).max(1.0) as u64)
                })))
            }
        }
    }

    fn single(&self) -> Result<()> {
        if self.backend.servers() != 1 {
            return Err(CoordError::Unsupported(
                "the coordination API on Redis needs a single --redis-url; a Redlock group serves leadership only (use etcd, or one Redis)".into(),
            ));
        }
        Ok(())
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{{{kind}:{name}}}", self.backend.prefix())
    }

    async fn run(&self, script: usize, keys: &[String], args: &[String]) -> Result<Value> {
        self.single()?;
        let mut conn = self.backend.connection_to(0).await?;
        let mut inv = self.scripts[script].prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        match inv.invoke_async::<Value>(&mut conn).await {
            Ok(v) => Ok(v),
            Err(e) => {
                let err = self.backend.classify_error(0, e);
                if let BackendError::Rejected {
                    code: "wrongtype", ..
                } = err
                {
                    // Not the election's key: name the coordination keys.
                    return Err(CoordError::Corrupt {
                        key: keys.join(" or "),
                        found: "a value of another Redis type (WRONGTYPE)".into(),
                    });
                }
                self.backend.forget(0, &err).await;
                Err(CoordError::Backend(err))
            }
        }
    }
}

fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

fn owner_of(v: &[u8]) -> String {
    String::from_utf8_lossy(v)
        .splitn(3, '|')
        .nth(2)
        .unwrap_or("")
        .to_owned()
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        _ => 0,
    }
}

fn outcome(v: &Value, ttl: Option<Duration>) -> Outcome {
    match int(v) {
        1 => Outcome::Ok(ttl),
        -1 => Outcome::NotYours,
        _ => Outcome::Gone,
    }
}

/// A fencing token from a script: a non-negative integer (a negative one
/// would wrap to a huge `u64`).
fn fencing(v: i64, key: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| CoordError::Corrupt {
        key: key.to_owned(),
        found: format!("a fencing counter of {v}"),
    })
}

/// The refusal of a script that found the fencing counter at `key` unusable.
fn corrupt_counter(found: &Value, key: &str) -> CoordError {
    let found = match found {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    };
    CoordError::Corrupt {
        key: key.to_owned(),
        found: format!(
            "a fencing counter of {found:?}, not a non-negative integer (nothing was written)"
        ),
    }
}

/// Read a lock or semaphore script's answer: `{1, fencing}` granted,
/// `{-2, value}` refused for a bad fencing counter at `fkey`, or `{0, x}`
/// held, with `held` turning `x` into the answer.
fn acquisition(
    v: &Value,
    name: &str,
    token: &Token,
    ttl: Duration,
    fkey: &str,
    held: impl Fn(&Value) -> Option<Try>,
) -> Result<Try> {
    match v {
        Value::Array(a) => match a.as_slice() {
            [Value::Int(1), Value::Int(f)] => Ok(Try::Acquired(Grant {
                name: name.into(),
                token: token.to_string(),
                fencing_token: fencing(*f, fkey)?,
                ttl_ms: ttl.as_millis() as u64,
            })),
            [Value::Int(-2), x] => Err(corrupt_counter(x, fkey)),
            [Value::Int(0), x] => held(x).ok_or_else(|| unexpected(v)),
            _ => Err(unexpected(v)),
        },
        _ => Err(unexpected(v)),
    }
}

/// Whether `token` is a version-1 Redis token that may act on `kind`.
fn usable(kind: Kind, token: &str) -> bool {
    Token::parse(token).is_some_and(|t| t.kind.serves(kind) && t.lease == 0)
}

fn unexpected(v: &Value) -> CoordError {
    CoordError::Backend(crate::backend::BackendError::Server {
        backend: "redis",
        source: format!("unexpected script answer: {v:?}").into(),
    })
}

#[async_trait]
impl Coordinator for RedisCoord {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn lock(&self, name: &str, owner: &str, ttl: Duration) -> Result<Try> {
        let key = self.key("lock", name);
        let fkey = format!("{key}:fencing");
        let token = Token::new(TokenKind::Lock, 0);
        let v = self
            .run(
                0,
                &[key.clone(), fkey.clone()],
                &[token.to_string(), owner.into(), ms(ttl)],
            )
            .await?;
        acquisition(&v, name, &token, ttl, &fkey, |held| match held {
            Value::BulkString(cur) => Some(Try::Held(owner_of(cur))),
            _ => None,
        })
    }

    async fn lock_fair(&self, _: &str, _: &str, _: Duration, _: Duration) -> Result<Try> {
        Err(CoordError::Unsupported(
            "fair locks need the etcd backend (waiters queue by create_revision); on Redis use fair=false".into(),
        ))
    }

    async fn semaphore(
        &self,
        name: &str,
        _owner: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Try> {
        let key = self.key("sem", name);
        let fkey = format!("{key}:fencing");
        let token = Token::new(TokenKind::Permit, 0);
        let v = self
            .run(
                3,
                &[key.clone(), fkey.clone()],
                &[token.to_string(), permits.to_string(), ms(ttl)],
            )
            .await?;
        acquisition(&v, name, &token, ttl, &fkey, |held| match held {
            Value::Int(live) => Some(Try::Full((*live).max(0) as u64)),
            _ => None,
        })
    }

    async fn renew(&self, kind: Kind, name: &str, token: &str, ttl: Duration) -> Result<Outcome> {
        if !usable(kind, token) {
            return Ok(Outcome::Gone);
        }
        match kind {
            Kind::Lock => {
                let v = self
                    .run(1, &[self.key("lock", name)], &[token.into(), ms(ttl)])
                    .await?;
                Ok(outcome(&v, Some(ttl)))
            }
            Kind::Semaphore => {
                let v = self
                    .run(4, &[self.key("sem", name)], &[token.into(), ms(ttl)])
                    .await?;
                Ok(outcome(&v, Some(ttl)))
            }
        }
    }

    async fn release(&self, kind: Kind, name: &str, token: &str) -> Result<Outcome> {
        if !usable(kind, token) {
            return Ok(Outcome::Gone);
        }
        match kind {
            Kind::Lock => {
                let v = self
                    .run(2, &[self.key("lock", name)], &[token.into()])
                    .await?;
                Ok(outcome(&v, None))
            }
            Kind::Semaphore => {
                // A permit that is gone cannot be told from one never held.
                let v = self
                    .run(5, &[self.key("sem", name)], &[token.into()])
                    .await?;
                Ok(outcome(&v, None))
            }
        }
    }

    async fn changed(&self, kind: Kind, name: &str, seen: u64, until: Instant) -> Result<()> {
        self.single()?;
        let key = match kind {
            Kind::Lock => self.key("lock", name),
            Kind::Semaphore => self.key("sem", name),
        };
        self.waiters.fetch_add(1, Ordering::SeqCst);
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _leave = Leave(&self.waiters);
        let notice = self.notice(&key);
        let notified = notice.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Subscribe first (when nobody did), then look: a release after the
        // look is a notice, one before it shows in the look. Unless the
        // subscription was confirmed before the look, nap at most MAX_NAP.
        let sure = self.subscribed.load(Ordering::SeqCst);
        let mut reader = self.pubsub.try_lock().ok();
        if let Some(guard) = reader.as_mut()
            && guard.is_none()
        {
            let mut ps = self.backend.pubsub_to(0).await?;
            let pattern = self.pattern();
            match tokio::time::timeout(self.backend.call_timeout(), ps.psubscribe(&pattern)).await {
                Ok(Ok(())) => {
                    **guard = Some(ps);
                    self.subscribed.store(true, Ordering::SeqCst);
                }
                Ok(Err(e)) => return Err(CoordError::Backend(self.backend.classify_error(0, e))),
                Err(_) => {}
            }
        }
        let Some(due) = self.due(kind, &key, seen).await? else {
            return Ok(());
        };
        let sure = sure || reader.as_ref().is_some_and(|g| g.is_some());
        let nap = if sure { MAX_NAP_SUBSCRIBED } else { MAX_NAP };
        let wake = until.min(Instant::now() + due.min(nap));
        loop {
            match reader.take() {
                Some(mut guard) => {
                    let Some(ps) = guard.as_mut() else {
                        // No subscription (it failed): wait for the expiry.
                        tokio::select! {
                            _ = &mut notified => {}
                            _ = tokio::time::sleep_until(wake) => {}
                        }
                        return Ok(());
                    };
                    let mut broken = false;
                    {
                        let mut stream = ps.on_message();
                        loop {
                            tokio::select! {
                                biased;
                                _ = &mut notified => break,
                                _ = tokio::time::sleep_until(wake) => break,
                                msg = stream.next() => match msg {
                                    Some(m) => self.dispatch(m.get_channel_name()),
                                    None => { broken = true; break; }
                                },
                            }
                        }
                    }
                    // Nobody else waits (or the connection broke): close it,
                    // so notices do not pile up unread.
                    if broken || self.waiters.load(Ordering::SeqCst) <= 1 {
                        self.subscribed.store(false, Ordering::SeqCst);
                        *guard = None;
                    }
                    return Ok(());
                }
                None => {
                    tokio::select! {
                        _ = &mut notified => return Ok(()),
                        _ = tokio::time::sleep_until(wake) => return Ok(()),
                        guard = self.pubsub.lock() => {
                            if guard.is_none() {
                                // The reader left and closed it: look again.
                                drop(guard);
                                return Ok(());
                            }
                            reader = Some(guard);
                        }
                    }
                }
            }
        }
    }

    async fn claim(&self, queue: &str, job: &str, owner: &str, ttl: Duration) -> Result<Claim> {
        let base = self.key("job", &format!("{queue}/{job}"));
        let fkey = format!("{base}:fencing");
        let token = Token::new(TokenKind::Job, 0);
        let v = self
            .run(
                6,
                &[
                    format!("{base}:claim"),
                    format!("{base}:done"),
                    fkey.clone(),
                ],
                &[token.to_string(), owner.into(), ms(ttl)],
            )
            .await?;
        match &v {
            Value::Array(a) => match a.as_slice() {
                [Value::Int(1), Value::Int(f)] => Ok(Claim::Claimed(Grant {
                    name: format!("{queue}/{job}"),
                    token: token.to_string(),
                    fencing_token: fencing(*f, &fkey)?,
                    ttl_ms: ttl.as_millis() as u64,
                })),
                [Value::Int(-2), x] => Err(corrupt_counter(x, &fkey)),
                [Value::Int(2)] => Ok(Claim::Completed),
                [Value::Int(0), Value::BulkString(cur)] => Ok(Claim::ClaimedByOther(owner_of(cur))),
                _ => Err(unexpected(&v)),
            },
            _ => Err(unexpected(&v)),
        }
    }

    async fn complete(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        if Token::parse(token).is_none_or(|t| t.kind != TokenKind::Job || t.lease != 0) {
            return Ok(Outcome::Gone);
        }
        let base = self.key("job", &format!("{queue}/{job}"));
        let v = self
            .run(
                7,
                &[format!("{base}:claim"), format!("{base}:done")],
                &[token.into(), ms(retention)],
            )
            .await?;
        Ok(outcome(&v, None))
    }
}
