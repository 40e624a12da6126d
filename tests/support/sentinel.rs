//! A Redis Sentinel group on loopback: a primary, two replicas and three
//! Sentinels (`redis-server sentinel.conf --sentinel`), each on a port from
//! [`server_port`], in its own temporary directory, killed on `Drop`.
//! Sentinels judge a server down after [`DOWN_AFTER_MS`].

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;
use tokio::time::{Instant, sleep, timeout};

use super::ports::server_port;
use super::redis_server::RedisServer;
use super::require;

/// The master's name in every Sentinel's configuration.
pub const MASTER: &str = "mymaster";

/// `down-after-milliseconds` of the test group.
pub const DOWN_AFTER_MS: u64 = 1000;

/// How long a Sentinel in TILT mode does nothing, plus a second (Redis's
/// `SENTINEL_TILT_PERIOD`, 30 s).
const SENTINEL_TILT_PERIOD: Duration = Duration::from_secs(31);

/// One Sentinel process.
pub struct Sentinel {
    _dir: TempDir,
    /// Its port.
    pub port: u16,
    child: Child,
}

impl Sentinel {
    /// `127.0.0.1:<port>`, as `--redis-sentinel` takes it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A connection for the test itself; `None` when the Sentinel does not
    /// answer within 5 s.
    pub async fn conn(&self) -> Option<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://{}", self.addr())).ok()?;
        timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()
    }

    /// The primary's port as this Sentinel names it.
    pub async fn primary_port(&self) -> Option<u16> {
        let mut c = self.conn().await?;
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(MASTER);
        let addr: Option<(String, u16)> = timeout(Duration::from_secs(5), cmd.query_async(&mut c))
            .await
            .ok()?
            .ok()?;
        addr.map(|(_, p)| p)
    }

    /// The last `lines` lines of this Sentinel's log (its view of a failover
    /// that did not come: votes, `+sdown`, `+odown`, `-failover-abort-*`).
    pub fn log_tail(&self, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self._dir.path().join("sentinel.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// How many replicas and other Sentinels this Sentinel knows.
    async fn known(&self) -> (usize, usize) {
        let Some(c) = self.conn().await else {
            return (0, 0);
        };
        let count = |what: &'static str| {
            let mut c = c.clone();
            async move {
                let mut cmd = redis::cmd("SENTINEL");
                cmd.arg(what).arg(MASTER);
                let v: Vec<redis::Value> = cmd.query_async(&mut c).await.unwrap_or_default();
                v.len()
            }
        };
        (count("replicas").await, count("sentinels").await)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A primary, two replicas and three Sentinels that know each other.
pub struct SentinelGroup {
    /// Index 0 started as the primary, 1 and 2 as its replicas.
    pub servers: Vec<RedisServer>,
    /// The three Sentinels.
    pub sentinels: Vec<Sentinel>,
    /// One group at a time in a test run: each measures failover timings
    /// of six servers, which side-by-side groups on two cores stretch past
    /// the liveness bounds (seen in CI). Dropped last.
    _turn: tokio::sync::OwnedSemaphorePermit,
}

/// The turn of one Sentinel group or Redis Cluster at a time (see
/// `SentinelGroup::_turn`; `support::cluster` takes it too).
pub static TURN: std::sync::LazyLock<std::sync::Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(tokio::sync::Semaphore::new(1)));

impl SentinelGroup {
    /// Start the group and wait until every Sentinel knows both replicas
    /// and the two other Sentinels (so a failover can be agreed on).
    pub async fn start() -> SentinelGroup {
        let turn = TURN
            .clone()
            .acquire_owned()
            .await
            .expect("the turn semaphore is never closed");
        let primary = RedisServer::start().await;
        let mut servers = vec![primary];
        for _ in 0..2 {
            servers.push(RedisServer::start_replica_of(servers[0].port).await);
        }
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(start_sentinel(servers[0].port).await);
        }
        let group = SentinelGroup {
            servers,
            sentinels,
            _turn: turn,
        };
        let end = Instant::now() + Duration::from_secs(20);
        for s in &group.sentinels {
            loop {
                let (replicas, others) = s.known().await;
                if replicas == 2 && others == 2 {
                    break;
                }
                assert!(
                    Instant::now() < end,
                    "Sentinel {} knows {replicas} replicas and {others} Sentinels after 20 s",
                    s.port
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
        group
    }

    /// `--redis-sentinel` and `--redis-sentinel-master` for a sidecar.
    pub fn flags(&self) -> Vec<String> {
        let hosts: Vec<String> = self.sentinels.iter().map(Sentinel::addr).collect();
        vec![
            "--redis-sentinel".into(),
            hosts.join(","),
            "--redis-sentinel-master".into(),
            MASTER.into(),
        ]
    }

    /// The index in [`SentinelGroup::servers`] of the primary the first
    /// answering Sentinel names.
    pub async fn primary(&self) -> usize {
        for s in &self.sentinels {
            if let Some(port) = s.primary_port().await
                && let Some(i) = self.servers.iter().position(|r| r.port == port)
            {
                return i;
            }
        }
        panic!("no Sentinel names a primary of this group");
    }

    /// Wait (up to `limit`) until server `i` reports a connected replica
    /// (`INFO replication`: `connected_slaves` ≥ 1). With `--redis-min-replicas 1` nobody can lead before that, so a
    /// liveness bound after a failover counts from here.
    pub async fn wait_replica_of(&self, i: usize, limit: Duration) {
        let start = Instant::now();
        let url = format!("redis://127.0.0.1:{}", self.servers[i].port);
        while start.elapsed() < limit {
            if let Ok(client) = redis::Client::open(url.as_str())
                && let Ok(mut c) = client.get_multiplexed_async_connection().await
            {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await
                    .unwrap_or_default();
                let connected = info
                    .lines()
                    .find_map(|l| l.strip_prefix("connected_slaves:"))
                    .and_then(|n| n.trim().parse::<u32>().ok())
                    .unwrap_or(0);
                if connected >= 1 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("server {i} has no connected replica after {limit:?}");
    }

    /// Wait until every live Sentinel names a primary other than server
    /// `old` and that server says it is the master; returns its index and
    /// how long it took. Up to `limit`, longer by a Sentinel's TILT period
    /// when one logged `+tilt`; a failover that never comes panics with
    /// the tail of every Sentinel's log.
    pub async fn wait_failover(&self, old: usize, limit: Duration) -> (usize, Duration) {
        let start = Instant::now();
        let mut told_tilt = false;
        loop {
            let mut named = Vec::new();
            for s in &self.sentinels {
                named.push(s.primary_port().await);
            }
            if let Some(Some(port)) = named.first()
                && named.iter().all(|p| *p == Some(*port))
                && let Some(i) = self.servers.iter().position(|r| r.port == *port)
                && i != old
                && self.servers[i].replication().await.contains("role:master")
            {
                return (i, start.elapsed());
            }
            if start.elapsed() >= limit {
                // A Sentinel that was not scheduled for 2 s enters TILT mode
                // and acts on nothing for 30 s (Redis's sentinel.c,
                // SENTINEL_TILT_TRIGGER and SENTINEL_TILT_PERIOD): on a
                // loaded machine the failover is the backend's, late. Wait
                // that out once, anchored on the Sentinel's own `+tilt`.
                let tilted = self
                    .sentinels
                    .iter()
                    .any(|s| s.log_tail(400).contains("+tilt"));
                if tilted && start.elapsed() < limit + SENTINEL_TILT_PERIOD {
                    if !told_tilt {
                        println!("a Sentinel entered TILT mode: waiting out its 30 s");
                        told_tilt = true;
                    }
                    sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let logs: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("--- Sentinel {}:\n{}", s.port, s.log_tail(40)))
                    .collect();
                panic!(
                    "no failover away from server {old} within {limit:?}: the Sentinels name {named:?}\n{}",
                    logs.join("\n")
                );
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// When server `i` (a promoted primary) started its promotion
    /// hold-off, as it records it: the `<since ms>` of the promotion marker
    /// at `key` (`<replid>|<since ms>[|…]`, written by the first campaign
    /// or grant on it under its own replication id), by the server's wall
    /// clock (this machine's). Waits up to `limit` for that first write.
    /// The event a bound after a promotion counts from: what came before it
    /// (the Sentinels' failover, their view reaching each client) is the
    /// backend's time.
    pub async fn hold_off_start(
        &self,
        i: usize,
        key: &str,
        limit: Duration,
    ) -> std::time::SystemTime {
        let start = Instant::now();
        loop {
            let repl = self.servers[i].replication().await;
            let id = repl
                .lines()
                .find_map(|l| l.strip_prefix("master_replid:"))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default();
            let mark: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut self.servers[i].conn().await)
                .await
                .unwrap_or(None);
            let mut parts = mark.as_deref().unwrap_or_default().split('|');
            if let (Some(mid), Some(since)) = (parts.next(), parts.next())
                && !id.is_empty()
                && mid == id
                && let Ok(ms) = since.parse::<u64>()
            {
                return std::time::UNIX_EPOCH + Duration::from_millis(ms);
            }
            assert!(
                start.elapsed() < limit,
                "no promotion marker {key} of server {i}'s replication id within {limit:?}: {mark:?}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// How long after the coordination hold-off of server `i` (a promoted
    /// primary) ended a grant of `ttl` came `at`: the hold-off ends at its
    /// start ([`SentinelGroup::hold_off_start`] of the marker
    /// `leader-elector:coord-promoted`) + `ttl` + 1 s.
    pub async fn after_hold_off(
        &self,
        i: usize,
        ttl: Duration,
        at: std::time::SystemTime,
    ) -> Duration {
        let key = "leader-elector:coord-promoted";
        let since = self.hold_off_start(i, key, Duration::from_secs(20)).await;
        at.duration_since(since + ttl + Duration::from_secs(1))
            .unwrap_or_default()
    }

    /// `SENTINEL FAILOVER <master>` on the first Sentinel.
    pub async fn failover(&self) {
        let mut c = self.sentinels[0].conn().await.expect("a Sentinel answers");
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("FAILOVER").arg(MASTER);
        timeout(Duration::from_secs(5), cmd.query_async::<()>(&mut c))
            .await
            .expect("SENTINEL FAILOVER hung")
            .expect("SENTINEL FAILOVER");
    }

    /// Pause (SIGSTOP) or resume (SIGCONT) server `i`.
    pub fn signal(&self, i: usize, sig: Signal) {
        self.servers[i].signal(sig);
    }
}

/// Start one Sentinel monitoring the primary on `primary_port`; a port that
/// fails to bind is replaced (five tries).
async fn start_sentinel(primary_port: u16) -> Sentinel {
    require("redis-server", "redis-server");
    for _ in 0..5 {
        let dir = TempDir::new().unwrap();
        let port = server_port();
        let conf = dir.path().join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER} 4000\n\
             sentinel parallel-syncs {MASTER} 2\n",
            dir = dir.path().display()
        );
        std::fs::write(&conf, text).unwrap();
        let log = std::fs::File::create(dir.path().join("sentinel.log")).unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let mut s = Sentinel {
            _dir: dir,
            port,
            child,
        };
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = s.child.try_wait() {
                break;
            }
            if s.primary_port().await.is_some() {
                return s;
            }
            if Instant::now() > end {
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        let _ = s.child.kill();
    }
    panic!("redis-server --sentinel did not start in 5 attempts");
}
