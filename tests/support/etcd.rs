//! etcd servers: one member, or a cluster. Their ports come from
//! [`server_port`] (below the kernel's ephemeral range); a member that fails to
//! bind is started again on other ports.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::time::{Instant, sleep, timeout};

use super::ports::server_port;
use super::require;

/// How often a server that failed to bind its ports is started again on others.
const START_ATTEMPTS: usize = 5;

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
        Self::launch(None, None).await
    }

    /// Start a plain etcd whose client URL is `http://127.0.0.1:<client_port>`.
    pub async fn start_on(client_port: u16) -> Etcd {
        Self::launch(None, Some(client_port)).await
    }

    /// Start an etcd that serves TLS with `certs` and requires client certificates.
    pub async fn start_tls(certs: &super::Certs) -> Etcd {
        let tls = (
            certs.ca.clone(),
            certs.server_cert.clone(),
            certs.server_key.clone(),
        );
        Self::launch(Some(tls), None).await
    }

    /// Start on `client_port` (else an allocated one), retrying on other
    /// ports while etcd exits at start (a port taken).
    async fn launch(tls: Option<(PathBuf, PathBuf, PathBuf)>, client_port: Option<u16>) -> Etcd {
        require("etcd", "etcd-server");
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let client_port = client_port.unwrap_or_else(server_port);
            let scheme = if tls.is_some() { "https" } else { "http" };
            let mut etcd = Etcd {
                dir: TempDir::new().unwrap(),
                client_port,
                peer_port: server_port(),
                child: None,
                url: format!("{scheme}://127.0.0.1:{client_port}"),
                tls: tls.clone(),
            };
            etcd.spawn();
            match etcd.ready().await {
                Ok(()) => return etcd,
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start in {START_ATTEMPTS} attempts: {last}");
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

    /// Wait until the server answers; `Err` (with its last log line) when the
    /// process exited first or 15 s passed.
    async fn ready(&mut self) -> Result<(), String> {
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!("etcd exited ({status}): {}", self.last_log_line()));
            }
            if self.answers().await {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(format!("no answer within 15 s: {}", self.last_log_line()));
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the server answers `status` (plain), or accepts connections (TLS).
    async fn answers(&self) -> bool {
        if self.tls.is_some() {
            if !super::port_open(self.client_port).await {
                return false;
            }
            // Leader election of a single member takes a moment after the port opens.
            sleep(Duration::from_millis(1500)).await;
            return true;
        }
        member_status(self.url.clone()).await.is_some()
    }

    fn last_log_line(&self) -> String {
        self.log().lines().last().unwrap_or("").to_owned()
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

    /// Start the server again on the same ports and data; panics when it
    /// does not answer within 15 s.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn();
        if let Err(e) = self.ready().await {
            panic!("etcd did not come back on port {}: {e}", self.client_port);
        }
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// The client port (its `/metrics` is served there too).
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The process id while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A multi-member etcd cluster on loopback (FACTS.md gives the flags), each
/// member in its own temporary data directory. Members are stopped with
/// SIGKILL (a graceful stop of a cluster member takes seconds) and restarted
/// on the same ports and data, so they rejoin.
///
/// Ports come from [`server_port`]; as a second line of defence the cluster
/// checks that it talks to its own members (each member process alive, the
/// member ids it recorded at start), starts again on fresh ports when a member
/// failed to bind at start, and fails loudly when a port was taken while a
/// member was down.
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
        for _attempt in 0..START_ATTEMPTS {
            match Self::try_start(n).await {
                Ok(c) => return c,
                Err(e) => last_error = e,
            }
        }
        panic!(
            "could not start a {n}-member etcd cluster in {START_ATTEMPTS} attempts: {last_error}"
        );
    }

    async fn try_start(n: usize) -> Result<EtcdCluster, String> {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (server_port(), server_port())).collect();
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

    /// The process ids of the members that run.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(Child::id))
            .collect()
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

/// etcd's `grpc_server_msg_received_total` of the member serving metrics on
/// `port` (its client port), summed per gRPC method: the requests it has
/// received so far (every message, stream messages included).
pub async fn etcd_messages(port: u16) -> std::collections::BTreeMap<String, f64> {
    let (_, text) = super::http_get(port, "/metrics")
        .await
        .expect("etcd metrics");
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{grpc_method=\"") {
            let method = rest.split('"').next().unwrap_or_default().to_owned();
            let v: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            *out.entry(method).or_insert(0.0) += v;
        }
    }
    out
}
