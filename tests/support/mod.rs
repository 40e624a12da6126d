//! Test support: real `etcd` servers and real `leader-elector` processes on
//! free loopback ports, each in its own temporary directory, killed on `Drop`.
//! A missing binary fails the test loudly with the package to install; it
//! never skips.

#![allow(dead_code)]

pub mod kube_api;
pub mod proxy;
pub mod recorder;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep, timeout};

/// The path of `bin` on `PATH`; panics naming the Debian package when missing.
pub fn require(bin: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(bin);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{bin}` is not installed: this test needs a real {bin}. Install the Debian package `{package}` (sudo apt-get install -y {package}), or run scripts/test, which installs it."
    );
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral loopback port")
        .local_addr()
        .unwrap()
        .port()
}

/// Poll `cond` every 5 ms until it holds; panic with `what` after `limit`.
pub async fn wait_for<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if cond().await {
            return;
        }
        if Instant::now() > end {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        sleep(Duration::from_millis(5)).await;
    }
}

/// Certificates for a TLS etcd: a CA, a server certificate for 127.0.0.1 and
/// localhost, a client certificate, and a second, unrelated CA.
pub struct Certs {
    pub dir: TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub other_ca: PathBuf,
}

impl Certs {
    pub fn generate() -> Certs {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
            KeyPair,
        };
        let dir = TempDir::new().unwrap();
        let write = |name: &str, text: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let make_ca = || {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
        };
        let ca = make_ca();
        let other = make_ca();
        let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(sans).unwrap();
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(
            vec!["leader-elector".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Certs {
            ca: write("ca.pem", ca.pem()),
            other_ca: write("other-ca.pem", other.pem()),
            server_cert: write("server.pem", server_cert),
            server_key: write("server-key.pem", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client-key.pem", client_key),
            dir,
        }
    }
}

/// One etcd member on loopback, in a temporary data directory.
pub struct Etcd {
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
    /// The client URL.
    pub url: String,
}

impl Etcd {
    /// Start a plain (http) etcd and wait until it answers.
    pub async fn start() -> Etcd {
        Self::launch(None, free_port()).await
    }

    /// Start a plain etcd whose client URL is `http://127.0.0.1:<client_port>`.
    pub async fn start_on(client_port: u16) -> Etcd {
        Self::launch(None, client_port).await
    }

    /// Start an etcd that serves TLS with `certs` and requires client certificates.
    pub async fn start_tls(certs: &Certs) -> Etcd {
        Self::launch(
            Some((
                certs.ca.clone(),
                certs.server_cert.clone(),
                certs.server_key.clone(),
            )),
            free_port(),
        )
        .await
    }

    async fn launch(tls: Option<(PathBuf, PathBuf, PathBuf)>, client_port: u16) -> Etcd {
        require("etcd", "etcd-server");
        let dir = TempDir::new().unwrap();
        let peer_port = free_port();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut etcd = Etcd {
            dir,
            client_port,
            peer_port,
            child: None,
            url: format!("{scheme}://127.0.0.1:{client_port}"),
            tls,
        };
        etcd.spawn();
        etcd.wait_ready().await;
        etcd
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "n", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.url])
            .args(["--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("n={peer}")])
            .stdout(Stdio::null())
            .stderr(log);
        if let Some((ca, cert, key)) = &self.tls {
            cmd.arg("--trusted-ca-file")
                .arg(ca)
                .arg("--cert-file")
                .arg(cert)
                .arg("--key-file")
                .arg(key)
                .arg("--client-cert-auth");
        }
        self.child = Some(cmd.spawn().expect("start etcd"));
    }

    async fn wait_ready(&self) {
        let port = self.client_port;
        wait_for(
            Duration::from_secs(15),
            "etcd to accept connections",
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await;
        if self.tls.is_none() {
            let url = self.url.clone();
            wait_for(Duration::from_secs(15), "etcd to answer status", || {
                let url = url.clone();
                async move {
                    match etcd_client::Client::connect([url], None).await {
                        Ok(mut c) => c.status().await.is_ok(),
                        Err(_) => false,
                    }
                }
            })
            .await;
        } else {
            // Leader election of a single member takes a moment after the port opens.
            sleep(Duration::from_millis(1500)).await;
        }
    }

    /// An etcd-client connected to this (plain) server.
    pub async fn client(&self) -> etcd_client::Client {
        timeout(
            Duration::from_secs(5),
            etcd_client::Client::connect([self.url.clone()], None),
        )
        .await
        .expect("connecting the test's etcd client hung")
        .expect("connect the test's etcd client")
    }

    /// Kill the server (SIGKILL), keeping its data directory.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start the server again on the same ports and data.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn();
        self.wait_ready().await;
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// GET `path` on a loopback port; returns the status code and body.
pub async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad HTTP answer: {text:?}")))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    };
    timeout(Duration::from_secs(3), fut)
        .await
        .map_err(|_| std::io::Error::other("HTTP request timed out"))?
}

/// One `leader-elector` process with its HTTP API on a free loopback port.
pub struct Sidecar {
    pub identity: String,
    pub port: u16,
    child: Child,
    log: PathBuf,
    _dir: TempDir,
}

/// The flags every test sidecar gets: a short TTL so tests are quick.
pub const FAST: &[&str] = &[
    "--lease-duration",
    "2s",
    "--renew-interval",
    "500ms",
    "--retry-period",
    "500ms",
];

impl Sidecar {
    /// Start a sidecar for `election` on `etcd_url` with `extra` flags.
    pub fn start(etcd_url: &str, election: &str, identity: &str, extra: &[&str]) -> Sidecar {
        let mut args = vec!["--etcd-endpoints".to_owned(), etcd_url.to_owned()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::start_raw(election, identity, &args)
    }

    /// Start a sidecar for `election` with exactly `args` after the defaults.
    pub fn start_raw(election: &str, identity: &str, args: &[String]) -> Sidecar {
        Self::spawn_with(None, election, identity, args)
    }

    /// Start `leader-elector run` for `election`; `args` end with `-- COMMAND…`.
    pub fn start_run(election: &str, identity: &str, args: &[String]) -> Sidecar {
        Self::spawn_with(Some("run"), election, identity, args)
    }

    fn spawn_with(sub: Option<&str>, election: &str, identity: &str, args: &[String]) -> Sidecar {
        Self::spawn_env(sub, election, identity, args, &[])
    }

    /// Start a sidecar with extra environment variables (KUBECONFIG, POD_NAME…).
    pub fn start_env(
        election: &str,
        identity: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Sidecar {
        Self::spawn_env(None, election, identity, args, env)
    }

    fn spawn_env(
        sub: Option<&str>,
        election: &str,
        identity: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Sidecar {
        let dir = TempDir::new().unwrap();
        let port = free_port();
        let log = dir.path().join("sidecar.log");
        let (flags, command) = match args.iter().position(|a| a == "--") {
            Some(i) => (&args[..i], &args[i..]),
            None => (args, &[][..]),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
            .args(sub)
            .args(["--election", election, "--identity", identity])
            .args(["--http-addr", &format!("127.0.0.1:{port}")])
            .args(["--log-level", "leader_elector=debug"])
            // Many sidecars share this machine: no control API unless a test asks.
            .arg("--control-addr=")
            .args(flags)
            .args(command)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start leader-elector");
        Sidecar {
            identity: identity.to_owned(),
            port,
            child,
            log,
            _dir: dir,
        }
    }

    /// `GET /leader`: status and parsed body (`None` when it does not answer).
    pub async fn leader(&self) -> Option<(u16, serde_json::Value)> {
        let (status, body) = http_get(self.port, "/leader").await.ok()?;
        Some((status, serde_json::from_str(&body).ok()?))
    }

    /// Whether `/leader` answers 200 right now.
    pub async fn is_leader(&self) -> bool {
        matches!(self.leader().await, Some((200, _)))
    }

    /// Send `sig` to the process.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).expect("signal the sidecar");
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Wait up to `limit` for the process to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            sleep(Duration::from_millis(5)).await;
        }
        None
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.identity, self.log());
        }
    }
}

/// Indexes of the sidecars whose `/leader` answers 200 right now.
pub async fn leaders(sidecars: &[Sidecar]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, s) in sidecars.iter().enumerate() {
        if s.is_leader().await {
            out.push(i);
        }
    }
    out
}

