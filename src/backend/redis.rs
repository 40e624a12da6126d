//! The Redis backend: a single Redis server, or **Redlock** across N
//! independent servers (quorum N/2 + 1), following the algorithm on
//! redis.io's "Distributed locks with Redis" page.
//!
//! - **Campaign** (one Lua script per server, atomic): if the key is free,
//!   `INCR` the fencing counter kept beside it (same `{hash tag}`, so it also
//!   runs on Redis Cluster) and `SET key "<token>|<fencing>|<identity>" PX ttl`;
//!   else return the current value and its `PTTL`. The token is random per term
//!   and decides ownership; the identity lets followers read who leads.
//! - **Renew**: Lua check that the value carries our token, then `PEXPIRE`. A
//!   key that is gone or someone else's is never re-created: the term is over.
//! - **Resign**: Lua check-then-`DEL`, then `PUBLISH` the released value on the
//!   election's channel, which followers subscribe to for a fast handover.
//! - **Redlock**: every verb goes to all servers at once, each under a short
//!   per-server timeout. A term is granted only with a quorum of servers, and
//!   its TTL is shortened by the spec's drift (1 % of TTL + 2 ms); the Elector
//!   counts validity from the instant the first request was sent, so the
//!   elapsed acquisition time is subtracted too. A failed campaign releases what
//!   it took. The fencing token is the largest counter in the quorum: any two
//!   quorums share a server whose counter grew, so it only grows while servers
//!   keep their data.
//!
//! Known limits (also in the README): a server restarted without persistence
//! forgets keys and counters; process pauses are covered by the Elector's
//! safety rule and by fencing tokens, not by Redis.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use futures_util::future::join_all;
use rand::Rng;
use redis::aio::{MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, Script, Value};
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout};
use tracing::{debug, warn};

use super::{BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term};

const BACKEND: &str = "redis";

const ACQUIRE: &str = r"
-- ARGV: 1 term token, 2 identity, 3 TTL in ms, 4 the run_id this candidate
-- last saw on this server ('' if none), 5 '1' while this candidate keeps out
-- of a server it saw restart less than a TTL ago (on its own clock).
-- Every answer ends with this server's run_id.
local info = redis.call('INFO', 'server')
local run = string.match(info, 'run_id:(%x+)') or ''
local current = redis.call('GET', KEYS[1])
if current then
  return {0, current, redis.call('PTTL', KEYS[1]), run}
end
local ttl = tonumber(ARGV[3])
-- A server that restarted (or was replaced, e.g. a replica promoted) since
-- this candidate last saw it may have forgotten a live term.
if ARGV[5] == '1' or (ARGV[4] ~= '' and ARGV[4] ~= run) then
  return {3, ttl + 1000, run}
end
-- A server up for less than one TTL may have restarted without persistence
-- and forgotten a live term. uptime_in_seconds counts whole wall-clock
-- seconds and reads N after as little as N - 1 s: demand one more second.
local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
if up and up * 1000 < ttl + 1000 then
  return {3, ttl + 1000 - up * 1000, run}
end
-- The fencing counter must be a non-negative integer that a Lua number holds
-- exactly (at most 15 digits); anything else was written by someone else and
-- is refused, never wrapped or rounded.
local c = redis.call('GET', KEYS[2])
if c and (not string.match(c, '^%d+$') or string.len(c) > 15) then
  return {4, c, run}
end
-- Tokens only grow: the next token is max(counter + 1, server clock in ms),
-- so a counter that went back (a lagging replica promoted, a restart without
-- persistence) does not hand out a token an earlier term had.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fencing = math.max((tonumber(c) or 0) + 1, now)
local f = string.format('%.0f', fencing)
redis.call('SET', KEYS[2], f)
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
return {1, f, run}
";

