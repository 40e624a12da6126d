//! One Redis server: its connection (made on first use, forgotten after a
//! transport error or timeout), its errors classified into [`BackendError`]
//! once, every request under the per-server timeout, and the named scripts of
//! [`Lua`] run on it — with `--redis-min-replicas`, a script's grant followed
//! by `WAIT` on the same connection, so it counts only once replicas have it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::PubSub;
use redis::cluster::ClusterClient;
use redis::{AsyncConnectionConfig, Client, FromRedisValue, Value};
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout};
use tracing::{info, warn};

use super::conn::Conn;
use super::exclusive::Exclusive;
use super::lua::Lua;
use super::sentinel::{Locator, READONLY_FIXED, SentinelOptions, confirm_master, open_client};
use super::{BACKEND, RedisOptions, UNREPLICATED, Unreplicated, is_unreplicated, redact};
use crate::backend::{BackendError, Result};

mod classify;

/// Where a [`Server`]'s requests go.
enum Target {
    /// A fixed address (`--redis-url`).
    Fixed(Client),
    /// The primary the Sentinels name (`--redis-sentinel`), confirmed by
    /// `ROLE` on every new connection.
    Sentinel {
        locator: Box<Locator>,
        /// The primary last found, and a client for it (pub/sub).
        current: std::sync::Mutex<Option<(String, Client)>>,
    },
    /// A Redis Cluster (`--redis-cluster`): the cluster client over the
    /// seeds, and a client per seed for pub/sub.
    Cluster {
        client: ClusterClient,
        seeds: Vec<(String, Client)>,
        /// The seed that last gave a pub/sub connection.
        last_seed: std::sync::atomic::AtomicUsize,
    },
}

/// One Redis server of a single-server set-up or of a Redlock group: a
/// fixed address, the primary a Sentinel group names, or a Redis Cluster
/// (each request on its keys' slot's primary).
pub struct Server {
    label: String,
    target: Target,
    /// Whether the hint towards `--redis-sentinel` was logged (fixed URLs
    /// that meet a replica).
    told_sentinel: AtomicBool,
    conn: Mutex<Option<Conn>>,
    checked_config: AtomicBool,
    timeout: Duration,
    /// Replicas that must acknowledge a grant (`WAIT`); 0 = off.
    min_replicas: u32,
    /// Connections lent to one acknowledged write at a time.
    exclusive: Exclusive,
}

impl Server {
    /// A server for `url` (the password and CA of `options` apply). Does not
    /// connect: the first request does.
    ///
    /// # Errors
    /// A message naming the (redacted) URL that cannot be used.
    pub fn open(url: &str, options: &RedisOptions) -> std::result::Result<Server, String> {
        let label = redact(url);
        let mut info: redis::ConnectionInfo = url
            .parse()
            .map_err(|e| format!("{label} is not a Redis URL: {e}"))?;
        if info.redis.password.is_none() {
            info.redis.password = options.password.clone();
        }
        let client = open_client(info, options.ca_pem.as_deref(), &label)?;
        Ok(Self::with_target(label, Target::Fixed(client), options))
    }

    /// The primary of the Sentinel group `sentinel` (the password and CA of
    /// `options` apply to the data servers). Does not connect.
    ///
    /// # Errors
    /// A message naming the (redacted) Sentinel address that cannot be used.
    pub fn sentinel(
        sentinel: &SentinelOptions,
        options: &RedisOptions,
    ) -> std::result::Result<Server, String> {
        let locator = Box::new(Locator::new(sentinel, options)?);
        let label = locator.label();
        let target = Target::Sentinel {
            locator,
            current: std::sync::Mutex::new(None),
        };
        Ok(Self::with_target(label, target, options))
    }

    /// Whether this is the primary a Sentinel group names (`--redis-sentinel`).
    pub fn is_sentinel(&self) -> bool {
        matches!(self.target, Target::Sentinel { .. })
    }

