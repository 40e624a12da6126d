//! **Sentinel discovery**: where the primary of a Sentinel-watched Redis is.
//!
//! A [`Locator`] asks the Sentinels in turn for the primary's address
//! (`SENTINEL get-master-addr-by-name`), and the caller ([`super::server`])
//! connects there and confirms with `ROLE` that the server says it is the
//! master before any request is sent on the connection. It listens on a
//! Sentinel's pub/sub for `+switch-master` of its master, so a failover is
//! followed at the next request; a `READONLY` answer, a refused connection, a
//! timeout or a `ROLE` other than master forget the connection, and the next
//! request asks the Sentinels again.
//!
//! What this does not give: Sentinel is not consensus. A primary cut off from
//! the Sentinels may accept writes until it is told to become a replica, and
//! a promoted replica may miss the last writes. The election keeps its terms
//! apart across a promotion by the hold-off of the campaign script
//! ([`super::lua`]: a new replication id keeps everyone out for one lease
//! duration) and by fencing tokens, not by Sentinel.

use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::{FutureExt, StreamExt};
use redis::aio::PubSub;
use redis::{Client, ConnectionAddr, ConnectionInfo, Role};
use tokio::sync::Mutex;
use tokio::time::{Duration, timeout};
use tracing::{debug, info, warn};

use super::{BACKEND, RedisOptions, redact};
use crate::backend::{BackendError, Result};

/// How to reach a Sentinel group (`--redis-sentinel*`).
#[derive(Clone, Default)]
pub struct SentinelOptions {
    /// The Sentinels, as `redis://host:port`, `rediss://host:port` or
    /// `host:port` (then `redis://`).
    pub hosts: Vec<String>,
    /// The master's name in the Sentinels' configuration.
    pub master: String,
    /// Password for Sentinels whose address carries none
    /// (`--redis-sentinel-password-file`).
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelOptions")
            .field(
                "hosts",
                &self.hosts.iter().map(|h| redact(h)).collect::<Vec<_>>(),
            )
            .field("master", &self.master)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// What fixed `--redis-url`s that meet a read-only replica are told, once.
pub const READONLY_FIXED: &str = "this --redis-url leads to a read-only replica: after a Sentinel failover the primary moved, and no campaign or renewal can succeed here; let the sidecar follow the primary with --redis-sentinel HOST:PORT[,HOST:PORT...] --redis-sentinel-master NAME instead of --redis-url, or point --redis-url at the new primary";

/// A Sentinel address as a URL: `host:port` gets `redis://`.
pub fn sentinel_url(host: &str) -> String {
    if host.contains("://") {
        host.to_owned()
    } else {
        format!("redis://{host}")
    }
}

/// The Sentinels of one master, asked in turn.
pub struct Locator {
    sentinels: Vec<(String, Client)>,
    master: String,
    /// Password of the data servers (`--redis-password-file`).
    password: Option<String>,
    /// The private CA of `rediss://`, for the data servers too.
    ca_pem: Option<Vec<u8>>,
    /// TLS towards the data servers: the Sentinels' scheme.
    tls: bool,
    timeout: Duration,
    /// The `+switch-master` subscription (`None` until made, and after it broke).
    switch: Mutex<Option<PubSub>>,
    /// Whether a failover was announced since the last discovery.
    switched: AtomicBool,
}

impl Locator {
    /// A locator over `options`' Sentinels; `ca_pem` applies to `rediss://`.
    ///
    /// # Errors
    /// A message naming the (redacted) Sentinel address that cannot be used.
    pub fn new(
        options: &SentinelOptions,
        redis: &RedisOptions,
    ) -> std::result::Result<Locator, String> {
        let ca_pem = redis.ca_pem.as_deref();
        let mut sentinels = Vec::new();
        let mut tls = false;
        for host in &options.hosts {
            let url = sentinel_url(host);
            let label = redact(&url);
            let mut info: ConnectionInfo = url
                .parse()
                .map_err(|e| format!("Sentinel {label} is not an address: {e}"))?;
            if info.redis.password.is_none() {
                info.redis.password = options.password.clone();
            }
            tls |= matches!(info.addr, ConnectionAddr::TcpTls { .. });
            sentinels.push((label.clone(), open_client(info, ca_pem, &label)?));
        }
        if sentinels.is_empty() {
            return Err("no Sentinel given".into());
        }
        Ok(Locator {
            sentinels,
            master: options.master.clone(),
            password: redis.password.clone(),
            ca_pem: redis.ca_pem.clone(),
            tls,
            timeout: redis.per_server_timeout,
            switch: Mutex::new(None),
            switched: AtomicBool::new(false),
        })
    }

    /// The master's name.
    pub fn master(&self) -> &str {
        &self.master
    }

    /// `sentinel:<master>@<first Sentinel>`, for logs and errors.
    pub fn label(&self) -> String {
        format!("sentinel:{}@{}", self.master, self.sentinels[0].0)
    }

    /// The primary the Sentinels name now: its URL (without password) and
    /// a client for it, with the data servers' password and CA.
    ///
    /// # Errors
    /// As [`Locator::primary`]; `Server` for an address that is no URL.
    pub async fn discover(&self) -> Result<(String, Client)> {
        let (host, port) = self.primary().await?;
        let scheme = if self.tls { "rediss" } else { "redis" };
        let at = if host.contains(':') {
            format!("{scheme}://[{host}]:{port}")
        } else {
            format!("{scheme}://{host}:{port}")
        };
        let bad = |e: String| BackendError::Server {
            backend: BACKEND,
            source: e.into(),
        };
        let mut info: ConnectionInfo = at.parse().map_err(|e| bad(format!("{at}: {e}")))?;
        info.redis.password = self.password.clone();
        let client = open_client(info, self.ca_pem.as_deref(), &at).map_err(bad)?;
        Ok((at, client))
    }

