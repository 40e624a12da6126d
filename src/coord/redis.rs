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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::{Claim, CoordError, Coordinator, Grant, Kind, Outcome, Result, Try, random_token};
use crate::backend::redis::RedisBackend;

const LOCK: &str = r"
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local f = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
return {1, f}
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
return 1
";

const SEM_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZCARD', KEYS[1])
if live >= tonumber(ARGV[2]) then return {0, live} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local f = redis.call('INCR', KEYS[2])
return {1, f}
";

const SEM_RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
";

const SEM_RELEASE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZREM', KEYS[1], ARGV[1])
";

const CLAIM: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then return {2} end
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
if redis.call('EXISTS', KEYS[3]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[3], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local f = redis.call('INCR', KEYS[3])
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
pub struct RedisCoord {
    backend: Arc<RedisBackend>,
    scripts: [Script; 8],
}

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
            .map(Script::new),
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

/// Read a lock or semaphore script's answer: `{1, fencing}` granted, or
/// `{0, x}` held, with `held` turning `x` into the holder description.
fn acquisition(
    v: &Value,
    name: &str,
    token: String,
    ttl: Duration,
    held: impl Fn(&Value) -> Option<String>,
) -> Result<Try> {
    match v {
        Value::Array(a) => match a.as_slice() {
            [Value::Int(1), Value::Int(f)] => Ok(Try::Acquired(Grant {
                name: name.into(),
                token,
                fencing_token: *f as u64,
                ttl_ms: ttl.as_millis() as u64,
            })),
            [Value::Int(0), x] => held(x).map(Try::Held).ok_or_else(|| unexpected(v)),
            _ => Err(unexpected(v)),
        },
        _ => Err(unexpected(v)),
    }
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
        let token = random_token("r");
        let v = self
            .run(
                0,
                &[key.clone(), format!("{key}:fencing")],
                &[token.clone(), owner.into(), ms(ttl)],
            )
            .await?;
        acquisition(&v, name, token, ttl, |held| match held {
            Value::BulkString(cur) => Some(owner_of(cur)),
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
        let token = random_token("s");
        let v = self
            .run(
                3,
                &[key.clone(), format!("{key}:fencing")],
                &[token.clone(), permits.to_string(), ms(ttl)],
            )
            .await?;
        acquisition(&v, name, token, ttl, |held| match held {
            Value::Int(live) => Some(live.to_string()),
            _ => None,
        })
    }

    async fn renew(&self, kind: Kind, name: &str, token: &str, ttl: Duration) -> Result<Outcome> {
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

    async fn claim(&self, queue: &str, job: &str, owner: &str, ttl: Duration) -> Result<Claim> {
        let base = self.key("job", &format!("{queue}/{job}"));
        let token = random_token("j");
        let v = self
            .run(
                6,
                &[
                    format!("{base}:claim"),
                    format!("{base}:done"),
                    format!("{base}:fencing"),
                ],
                &[token.clone(), owner.into(), ms(ttl)],
            )
            .await?;
        match &v {
            Value::Array(a) => match a.as_slice() {
                [Value::Int(1), Value::Int(f)] => Ok(Claim::Claimed(Grant {
                    name: format!("{queue}/{job}"),
                    token,
                    fencing_token: *f as u64,
                    ttl_ms: ttl.as_millis() as u64,
                })),
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