const RENEW: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then
  -- Redlock only: put the key back on a server that lost it while a quorum
  -- still holds the term (never over someone else's key).
  if ARGV[3] ~= '' then
    redis.call('SET', KEYS[1], ARGV[3], 'NX', 'PX', ARGV[2])
    return 2
  end
  return 0
end
if string.sub(current, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. '|' then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// Redlock, after a win: raise the fencing counter to at least ARGV[1], so
/// the next quorum (which shares a server with this one) counts past it, and
/// write the term's token into our value where we hold the key, so every
/// observer reads the same token for the term. A counter that is not a
/// non-negative integer is left alone and reported (-1).
const RAISE: &str = r"
local c = redis.call('GET', KEYS[2])
if c and (not string.match(c, '^%d+$') or string.len(c) > 15) then return -1 end
if tonumber(c or '0') < tonumber(ARGV[1]) then redis.call('SET', KEYS[2], ARGV[1]) end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, string.len(ARGV[2]) + 1) == ARGV[2] .. '|' then
  redis.call('SET', KEYS[1], ARGV[3], 'XX', 'KEEPTTL')
end
return 1
";

const RELEASE: &str = r"
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '|' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], current)
  return 1
end
return 0
";

/// How to reach the Redis servers. Secrets are held in memory only; logs and
/// errors use [`redact`]ed URLs.
#[derive(Clone, Default)]
pub struct RedisOptions {
    /// `redis://` or `rediss://` URLs, one per independent server (1 = single
    /// instance, 3 or more = Redlock).
    pub urls: Vec<String>,
    /// Password for every URL that does not carry one (`--redis-password-file`).
    pub password: Option<String>,
    /// PEM of the CA that signed the servers' certificates, for `rediss://`
    /// with a private CA (else the system's roots).
    pub ca_pem: Option<Vec<u8>>,
    /// Deadline of each request to one server (and of connecting to it).
    pub per_server_timeout: Duration,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
            )
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("per_server_timeout", &self.per_server_timeout)
            .finish()
    }
}

/// `url` with any password replaced by `***`, for logs and errors: the
/// userinfo's password (or a lone userinfo) and the values of `pass=` and
/// `password=` query parameters (`redis+unix:///run/redis.sock?pass=...`).
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match (base.find("://"), base.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let creds = &base[scheme_end + 3..at];
            let user = creds.split_once(':').map_or(creds, |(u, _)| u);
            let user = if creds.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            format!("{}{}{}", &base[..scheme_end + 3], user, &base[at..])
        }
        _ => base.to_owned(),
    };
    if let Some(q) = query {
        out.push('?');
        let parts: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _))
                    if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") =>
                {
                    format!("{k}=***")
                }
                _ => kv.to_owned(),
            })
            .collect();
        out.push_str(&parts.join("&"));
    }
    out
}

/// Check a Redis URL: `redis://[user[:password]@]host:port[/db]` or `rediss://…`.
///
/// # Errors
/// A message with the redacted value and an example.
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    let shown = redact(url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(format!(
            "{shown} needs the scheme redis:// or rediss://, e.g. redis://127.0.0.1:6379"
        ));
    }
    redis::Client::open(url)
        .map(|_| ())
        .map_err(|e| format!("{shown} is not a Redis URL ({e}); use e.g. redis://user@host:6379/0"))
}

struct Server {
    label: String,
    client: Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    pubsub: Mutex<Option<PubSub>>,
    checked_config: std::sync::atomic::AtomicBool,
    /// The server process this candidate last saw (its `run_id`), and until
    /// when (on our monotonic clock) it keeps out of a server it saw restart.
    run: std::sync::Mutex<RunSeen>,
}

/// What this candidate knows of one server's process.
#[derive(Default)]
struct RunSeen {
    /// `run_id` of the process that last answered; `None` before the first answer.
    id: Option<String>,
    /// No campaign on this server before this instant: it restarted (or was
    /// replaced) while we watched, so a term it forgot may still be running.
    hold_until: Option<Instant>,
}

/// What one server answered to the campaign script.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Acquired(u64),
    Held(String, i64),
    /// The server is younger than one TTL plus a second, or restarted while we
    /// watched (maybe without persistence); try again after this many milliseconds.
    Fresh(i64),
}

/// Refusal of a fencing counter that is not a non-negative integer.
#[derive(Debug, thiserror::Error)]
#[error(
    "the fencing counter {key} holds {value:?}, not a non-negative integer of at most 15 digits"
)]
pub struct BadCounter {
    /// The counter key.
    pub key: String,
    /// What it holds.
    pub value: String,
}