    /// Ask the Sentinels in turn where the primary is; the first that knows
    /// answers. Clears the failover flag ([`Locator::switched`]).
    ///
    /// # Errors
    /// `Unreachable` naming the Sentinels when none answered with an address.
    pub async fn primary(&self) -> Result<(String, u16)> {
        self.switched.store(false, Ordering::SeqCst);
        self.follow().await;
        let mut why = Vec::new();
        for (label, client) in &self.sentinels {
            match timeout(self.timeout, self.ask(client)).await {
                Ok(Ok(Some(addr))) => return Ok(addr),
                Ok(Ok(None)) => why.push(format!("{label} knows no master {:?}", self.master)),
                Ok(Err(e)) => why.push(format!("{label}: {e}")),
                Err(_) => why.push(format!("{label}: no answer within {:?}", self.timeout)),
            }
        }
        Err(BackendError::Unreachable {
            backend: BACKEND,
            endpoints: self.label(),
            source: format!("no Sentinel named the primary: {}", why.join("; ")).into(),
        })
    }

    async fn ask(&self, client: &Client) -> redis::RedisResult<Option<(String, u16)>> {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await
    }

    /// Whether a Sentinel announced a failover of our master since the last
    /// [`Locator::primary`] (read without waiting).
    pub async fn switched(&self) -> bool {
        if self.switched.load(Ordering::SeqCst) {
            return true;
        }
        let mut guard = self.switch.lock().await;
        let Some(ps) = guard.as_mut() else {
            return false;
        };
        let mut broke = false;
        {
            let mut stream = ps.on_message();
            while let Some(next) = stream.next().now_or_never() {
                let Some(msg) = next else {
                    broke = true;
                    break;
                };
                // "<master> <old ip> <old port> <new ip> <new port>"
                let text = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
                if text.split(' ').next() == Some(self.master.as_str()) {
                    info!(master = %self.master, switch = %text, "Sentinel announced a failover (+switch-master): asking for the new primary");
                    self.switched.store(true, Ordering::SeqCst);
                }
            }
        }
        if broke {
            *guard = None;
        }
        self.switched.load(Ordering::SeqCst)
    }

    /// Subscribe to `+switch-master` on the first Sentinel that accepts, once.
    async fn follow(&self) {
        let mut guard = self.switch.lock().await;
        if guard.is_some() {
            return;
        }
        for (label, client) in &self.sentinels {
            let sub = async {
                let mut ps = client.get_async_pubsub().await?;
                ps.subscribe("+switch-master").await?;
                Ok::<_, redis::RedisError>(ps)
            };
            match timeout(self.timeout, sub).await {
                Ok(Ok(ps)) => {
                    *guard = Some(ps);
                    return;
                }
                Ok(Err(e)) => {
                    debug!(sentinel = %label, error = %e, "cannot subscribe to +switch-master")
                }
                Err(_) => debug!(sentinel = %label, "subscribing to +switch-master timed out"),
            }
        }
    }
}

/// A client for `info`, with the private CA for TLS where given.
pub fn open_client(
    info: ConnectionInfo,
    ca_pem: Option<&[u8]>,
    label: &str,
) -> std::result::Result<Client, String> {
    let tls = matches!(info.addr, ConnectionAddr::TcpTls { .. });
    match (ca_pem, tls) {
        (Some(ca), true) => Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.to_vec()),
            },
        ),
        _ => Client::open(info),
    }
    .map_err(|e| format!("{label}: {e}"))
}

/// Check with `ROLE` that the server on `conn` says it is the master.
///
/// # Errors
/// `Rejected` with code `readonly` when it is a replica (or a Sentinel);
/// what `ROLE` itself failed with otherwise (classified by `classify`).
pub async fn confirm_master(
    conn: &mut redis::aio::MultiplexedConnection,
    at: &str,
    classify: impl Fn(redis::RedisError) -> BackendError,
) -> Result<()> {
    let role: Role = redis::cmd("ROLE")
        .query_async(conn)
        .await
        .map_err(classify)?;
    if matches!(role, Role::Primary { .. }) {
        return Ok(());
    }
    warn!(server = %at, role = ?role, "the server the Sentinels named does not say it is the master (ROLE): asking the Sentinels again");
    Err(BackendError::Rejected {
        backend: BACKEND,
        code: "readonly",
        source: format!("{at} is not the master (ROLE answered {role:?})").into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_sentinel_address_gets_the_redis_scheme() {
        assert_eq!(sentinel_url("10.0.0.1:26379"), "redis://10.0.0.1:26379");
        assert_eq!(sentinel_url("rediss://s:26379"), "rediss://s:26379");
    }

    #[test]
    fn sentinel_passwords_never_show() {
        let o = SentinelOptions {
            hosts: vec!["redis://:pw@s:26379".into()],
            master: "m".into(),
            password: Some("secret".into()),
        };
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("pw@") && !shown.contains("secret"),
            "{shown}"
        );
    }
}