/// Wait until exactly one sidecar leads and every live one names it; return its index.
pub async fn one_leader(sidecars: &[Sidecar], limit: Duration) -> usize {
    let end = Instant::now() + limit;
    loop {
        let l = leaders(sidecars).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        if l.len() == 1 {
            let name = &sidecars[l[0]].identity;
            let mut agree = true;
            for s in sidecars {
                if let Some((_, body)) = s.leader().await
                    && body["leader"] != serde_json::json!(name)
                {
                    agree = false;
                }
            }
            if agree {
                return l[0];
            }
        }
        if Instant::now() > end {
            panic!("no single agreed leader within {limit:?} (leaders now: {l:?})");
        }
        sleep(Duration::from_millis(5)).await;
    }
}

/// A unique election name per test.
pub fn election(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// The fencing token a sidecar reports.
pub async fn token_of(s: &Sidecar) -> u64 {
    s.leader().await.expect("sidecar answers").1["fencing_token"]
        .as_u64()
        .expect("a fencing token")
}

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

    /// Start a server with extra `redis-server` arguments.
    pub async fn start_with(extra: &[&str]) -> RedisServer {
        require("redis-server", "redis-server");
        let port = free_port();
        let mut s = RedisServer {
            dir: TempDir::new().unwrap(),
            port,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            url: format!("redis://127.0.0.1:{port}"),
        };
        s.spawn();
        s.wait_ready().await;
        s
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

    async fn wait_ready(&self) {
        let url = self.url.clone();
        wait_for(
            Duration::from_secs(10),
            "redis-server to answer PING",
            || {
                let url = url.clone();
                async move {
                    let Ok(client) = redis::Client::open(url) else {
                        return false;
                    };
                    match client.get_multiplexed_async_connection().await {
                        Ok(mut c) => redis::cmd("PING")
                            .query_async::<String>(&mut c)
                            .await
                            .is_ok(),
                        Err(_) => false,
                    }
                }
            },
        )
        .await;
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
        self.wait_ready().await;
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

/// Start a sidecar on the Redis servers `urls` (extra flags after the defaults).
pub fn redis_sidecar(urls: &[&str], election: &str, identity: &str, extra: &[&str]) -> Sidecar {
    let mut args: Vec<String> = Vec::new();
    for u in urls {
        args.push("--redis-url".into());
        args.push((*u).to_owned());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Sidecar::start_raw(election, identity, &args)
}

/// A multi-member etcd cluster on loopback (FACTS.md gives the flags), each
/// member in its own temporary data directory. Members are stopped with
/// SIGKILL (a graceful stop of a cluster member takes seconds) and restarted
/// on the same ports and data, so they rejoin.
///
/// `free_port` hands out a port that was free a moment ago; tests running at
/// the same time (in this process or another) can take it before etcd binds
/// it, and a readiness probe would then be answered by *their* etcd. So the
/// cluster checks that it talks to its own members (each member process
/// alive, the member ids it recorded at start), starts again on fresh ports
/// when a member lost that race at start, and fails loudly when a port was
/// taken while a member was down.
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    ids: Vec<u64>,
}

struct EtcdMember {
    name: String,
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
    initial_cluster: String,
    child: Option<Child>,
    url: String,
}

impl EtcdMember {
    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", &self.name, "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.url])
            .args(["--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args([
                "--initial-cluster-token",
                &format!("fault-{}", std::process::id()),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start an etcd cluster member");
        self.child = Some(child);
    }

    /// Whether the member's process runs (it exits at once when its port is taken).
    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

async fn member_status(url: String) -> Option<(u64, u64)> {
    let fut = async move {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_millis(500));
        let mut c = etcd_client::Client::connect([url], Some(opts)).await.ok()?;
        let s = c.status().await.ok()?;
        Some((s.header()?.member_id(), s.leader()))
    };
    timeout(Duration::from_secs(2), fut).await.ok().flatten()
}

impl EtcdCluster {
    /// Start `n` members and wait until every one reports a Raft leader.
    pub async fn start(n: usize) -> EtcdCluster {
        require("etcd", "etcd-server");
        let mut last_error = String::new();
        for _attempt in 0..3 {
            match Self::try_start(n).await {
                Ok(c) => return c,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start a {n}-member etcd cluster in 3 attempts: {last_error}");
    }

    async fn try_start(n: usize) -> Result<EtcdCluster, String> {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<EtcdMember> = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| EtcdMember {
                name: format!("m{i}"),
                dir: TempDir::new().unwrap(),
                client_port: *client,
                peer_port: *peer,
                initial_cluster: initial_cluster.clone(),
                child: None,
                url: format!("http://127.0.0.1:{client}"),
            })
            .collect();
        for m in &mut members {
            m.spawn();
        }
        let mut c = EtcdCluster {
            members,
            ids: Vec::new(),
        };
        let end = Instant::now() + Duration::from_secs(20);
        for i in 0..n {
            loop {
                if !c.members[i].alive() {
                    return Err(format!(
                        "member m{i} exited at start (port taken?): {}",
                        c.members[i].log().lines().last().unwrap_or("")
                    ));
                }
                if let Some((id, leader)) = c.status(i).await
                    && leader != 0
                {
                    c.ids.push(id);
                    break;
                }
                if Instant::now() > end {
                    return Err(format!("member m{i} reported no Raft leader within 20 s"));
                }
                sleep(Duration::from_millis(20)).await;
            }
        }
        let mut distinct = c.ids.clone();
        distinct.sort();
        distinct.dedup();
        if distinct.len() != n || !(0..n).all(|i| c.members[i].alive()) {
            return Err(format!(
                "member ids {:?}: a port is served by another etcd",
                c.ids
            ));
        }
        Ok(c)
    }

    /// Client URLs, one per member.
    pub fn urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.url.clone()).collect()
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether member `i` runs.
    pub fn is_up(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// Member `i`'s own id and the Raft leader's id it reports (0: none), via `status()`.
    pub async fn status(&self, i: usize) -> Option<(u64, u64)> {
        member_status(self.members[i].url.clone()).await
    }

    /// The index of the member that is the Raft leader, as the running members report it.
    pub async fn raft_leader(&self) -> Option<usize> {
        let mut leader = 0;
        for i in 0..self.members.len() {
            if self.is_up(i)
                && let Some((_, l)) = self.status(i).await
                && l != 0
            {
                leader = l;
                break;
            }
        }
        self.ids.iter().position(|id| *id == leader)
    }

    /// Send `sig` to member `i` (SIGSTOP freezes it with its sockets open;
    /// SIGCONT resumes it).
    pub fn signal(&self, i: usize, sig: Signal) {
        if let Some(c) = &self.members[i].child {
            let _ = kill(Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// SIGKILL member `i`, keeping its data.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start member `i` again on its ports and data (it rejoins; wait with
    /// [`EtcdCluster::wait_healthy`], which needs a quorum of members up).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.members[i].spawn();
    }

    /// Wait until every running member is our own process and reports a Raft
    /// leader; panics naming the member otherwise.
    pub async fn wait_healthy(&mut self, limit: Duration) {
        let end = Instant::now() + limit;
        for i in 0..self.members.len() {
            if !self.is_up(i) {
                continue;
            }
            loop {
                assert!(
                    self.members[i].alive(),
                    "etcd member m{i} exited after a restart (was its port {} or {} taken by another process while it was down?): {}",
                    self.members[i].client_port,
                    self.members[i].peer_port,
                    self.members[i].log().lines().last().unwrap_or("")
                );
                if let Some((id, leader)) = self.status(i).await
                    && leader != 0
                {
                    assert_eq!(
                        id, self.ids[i],
                        "etcd member m{i}'s port is answered by another etcd"
                    );
                    break;
                }
                assert!(
                    Instant::now() < end,
                    "timed out after {limit:?} waiting for etcd member m{i} to report a Raft leader"
                );
                sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Member `i`'s log.
    pub fn log(&self, i: usize) -> String {
        self.members[i].log()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
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