/// The integer in a script answer (an integer reply, or a bulk string of digits).
fn uint_of(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// The holder of the term seen on at least `quorum` of `held`, with the
/// largest fencing token among those copies (the leader's token: Redlock
/// writes it into every copy it can, and any quorum of copies includes one)
/// and the earliest expiry. `None` when no term has a quorum.
fn quorum_holder(held: &[Holder], quorum: usize) -> Option<Holder> {
    for h in held {
        let same: Vec<&Holder> = held.iter().filter(|o| o.term_id == h.term_id).collect();
        if same.len() >= quorum {
            let mut holder = h.clone();
            holder.fencing_token = same.iter().map(|o| o.fencing_token).max().unwrap_or(0);
            holder.expires_in = same.iter().filter_map(|o| o.expires_in).min();
            return Some(holder);
        }
    }
    None
}

/// The Redis [`LeaseBackend`] for one election, over one server or a Redlock group.
pub struct RedisBackend {
    prefix: String,
    key: String,
    counter_key: String,
    channel: String,
    servers: Vec<Server>,
    quorum: usize,
    timeout: Duration,
    acquire: Script,
    renew: Script,
    release: Script,
    raise: Script,
}

/// A parsed holder value `<token>|<fencing>|<identity>`.
fn parse_value(value: &str, pttl_ms: i64) -> Holder {
    let mut parts = value.splitn(3, '|');
    let token = parts.next().unwrap_or("").to_owned();
    let fencing = parts.next().and_then(|f| f.parse().ok()).unwrap_or(0);
    let identity = parts.next().unwrap_or("").to_owned();
    Holder {
        identity,
        fencing_token: fencing,
        term_id: token,
        revision: 0,
        // PTTL -1: a key without expiry (written by someone else); -2: gone.
        // Neither says when to look again: the Elector caps this by its
        // retry period instead of retrying at once.
        expires_in: Some(if pttl_ms < 0 {
            NO_EXPIRY_HINT
        } else {
            Duration::from_millis(pttl_ms as u64)
        }),
    }
}

/// Stand-in expiry for a key without a TTL; the Elector waits at most its
/// retry period.
const NO_EXPIRY_HINT: Duration = Duration::from_secs(3600);

fn new_token() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Redlock spec's clock drift allowance: 1 % of the TTL plus 2 ms.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

impl RedisBackend {
    /// A backend for election keys under `prefix` (`<prefix>{<election>}`).
    /// Does not connect: the first call does.
    ///
    /// # Errors
    /// A message naming the (redacted) URL that cannot be used.
    pub fn new(
        prefix: &str,
        election: &str,
        options: RedisOptions,
    ) -> std::result::Result<Arc<Self>, String> {
        let mut servers = Vec::new();
        for url in &options.urls {
            let label = redact(url);
            let mut info: redis::ConnectionInfo = url
                .as_str()
                .parse()
                .map_err(|e| format!("{label} is not a Redis URL: {e}"))?;
            if info.redis.password.is_none() {
                info.redis.password = options.password.clone();
            }
            let tls = matches!(info.addr, ConnectionAddr::TcpTls { .. });
            let client = match (&options.ca_pem, tls) {
                (Some(ca), true) => Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.clone()),
                    },
                ),
                _ => Client::open(info),
            }
            .map_err(|e| format!("{label}: {e}"))?;
            servers.push(Server {
                label,
                client,
                conn: Mutex::new(None),
                pubsub: Mutex::new(None),
                checked_config: std::sync::atomic::AtomicBool::new(false),
                run: std::sync::Mutex::new(RunSeen::default()),
            });
        }
        if servers.is_empty() {
            return Err("no Redis URL given".into());
        }
        let quorum = servers.len() / 2 + 1;
        let base = format!("{prefix}{{{election}}}");
        Ok(Arc::new(RedisBackend {
            prefix: prefix.to_owned(),
            counter_key: format!("{base}:fencing"),
            channel: format!("{base}:released"),
            key: base,
            servers,
            quorum,
            timeout: options.per_server_timeout,
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
            raise: Script::new(RAISE),
        }))
    }

    /// Number of servers that must agree (N/2 + 1).
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    fn endpoints(&self) -> String {
        self.servers
            .iter()
            .map(|s| s.label.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn classify(&self, server: &Server, err: redis::RedisError) -> BackendError {
        if super::is_tls_error(&err) {
            return BackendError::Tls {
                backend: BACKEND,
                endpoints: server.label.clone(),
                source: Box::new(err),
            };
        }
        if err.kind() == redis::ErrorKind::AuthenticationFailed {
            return BackendError::Auth {
                backend: BACKEND,
                source: Box::new(err),
            };
        }
        let code = match err.code() {
            Some("NOPERM") => {
                return BackendError::Auth {
                    backend: BACKEND,
                    source: Box::new(err),
                };
            }
            Some("WRONGTYPE") => Some("wrongtype"),
            Some("READONLY") => Some("readonly"),
            Some("LOADING") => Some("loading"),
            Some("OOM") => Some("oom"),
            // Redis 7.0 reports an ACL denial inside a script with the generic
            // ERR code; its wording is the only mark (the one place we read
            // message text).
            Some("ERR")
                if err
                    .detail()
                    .is_some_and(|d| d.contains("can't run this command")) =>
            {
                return BackendError::Auth {
                    backend: BACKEND,
                    source: Box::new(err),
                };
            }
            Some("NOAUTH") | Some("WRONGPASS") => {
                return BackendError::Auth {
                    backend: BACKEND,
                    source: Box::new(err),
                };
            }
            _ => None,
        };
        if let Some(code) = code {
            return BackendError::Rejected {
                backend: BACKEND,
                code,
                source: Box::new(err),
            };
        }
        if err.is_timeout() {
            return BackendError::Timeout {
                backend: BACKEND,
                call: "request",
                timeout_ms: self.timeout.as_millis() as u64,
            };
        }
        if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
            return BackendError::Unreachable {
                backend: BACKEND,
                endpoints: server.label.clone(),
                source: Box::new(err),
            };
        }
        BackendError::Server {
            backend: BACKEND,
            source: Box::new(err),
        }
    }

    /// Number of servers (1 = single instance, more = Redlock).
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// The key prefix in force, e.g. `leader-elector:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A connection to server `i`, with the per-server timeouts, for the
    /// coordination API. Errors are classified.
    ///
    /// # Errors
    /// A [`BackendError`] when the server cannot be reached.
    pub async fn connection_to(&self, i: usize) -> Result<MultiplexedConnection> {
        self.connection(&self.servers[i]).await
    }

    /// A new pub/sub connection to server `i` for the coordination API's
    /// waiters (issue 11), within the per-server timeout.
    ///
    /// # Errors
    /// A classified [`BackendError`] when the server cannot be reached.
    pub async fn pubsub_to(&self, i: usize) -> Result<PubSub> {
        let server = &self.servers[i];
        match timeout(self.timeout, server.client.get_async_pubsub()).await {
            Ok(r) => r.map_err(|e| self.classify(server, e)),
            Err(_) => Err(BackendError::Timeout {
                backend: BACKEND,
                call: "subscribe",
                timeout_ms: self.timeout.as_millis() as u64,
            }),
        }
    }

    /// The per-server timeout of one command.
    pub fn call_timeout(&self) -> Duration {
        self.timeout
    }

    /// Classify a Redis error from server `i`.
    pub fn classify_error(&self, i: usize, err: redis::RedisError) -> BackendError {
        self.classify(&self.servers[i], err)
    }

    /// Forget server `i`'s connection after a transport error.
    pub async fn forget(&self, i: usize, err: &BackendError) {
        self.forget_on_transport_error(&self.servers[i], err).await;
    }

    async fn connection(&self, server: &Server) -> Result<MultiplexedConnection> {
        let mut guard = server.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let conn = server
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| self.classify(server, e))?;
        *guard = Some(conn.clone());
        drop(guard);
        self.check_server_config(server, conn.clone()).await;
        Ok(conn)
    }

    /// Warn once per server when it can forget or evict the election key.
    async fn check_server_config(&self, server: &Server, mut conn: MultiplexedConnection) {
        use std::sync::atomic::Ordering;
        if server.checked_config.swap(true, Ordering::SeqCst) {
            return;
        }
        let get = |name: &'static str| {
            let mut conn = conn.clone();
            async move {
                let r: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(name)
                    .query_async(&mut conn)
                    .await;
                r.ok().and_then(|v| v.get(1).cloned())
            }
        };
        if let Ok(Some(aof)) = timeout(self.timeout, get("appendonly")).await
            && aof == "no"
        {
            warn!(server = %server.label, "appendonly is off: if this Redis restarts it forgets the election key and the fencing counter (run it with --appendonly yes, or keep a restarted server out for one TTL)");
        }
        if let Ok(Some(policy)) = timeout(self.timeout, get("maxmemory-policy")).await
            && policy.starts_with("allkeys")
        {
            warn!(server = %server.label, policy = %policy, "maxmemory-policy can evict the election key: use noeviction or a volatile-* policy");
        }
        let _ = &mut conn;
    }

    async fn forget_on_transport_error(&self, server: &Server, err: &BackendError) {
        if matches!(
            err,
            BackendError::Unreachable { .. } | BackendError::Timeout { .. }
        ) {
            *server.conn.lock().await = None;
        }
    }

    /// Run `script` on one server under the per-server timeout.
    async fn run_on(
        &self,
        server: &Server,
        script: &Script,
        args: &[&str],
        with_counter: bool,
    ) -> Result<Value> {
        let work = async {
            let mut conn = self.connection(server).await?;
            let mut inv = script.key(&self.key);
            if with_counter {
                inv.key(&self.counter_key);
            }
            for a in args {
                inv.arg(*a);
            }
            inv.invoke_async::<Value>(&mut conn)
                .await
                .map_err(|e| self.classify(server, e))
        };
        let r = match timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::Timeout {
                backend: BACKEND,
                call: "request",
                timeout_ms: self.timeout.as_millis() as u64,
            }),
        };
        if let Err(e) = &r {
            self.forget_on_transport_error(server, e).await;
        }
        r
    }

    async fn acquire_on(
        &self,
        server: &Server,
        token: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Answer> {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let (known, holding) = {
            let seen = server.run.lock().expect("run lock");
            let holding = seen.hold_until.is_some_and(|t| Instant::now() < t);
            (seen.id.clone().unwrap_or_default(), holding)
        };
        let hold = if holding { "1" } else { "0" };
        let v = self
            .run_on(
                server,
                &self.acquire,
                &[token, identity, &ttl_ms, &known, hold],
                true,
            )
            .await?;
        let bad = || BackendError::Server {
            backend: BACKEND,
            source: format!("unexpected answer to the campaign script: {v:?}").into(),
        };
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        let run = match items.last() {
            Some(Value::BulkString(r)) => String::from_utf8_lossy(r).into_owned(),
            _ => return Err(bad()),
        };
        // A new server process behind the same address: keep out of it for
        // one TTL (plus the uptime clock's second) on our own clock, whatever
        // its wall clock says.
        let hold_until = {
            let mut seen = server.run.lock().expect("run lock");
            if seen.id.as_deref().is_some_and(|k| k != run) {
                warn!(server = %server.label, run_id = %run, "the Redis server restarted or was replaced: no campaign on it for one lease duration");
                seen.hold_until = Some(Instant::now() + ttl + Duration::from_secs(1));
            }
            seen.id = Some(run);
            seen.hold_until
        };
        match items.as_slice() {
            [Value::Int(1), f, _] => uint_of(f).map(Answer::Acquired).ok_or_else(bad),
            [Value::Int(0), Value::BulkString(value), Value::Int(pttl), _] => Ok(Answer::Held(
                String::from_utf8_lossy(value).into_owned(),
                *pttl,
            )),
            [Value::Int(3), Value::Int(wait), _] => {
                let own = hold_until.map_or(0, |t| {
                    t.saturating_duration_since(Instant::now()).as_millis() as i64
                });
                // Our own hold-off, if any, else the server's uptime wait.
                Ok(Answer::Fresh(if own > 0 { own } else { *wait }))
            }
            [Value::Int(4), Value::BulkString(value), _] => Err(BackendError::Rejected {
                backend: BACKEND,
                code: "fencing_counter",
                source: Box::new(BadCounter {
                    key: self.counter_key.clone(),
                    value: String::from_utf8_lossy(value).into_owned(),
                }),
            }),
            _ => Err(bad()),
        }
    }

    async fn release_on(&self, server: &Server, token: &str) -> Result<()> {
        self.run_on(server, &self.release, &[token, &self.channel], false)
            .await
            .map(|_| ())
    }

    /// Subscribe every server's pub/sub connection to the election channel, once.
    async fn ensure_subscribed(&self) {
        for server in &self.servers {
            let mut guard = server.pubsub.lock().await;
            if guard.is_some() {
                continue;
            }
            let sub = async {
                let mut ps = server.client.get_async_pubsub().await?;
                ps.subscribe(&self.channel).await?;
                Ok::<_, redis::RedisError>(ps)
            };
            match timeout(self.timeout, sub).await {
                Ok(Ok(ps)) => *guard = Some(ps),
                Ok(Err(e)) => {
                    debug!(server = %server.label, error = %e, "cannot subscribe to the release channel yet")
                }
                Err(_) => {
                    debug!(server = %server.label, "subscribing to the release channel timed out")
                }
            }
        }
    }

    /// Wait on one server's subscription for the release of `token`.
    /// Returns `false` when the subscription broke.
    async fn wait_release_on(&self, server: &Server, token: &str) -> bool {
        let mut guard = server.pubsub.lock().await;
        let Some(ps) = guard.as_mut() else {
            return false;
        };
        let prefix = format!("{token}|");
        let mut stream = ps.on_message();
        while let Some(msg) = stream.next().await {
            if msg.get_payload_bytes().starts_with(prefix.as_bytes()) {
                return true;
            }
        }
        drop(stream);
        *guard = None;
        false
    }
}