    /// Whether this is a Redis Cluster (`--redis-cluster`).
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster { .. })
    }

    /// A Redis Cluster over the seed `urls` (the password and CA of
    /// `options` apply to every node). Does not connect.
    ///
    /// # Errors
    /// A message naming the (redacted) URL that cannot be used.
    pub fn cluster(urls: &[String], options: &RedisOptions) -> std::result::Result<Server, String> {
        let (client, seeds) = super::cluster::open(urls, options)?;
        let target = Target::Cluster {
            client,
            seeds,
            last_seed: Default::default(),
        };
        Ok(Self::with_target(
            super::cluster::label(urls),
            target,
            options,
        ))
    }

    fn with_target(label: String, target: Target, options: &RedisOptions) -> Server {
        Server {
            label,
            target,
            told_sentinel: AtomicBool::new(false),
            conn: Mutex::new(None),
            checked_config: AtomicBool::new(false),
            timeout: options.per_server_timeout,
            min_replicas: options.min_replicas,
            exclusive: Exclusive::default(),
        }
    }

    /// The redacted URL, for logs and errors.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The deadline of one request (and of connecting).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Replicas that must acknowledge a grant (`--redis-min-replicas`; 0 = off).
    pub fn min_replicas(&self) -> u32 {
        self.min_replicas
    }

    fn timed_out(&self, call: &'static str) -> BackendError {
        BackendError::Timeout {
            backend: BACKEND,
            call,
            timeout_ms: self.timeout.as_millis() as u64,
        }
    }

    /// A new connection under the per-server timeouts: to the fixed
    /// address, or to the primary the Sentinels name now, once it said with
    /// `ROLE` that it is the master.
    async fn dial(&self) -> Result<Conn> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let client = match &self.target {
            Target::Fixed(client) => client.clone(),
            Target::Sentinel { .. } => self.discover().await?,
            Target::Cluster { client, .. } => {
                let conn = client.get_async_connection().await;
                return Ok(Conn::Cluster(conn.map_err(|e| self.classify(e))?));
            }
        };
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| self.classify(e))?;
        if let Target::Sentinel { current, .. } = &self.target {
            let at = current.lock().expect("current lock").clone();
            let at = at.map(|(a, _)| a).unwrap_or_default();
            confirm_master(&mut conn, &at, |e| self.classify(e)).await?;
        }
        Ok(Conn::Single(conn))
    }

    /// Ask the Sentinels for the primary; remember it (and log a change).
    async fn discover(&self) -> Result<Client> {
        let Target::Sentinel { locator, current } = &self.target else {
            unreachable!("discover is for Sentinel targets")
        };
        let (at, client) = locator.discover().await?;
        let mut slot = current.lock().expect("current lock");
        if slot.as_ref().is_none_or(|(a, _)| *a != at) {
            info!(master = %locator.master(), primary = %at, "the Sentinels name this primary");
        }
        *slot = Some((at, client.clone()));
        Ok(client)
    }

    /// The shared connection, made on first use (and again after a
    /// Sentinel announced a failover).
    async fn connection(&self) -> Result<Conn> {
        let mut guard = self.conn.lock().await;
        if let Target::Sentinel { locator, .. } = &self.target
            && locator.switched().await
        {
            *guard = None;
        }
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let conn = self.dial().await?;
        *guard = Some(conn.clone());
        drop(guard);
        self.check_config(conn.clone()).await;
        Ok(conn)
    }

    /// A new connection of its own, for one write and its `WAIT`.
    async fn open_exclusive(&self) -> Result<Conn> {
        let conn = self.dial().await?;
        self.check_config(conn.clone()).await;
        Ok(conn)
    }

    /// Warn once when this server can forget or evict the keys, or has
    /// fewer replicas than `--redis-min-replicas`.
    async fn check_config(&self, conn: Conn) {
        if self.checked_config.swap(true, Ordering::SeqCst) {
            return;
        }
        conn.warn_config(&self.label, self.timeout, self.min_replicas)
            .await;
    }

    /// Forget the connection after a transport error or a timeout (and,
    /// with Sentinel, a `READONLY` answer), so the next request connects
    /// afresh (and asks the Sentinels again). Fixed URLs that meet a replica
    /// say once that `--redis-sentinel` follows failovers.
    async fn forget(&self, err: &BackendError) {
        let readonly = matches!(
            err,
            BackendError::Rejected {
                code: "readonly",
                ..
            }
        );
        let sentinel = !matches!(self.target, Target::Fixed(_));
        if readonly && !sentinel && !self.told_sentinel.swap(true, Ordering::SeqCst) {
            warn!(server = %self.label, "{READONLY_FIXED}");
        }
        if matches!(
            err,
            BackendError::Unreachable { .. } | BackendError::Timeout { .. }
        ) || (readonly && sentinel)
        {
            *self.conn.lock().await = None;
        }
    }

    /// Run a command or pipeline under the per-server timeout.
    ///
    /// # Errors
    /// A classified [`BackendError`]; the connection is forgotten on a
    /// transport error or timeout.
    pub async fn query<T: FromRedisValue>(
        &self,
        call: &'static str,
        cmd: &redis::Pipeline,
    ) -> Result<T> {
        let work = async {
            let mut conn = self.connection().await?;
            cmd.query_async(&mut conn)
                .await
                .map_err(|e| self.classify(e))
        };
        self.settle(
            timeout(crate::budget::limit(self.timeout), work).await,
            call,
        )
        .await
    }

    /// Run script `lua` with `keys` and `args` under the per-server timeout.
    /// With `--redis-min-replicas`, a script that can grant runs on a
    /// connection of its own (`Exclusive`), and an answer that grants
    /// ([`Lua::grants`]) counts only after `WAIT` on that connection saw
    /// enough replicas acknowledge it.
    ///
    /// # Errors
    /// As [`Server::query`]; [`UNREPLICATED`] when too few replicas
    /// acknowledged a grant, which then exists on this server: the caller
    /// gives it back (a renewal simply failed).
    pub async fn eval<K: AsRef<str>, A: AsRef<str>>(
        &self,
        lua: Lua,
        keys: &[K],
        args: &[A],
    ) -> Result<Value> {
        let sent = Instant::now();
        let work = async {
            if self.min_replicas == 0 || !lua.may_grant() {
                let mut conn = self.connection().await?;
                return self.invoke(lua, keys, args, &mut conn).await;
            }
            // A write that must be acknowledged: on a connection of its own,
            // since WAIT blocks the connection it is sent on.
            let mut lent = self.exclusive.lend(|| self.open_exclusive()).await?;
            let answer = self.invoke(lua, keys, args, &mut lent.conn).await?;
            let acked = if lua.grants(&answer) {
                self.replicated(&mut lent.conn, keys[0].as_ref(), sent)
                    .await
            } else {
                Ok(())
            };
            if acked.as_ref().map_or_else(is_unreplicated, |()| true) {
                lent.keep();
            }
            acked.map(|()| answer)
        };
        self.settle(
            timeout(crate::budget::limit(self.timeout), work).await,
            "request",
        )
        .await
    }

    /// Run script `lua` on `conn`.
    async fn invoke<K: AsRef<str>, A: AsRef<str>>(
        &self,
        lua: Lua,
        keys: &[K],
        args: &[A],
        conn: &mut Conn,
    ) -> Result<Value> {
        conn.eval(lua, keys, args)
            .await
            .map_err(|e| self.classify(e))
    }

    /// `WAIT` for `--redis-min-replicas` replicas on `conn`, the connection
    /// that just wrote (`WAIT` counts the acknowledgements of the writes sent
    /// on its own connection), for at most half of what is left of the
    /// request's deadline (the other half is for giving a grant back).
    ///
    /// # Errors
    /// [`UNREPLICATED`] when fewer replicas acknowledged; any error of `WAIT`.
    async fn replicated(&self, conn: &mut Conn, key: &str, sent: Instant) -> Result<()> {
        // At least 1 ms: `WAIT n 0` would block for ever.
        let waited_ms = (self.timeout.saturating_sub(sent.elapsed()).as_millis() as u64 / 2).max(1);
        let acked = conn
            .wait(key, self.min_replicas, waited_ms)
            .await
            .map_err(|e| self.classify(e))?;
        if acked >= i64::from(self.min_replicas) {
            return Ok(());
        }
        Err(BackendError::Rejected {
            backend: BACKEND,
            code: UNREPLICATED,
            source: Box::new(Unreplicated {
                server: self.label.clone(),
                acked: acked.max(0) as u64,
                wanted: self.min_replicas,
                waited_ms: Some(waited_ms),
            }),
        })
    }

    async fn settle<T>(
        &self,
        r: std::result::Result<Result<T>, tokio::time::error::Elapsed>,
        call: &'static str,
    ) -> Result<T> {
        let r = r.unwrap_or_else(|_| Err(self.timed_out(call)));
        if let Err(e) = &r {
            self.forget(e).await;
        }
        r
    }

    /// A new pub/sub connection, within the per-server timeout.
    ///
    /// # Errors
    /// A classified [`BackendError`] when the server cannot be reached.
    pub async fn pubsub(&self) -> Result<PubSub> {
        let client = match &self.target {
            Target::Fixed(client) => client.clone(),
            Target::Cluster {
                seeds, last_seed, ..
            } => {
                let start = last_seed.load(Ordering::SeqCst);
                return match super::cluster::pubsub(seeds, start, self.timeout).await {
                    Ok((i, ps)) => {
                        last_seed.store(i, Ordering::SeqCst);
                        Ok(ps)
                    }
                    Err(Some(e)) => Err(self.classify(e)),
                    Err(None) => Err(self.timed_out("subscribe")),
                };
            }
            Target::Sentinel { current, .. } => {
                let known = current.lock().expect("current lock").clone();
                match known {
                    Some((_, client)) => client,
                    None => {
                        self.connection().await?;
                        let known = current.lock().expect("current lock").clone();
                        known.expect("a connection found the primary").1
                    }
                }
            }
        };
        match timeout(self.timeout, client.get_async_pubsub()).await {
            Ok(r) => r.map_err(|e| self.classify(e)),
            Err(_) => Err(self.timed_out("subscribe")),
        }
    }
}

/// The integer in a script answer (an integer reply, or a bulk string of digits).
pub fn uint_of(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A bulk string answer as text.
pub fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}
