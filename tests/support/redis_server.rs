//! redis-server processes on ports from [`server_port`] (below the kernel's
//! ephemeral range), started again on another port when one fails to bind;
//! a replica is one more such process started with `--replicaof`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::time::{Instant, sleep, timeout};

use super::ports::server_port;
use super::require;

/// One `redis-server` on loopback without persistence, in a temporary directory.
pub struct RedisServer {
    dir: TempDir,
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    /// `redis://127.0.0.1:<port>`.
    pub url: String,
}

impl RedisServer {
    /// Start a server and wait until it answers PING.
    pub async fn start() -> RedisServer {
        Self::start_with(&[]).await
    }

    /// Start a server with extra `redis-server` arguments; panics when five
    /// ports in a row fail.
    pub async fn start_with(extra: &[&str]) -> RedisServer {
        require("redis-server", "redis-server");
        let mut last = String::new();
        for _ in 0..5 {
            let port = server_port();
            let mut s = RedisServer {
                dir: TempDir::new().unwrap(),
                port,
                child: None,
                extra: extra.iter().map(|s| s.to_string()).collect(),
                url: format!("redis://127.0.0.1:{port}"),
            };
            s.spawn();
            match s.ready().await {
                Ok(()) => return s,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start in 5 attempts: {last}");
    }

    /// Start a replica of the server on `127.0.0.1:<primary_port>` (a
    /// primary's port, or a proxy's in front of it): `redis-server --port P
    /// --replicaof 127.0.0.1 <primary_port> --save "" --appendonly no`, on a
    /// port picked like every test server's, and wait until its link to the
    /// primary is up. A restart keeps it a replica.
    pub async fn start_replica_of(primary_port: u16) -> RedisServer {
        let primary = primary_port.to_string();
        let s = Self::start_with(&["--replicaof", "127.0.0.1", &primary]).await;
        s.wait_linked(Duration::from_secs(10)).await;
        s
    }

    /// `INFO replication` as text (empty when the server does not answer).
    pub async fn replication(&self) -> String {
        let fut = async {
            let mut c = self.conn().await;
            redis::cmd("INFO")
                .arg("replication")
                .query_async::<String>(&mut c)
                .await
                .ok()
        };
        timeout(Duration::from_secs(5), fut)
            .await
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Wait until this replica's link to its primary is up and the first
    /// sync is done (`master_link_status:up`); panics after `limit`.
    pub async fn wait_linked(&self, limit: Duration) {
        let end = Instant::now() + limit;
        loop {
            let info = self.replication().await;
            if info.contains("master_link_status:up") {
                return;
            }
            assert!(
                Instant::now() < end,
                "the replica on port {} did not link to its primary within {limit:?}: {info}",
                self.port
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Replicas connected to this server (`connected_slaves`).
    pub async fn connected_replicas(&self) -> u32 {
        let info = self.replication().await;
        info.lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Promote this replica to a primary (`REPLICAOF NO ONE`), as a failover does.
    pub async fn promote(&self) {
        let mut c = self.conn().await;
        let mut cmd = redis::cmd("REPLICAOF");
        cmd.arg("NO").arg("ONE");
        timeout(Duration::from_secs(5), cmd.query_async::<()>(&mut c))
            .await
            .expect("REPLICAOF NO ONE hung for 5 s")
            .expect("REPLICAOF NO ONE");
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("redis.log")).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
    }

    /// Wait until the server answers PING; `Err` with its last log line when
    /// the process exited first (a port taken) or 10 s passed.
    async fn ready(&mut self) -> Result<(), String> {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!(
                    "redis-server exited ({status}): {}",
                    self.last_log_line()
                ));
            }
            if self.pings().await {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(format!("no PONG within 10 s: {}", self.last_log_line()));
            }
            sleep(Duration::from_millis(5)).await;
        }
    }

    async fn pings(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url.clone()) else {
            return false;
        };
        let fut = async {
            let mut c = client.get_multiplexed_async_connection().await.ok()?;
            redis::cmd("PING").query_async::<String>(&mut c).await.ok()
        };
        matches!(timeout(Duration::from_secs(2), fut).await, Ok(Some(_)))
    }

    fn last_log_line(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log"))
            .unwrap_or_default()
            .lines()
            .last()
            .unwrap_or("")
            .to_owned()
    }

    /// A connection for the test itself (as the default user).
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.clone())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test's redis")
    }

    /// Kill the server (SIGKILL). Without persistence it forgets everything.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start the server again on the same port.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn();
        if let Err(e) = self.ready().await {
            panic!("redis-server did not come back on port {}: {e}", self.port);
        }
    }

    /// The process id while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Pause (SIGSTOP) or resume (SIGCONT) the server.
    pub fn signal(&self, sig: Signal) {
        if let Some(c) = &self.child {
            kill(Pid::from_raw(c.id() as i32), sig).expect("signal redis-server");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        self.stop();
    }
}

/// The parent pid of process `pid` (from /proc), to check that a server
/// answering on a port is one this test process started.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid …; comm may hold spaces, so split after ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Check that the redis-server answering at `server.url` was started by this
/// process (a port taken by another test's server would otherwise go
/// unnoticed); `false` when it is someone else's.
pub async fn redis_is_ours(server: &RedisServer) -> bool {
    let fut = async {
        let mut c = server.conn().await;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .ok()?;
        let pid: u32 = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))?
            .trim()
            .parse()
            .ok()?;
        Some(parent_of(pid) == Some(std::process::id()))
    };
    timeout(Duration::from_secs(5), fut)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Redis's `INFO commandstats` over `conn`: calls so far per command (lower
/// case; commands run inside scripts count too). The INFO call itself is
/// counted after the reading.
pub async fn redis_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, f64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .map(|(name, stats)| {
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            (name.to_owned(), calls)
        })
        .collect()
}

/// Make `replicas` miss every later write of `primary` while they stay
/// promotable: a wrong `masterauth` keeps them from linking again (the
/// primary has no password, so their `AUTH` fails the handshake), then the
/// primary drops their links (`CLIENT KILL TYPE replica`). A write after
/// this is on the primary only; kill it and a promoted replica lacks it.
pub async fn cut_off_replicas(primary: &RedisServer, replicas: &[&RedisServer]) {
    for r in replicas {
        let mut c = r.conn().await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("masterauth")
            .arg("not-the-password")
            .query_async(&mut c)
            .await
            .expect("CONFIG SET masterauth on a replica");
    }
    let mut c = primary.conn().await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut c)
        .await
        .expect("CLIENT KILL TYPE replica");
}
