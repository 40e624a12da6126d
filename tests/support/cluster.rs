//! A Redis Cluster on loopback: three primaries and three replicas
//! (`redis-cli --cluster create … --cluster-replicas 1 --cluster-yes`), each
//! a [`RedisServer`] with `--cluster-enabled yes` on a port from
//! [`server_port`] and its cluster bus on another (`--cluster-port`: the
//! default bus port, port + 10000, could fall in the kernel's ephemeral
//! range). Nodes judge a peer down after [`NODE_TIMEOUT_MS`]. One Sentinel
//! group or cluster at a time in a test run (the Sentinel kit's turn).

use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::{Instant, sleep, timeout};

use super::ports::server_port;
use super::redis_server::RedisServer;
use super::require;
use super::sentinel::TURN;

/// `cluster-node-timeout` of the test cluster.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its node id.
    pub id: String,
    /// Its client port.
    pub port: u16,
    /// Whether it is a primary (else a replica).
    pub primary: bool,
    /// The id of its primary (replicas).
    pub primary_id: Option<String>,
    /// Whether it is flagged `fail` or `fail?`.
    pub failing: bool,
    /// Its slot ranges (primaries).
    pub slots: Vec<(u16, u16)>,
}

/// Six nodes of one cluster, every slot served.
pub struct RedisCluster {
    /// The nodes, in start order.
    pub nodes: Vec<RedisServer>,
    _turn: tokio::sync::OwnedSemaphorePermit,
}

impl RedisCluster {
    /// Start six nodes, make them one cluster with a replica each, and wait
    /// until every node says `cluster_state:ok` and knows the six.
    pub async fn start() -> RedisCluster {
        let turn = TURN.clone().acquire_owned().await.expect("never closed");
        require("redis-cli", "redis-tools");
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let bus = server_port().to_string();
            let timeout_ms = NODE_TIMEOUT_MS.to_string();
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus,
                "--cluster-node-timeout",
                &timeout_ms,
                "--cluster-config-file",
                "nodes.conf",
                // A replica's first sync at once (the default waits 5 s for
                // more replicas): one that never synced may not fail over.
                "--repl-diskless-sync-delay",
                "0",
            ];
            nodes.push(RedisServer::start_with(&args).await);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes, _turn: turn };
        let end = Instant::now() + Duration::from_secs(30);
        for n in &cluster.nodes {
            loop {
                let info = cluster_info(n).await;
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:6") {
                    break;
                }
                assert!(
                    Instant::now() < end,
                    "node {} not ok after 30 s: {info}",
                    n.port
                );
                sleep(Duration::from_millis(50)).await;
            }
            if n.replication().await.contains("role:slave") {
                n.wait_linked(Duration::from_secs(20)).await;
            }
        }
        cluster
    }

    /// The seed URLs (every node).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url.clone()).collect()
    }

    /// `--redis-cluster --redis-url <every node>` for a sidecar.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--redis-cluster".into(),
            "--redis-url".into(),
            self.urls().join(","),
        ]
    }

    /// `CLUSTER NODES` as node `asked` (an index) sees it; empty when it
    /// does not answer.
    pub async fn view(&self, asked: usize) -> Vec<Node> {
        let fut = async {
            let mut c = self.nodes[asked].conn().await;
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut c)
                .await
                .ok()
        };
        let text = timeout(Duration::from_secs(2), fut)
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        text.lines().filter_map(parse_node).collect()
    }

    /// The index of the node with client port `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// The index of the primary serving `slot` as node `asked` sees it.
    pub async fn primary_of(&self, slot: u16, asked: usize) -> Option<usize> {
        let view = self.view(asked).await;
        let n = view.iter().find(|n| {
            n.primary && !n.failing && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
        })?;
        Some(self.index_of(n.port))
    }

    /// A replica of node `primary` (an index), as `primary` sees it
    /// (gossip may take a moment after a replica linked: asked again for
    /// up to 10 s).
    pub async fn replica_of(&self, primary: usize) -> usize {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let view = self.view(primary).await;
            let me = view
                .iter()
                .find(|n| n.port == self.nodes[primary].port)
                .map(|n| n.id.clone());
            let r = view
                .iter()
                .find(|n| me.is_some() && n.primary_id == me && !n.primary);
            if let Some(r) = r {
                return self.index_of(r.port);
            }
            assert!(
                Instant::now() < end,
                "node {primary} names no replica of its own after 10 s: {view:?}"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// The slot of `key` (`CLUSTER KEYSLOT` on node 0).
    pub async fn slot(&self, key: &str) -> u16 {
        let mut c = self.nodes[0].conn().await;
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("CLUSTER KEYSLOT")
    }

    /// `CLUSTER FAILOVER` on replica `i`: its primary hands over, healthy.
    pub async fn failover(&self, i: usize) {
        let mut c = self.nodes[i].conn().await;
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER");
        timeout(Duration::from_secs(5), cmd.query_async::<()>(&mut c))
            .await
            .expect("CLUSTER FAILOVER hung")
            .expect("CLUSTER FAILOVER");
    }

    /// Wait until every node but `old` names one primary other than `old`
    /// for `slot` and that node says `role:master`; returns its index and
    /// how long it took.
    pub async fn wait_failover(&self, slot: u16, old: usize, limit: Duration) -> (usize, Duration) {
        let start = Instant::now();
        loop {
            let mut named = Vec::new();
            for i in (0..self.nodes.len()).filter(|i| *i != old) {
                named.push(self.primary_of(slot, i).await);
            }
            if let Some(Some(p)) = named.first()
                && *p != old
                && named.iter().all(|n| *n == Some(*p))
                && self.nodes[*p].replication().await.contains("role:master")
            {
                return (*p, start.elapsed());
            }
            assert!(
                start.elapsed() < limit,
                "no failover of slot {slot} away from node {old} within {limit:?}: {named:?}"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// Pause (SIGSTOP) or resume (SIGCONT) node `i`.
    pub fn signal(&self, i: usize, sig: Signal) {
        self.nodes[i].signal(sig);
    }
}

/// `CLUSTER INFO` of `node` (empty when it does not answer).
async fn cluster_info(node: &RedisServer) -> String {
    let fut = async {
        let mut c = node.conn().await;
        redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async::<String>(&mut c)
            .await
            .ok()
    };
    timeout(Duration::from_secs(2), fut)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// One line of `CLUSTER NODES`:
/// `<id> <ip:port@bus> <flags> <primary id|-> <ping> <pong> <epoch> <link> <slots…>`.
fn parse_node(line: &str) -> Option<Node> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let port = f
        .get(1)?
        .split('@')
        .next()?
        .rsplit(':')
        .next()?
        .parse()
        .ok()?;
    let flags = f.get(2)?;
    let slots = f
        .iter()
        .skip(8)
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|a| (a, a)),
        })
        .collect();
    Some(Node {
        id: f[0].to_owned(),
        port,
        primary: flags.contains("master"),
        primary_id: (f.get(3)? != &"-").then(|| f[3].to_owned()),
        failing: flags.contains("fail"),
        slots,
    })
}