#[async_trait]
impl LeaseBackend for RedisBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        _previous: Option<&Holder>,
    ) -> Result<Campaign> {
        // Subscribe before reading, so a release after our read is not missed.
        self.ensure_subscribed().await;
        let start = Instant::now();
        let token = new_token();
        let answers = join_all(
            self.servers
                .iter()
                .map(|s| self.acquire_on(s, &token, identity, ttl)),
        )
        .await;
        let n = self.servers.len();
        let mut acquired = Vec::new();
        let mut held: Vec<Holder> = Vec::new();
        let mut first_error = None;
        let mut fresh: Option<Duration> = None;
        for (i, a) in answers.into_iter().enumerate() {
            match a {
                Ok(Answer::Acquired(f)) => acquired.push((i, f)),
                Ok(Answer::Held(v, pttl)) => held.push(parse_value(&v, pttl)),
                Ok(Answer::Fresh(ms)) => {
                    let d = Duration::from_millis(ms.max(1) as u64);
                    fresh = Some(fresh.map_or(d, |f| f.min(d)));
                }
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        let validity = ttl
            .saturating_sub(drift(ttl))
            .saturating_sub(start.elapsed());
        if acquired.len() >= self.quorum && !validity.is_zero() {
            let fencing = acquired.iter().map(|(_, f)| *f).max().unwrap_or(0);
            // Redlock: raise every server's counter to this token before
            // claiming, so the next quorum (sharing a server) counts past it,
            // and write the token into our copies of the key, so followers
            // read the leader's token whichever servers they ask.
            let raised = if n > 1 {
                let token_s = fencing.to_string();
                let value = format!("{token}|{fencing}|{identity}");
                join_all(self.servers.iter().map(|s| {
                    let args = [token_s.as_str(), token.as_str(), value.as_str()];
                    async move {
                        let work = async {
                            let mut conn = self.connection(s).await?;
                            self.raise
                                .key(&self.key)
                                .key(&self.counter_key)
                                .arg(&args[..])
                                .invoke_async::<Value>(&mut conn)
                                .await
                                .map_err(|e| self.classify(s, e))
                        };
                        matches!(timeout(self.timeout, work).await, Ok(Ok(Value::Int(1))))
                    }
                }))
                .await
                .into_iter()
                .filter(|ok| *ok)
                .count()
            } else {
                n
            };
            if raised < self.quorum {
                join_all(
                    acquired
                        .iter()
                        .map(|(i, _)| self.release_on(&self.servers[*i], &token)),
                )
                .await;
                return Ok(Campaign::Waiting {
                    previous: Holder {
                        identity: String::new(),
                        fencing_token: 0,
                        term_id: String::new(),
                        revision: 0,
                        expires_in: None,
                    },
                    retry_after: Duration::from_millis(rand::rng().random_range(10..=200)),
                });
            }
            return Ok(Campaign::Elected(Term {
                holder: Holder {
                    identity: identity.to_owned(),
                    fencing_token: fencing,
                    term_id: token,
                    revision: 0,
                    expires_in: None,
                },
                ttl: ttl.saturating_sub(drift(ttl)),
                servers: (n > 1).then_some((acquired.len(), n)),
            }));
        }
        // No quorum: give back what we took, everywhere.
        if !acquired.is_empty() {
            join_all(
                acquired
                    .iter()
                    .map(|(i, _)| self.release_on(&self.servers[*i], &token)),
            )
            .await;
        }
        if acquired.len() + held.len() < self.quorum
            && let Some(e) = first_error
        {
            return Err(e);
        }
        // The holder seen on a quorum of servers, if any.
        if let Some(holder) = quorum_holder(&held, self.quorum) {
            return Ok(Campaign::Following(holder));
        }
        // A split: retry after a random delay (Redlock spec), or when the
        // minority keys expire; a server younger than one TTL sets the wait.
        let random =
            fresh.unwrap_or_else(|| Duration::from_millis(rand::rng().random_range(10..=200)));
        let retry_after = held
            .iter()
            .filter_map(|h| h.expires_in)
            .min()
            .map_or(random, |e| e.min(random));
        Ok(Campaign::Waiting {
            previous: held.into_iter().next().unwrap_or(Holder {
                identity: String::new(),
                fencing_token: 0,
                term_id: String::new(),
                revision: 0,
                expires_in: None,
            }),
            retry_after,
        })
    }

    async fn read(&self) -> Result<Option<Holder>> {
        self.ensure_subscribed().await;
        let reads = join_all(self.servers.iter().map(|s| async move {
            let work = async {
                let mut conn = self.connection(s).await?;
                let (value, pttl): (Option<String>, i64) = redis::pipe()
                    .cmd("GET")
                    .arg(&self.key)
                    .cmd("PTTL")
                    .arg(&self.key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.classify(s, e))?;
                Ok::<_, BackendError>(value.map(|v| parse_value(&v, pttl)))
            };
            match timeout(self.timeout, work).await {
                Ok(r) => r,
                Err(_) => Err(BackendError::Timeout {
                    backend: BACKEND,
                    call: "read",
                    timeout_ms: self.timeout.as_millis() as u64,
                }),
            }
        }))
        .await;
        let mut held = Vec::new();
        let mut answered = 0;
        let mut first_error = None;
        for r in reads {
            match r {
                Ok(h) => {
                    answered += 1;
                    held.extend(h);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if answered < self.quorum {
            return Err(first_error.expect("fewer answers than a quorum means an error"));
        }
        Ok(quorum_holder(&held, self.quorum))
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let ttl_ms = term_full_ttl(term).as_millis().max(1).to_string();
        // Redlock: the value to put back where a server lost the key.
        let recreate = if self.servers.len() > 1 {
            format!(
                "{}|{}|{}",
                term.holder.term_id, term.holder.fencing_token, term.holder.identity
            )
        } else {
            String::new()
        };
        let args = [
            term.holder.term_id.as_str(),
            ttl_ms.as_str(),
            recreate.as_str(),
        ];
        let answers = join_all(
            self.servers
                .iter()
                .map(|s| self.run_on(s, &self.renew, &args, false)),
        )
        .await;
        let n = self.servers.len();
        let (mut ok, mut gone, mut taken) = (0, 0, 0);
        let mut first_error = None;
        for a in answers {
            match a {
                Ok(Value::Int(1)) => ok += 1,
                // Put back on a server that had lost it: counts next time.
                Ok(Value::Int(2)) => {}
                Ok(Value::Int(0)) => gone += 1,
                Ok(Value::Int(-1)) => taken += 1,
                Ok(other) => {
                    first_error.get_or_insert(BackendError::Server {
                        backend: BACKEND,
                        source: format!("unexpected answer to the renew script: {other:?}").into(),
                    });
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if ok >= self.quorum {
            return Ok(Renewal::Renewed {
                ttl: term.ttl,
                servers: (n > 1).then_some((ok, n)),
            });
        }
        if gone + taken > n - self.quorum {
            return Ok(Renewal::Lost(if taken > gone {
                LostReason::KeyOverwritten
            } else {
                LostReason::KeyDeleted
            }));
        }
        Err(first_error.unwrap_or_else(|| BackendError::Unreachable {
            backend: BACKEND,
            endpoints: self.endpoints(),
            source: format!(
                "only {ok} of {n} servers renewed; a quorum is {}",
                self.quorum
            )
            .into(),
        }))
    }

    async fn resign(&self, term: &Term) -> Result<()> {
        let answers = join_all(
            self.servers
                .iter()
                .map(|s| self.release_on(s, &term.holder.term_id)),
        )
        .await;
        let failed: Vec<BackendError> = answers.into_iter().filter_map(|r| r.err()).collect();
        // Resigned when no quorum can still hold the key.
        if failed.len() >= self.quorum
            && let Some(e) = failed.into_iter().next()
        {
            return Err(e);
        }
        Ok(())
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        self.ensure_subscribed().await;
        let waits: Vec<_> = self
            .servers
            .iter()
            .map(|s| Box::pin(self.wait_release_on(s, &seen.term_id)))
            .collect();
        let mut pending = waits;
        while !pending.is_empty() {
            let (released, _, rest) = futures_util::future::select_all(pending).await;
            if released {
                return Ok(());
            }
            pending = rest;
        }
        // Every subscription is broken: report it; the Elector backs off and
        // campaigns again (which re-subscribes).
        Err(BackendError::Unreachable {
            backend: BACKEND,
            endpoints: self.endpoints(),
            source: "the release-channel subscription broke on every server".into(),
        })
    }
}

/// The TTL to set on renewal: the term's TTL is already shortened by the
/// drift, so add it back for the server's PEXPIRE.
fn term_full_ttl(term: &Term) -> Duration {
    // term.ttl = ttl - (ttl/100 + 2ms)  =>  ttl = (term.ttl + 2ms) * 100/99
    (term.ttl + Duration::from_millis(2)).mul_f64(100.0 / 99.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact("rediss://pw@h:1"), "rediss://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redis+unix:///run/r.sock?db=1&pass=pw"),
            "redis+unix:///run/r.sock?db=1&pass=***"
        );
        assert_eq!(
            redact("redis://u:pw@h:1/0?password=pw2"),
            "redis://u:***@h:1/0?password=***"
        );
    }

    #[test]
    fn values_parse_with_pipes_in_the_identity() {
        let h = parse_value("abc|42|pod|x", 1500);
        assert_eq!(h.term_id, "abc");
        assert_eq!(h.fencing_token, 42);
        assert_eq!(h.identity, "pod|x");
        assert_eq!(h.expires_in, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn drift_follows_the_redlock_spec() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
        let term = Term {
            holder: parse_value("t|1|i", 0),
            ttl: Duration::from_secs(10) - drift(Duration::from_secs(10)),
            servers: None,
        };
        let back = term_full_ttl(&term);
        assert!(
            back >= Duration::from_millis(9999) && back <= Duration::from_millis(10001),
            "{back:?}"
        );
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("redis://127.0.0.1:6379").is_ok());
        assert!(
            check_url("http://127.0.0.1:6379")
                .unwrap_err()
                .contains("redis://")
        );
        assert!(!check_url("localhost:6379").unwrap_err().contains("pw"));
    }
}
