//! Real partitions (issue 48): every server and sidecar in its own network
//! namespace (`support::netns`), faults made by nftables rules between
//! them, the sidecars' `/leader` sampled from the host by the recorder, and
//! a fenced register written by every sidecar that says it leads
//! (`support::history`). Each scenario holds: no two sidecars lead at once,
//! fencing tokens grow, the register never takes a write of a term held
//! twice, and a leader is back within the bound after each heal.
//!
//! Two scenarios run in every `cargo test`; the whole set runs with
//! `LEADER_ELECTOR_PARTITIONS=all` (the others return at once without it).
//! The scenarios themselves are in `partition_scenarios`.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::{Instant, sleep};

use crate::support::history::{Register, Writers, leaderless_after};
use crate::support::http::http_request_at;
use crate::support::netns::{Net, NsProcess};
use crate::support::recorder::{Expect, Fault, Recorder};
use crate::support::*;

/// The sidecars' lease TTL (`FAST`).
pub const TTL: Duration = Duration::from_secs(2);
/// The book's bound for a leader after a fault that ends the leader's term:
/// the lease expires by TTL after the last renewal, etcd checks expiry every
/// 0.5 s, a follower retries within `--retry-period` (0.5 s); after a Raft
/// leader change etcd gives every lease its full TTL again (one more TTL).
pub const BOUND: Duration = Duration::from_millis(2 * 2000 + 1500);

/// Whether the whole set runs (`LEADER_ELECTOR_PARTITIONS=all`).
pub fn all() -> bool {
    std::env::var("LEADER_ELECTOR_PARTITIONS").is_ok_and(|v| v == "all")
}

/// Which backend a world runs (no servers inside: the world holds them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// One etcd member.
    Etcd,
    /// Three etcd members; sidecar `i` reaches member `i` only.
    Etcd3,
    /// One Redis server.
    Redis,
}

/// Servers, sidecars, recorder and register of one scenario.
pub struct World {
    pub rec: Recorder,
    pub reg: Arc<Register>,
    writers: Option<Writers>,
    _sidecars: Vec<Sidecar>,
    /// The sidecars' nodes (slot `i` on `side[i]`).
    pub side: Vec<usize>,
    _servers: Vec<NsProcess>,
    /// The servers' nodes.
    pub back: Vec<usize>,
    heals: Mutex<Vec<(String, Instant)>>,
    _dir: TempDir,
    /// Last: the namespaces go after every process in them.
    pub net: Net,
}

impl World {
    /// The servers of `store` and three sidecars, each in its own namespace,
    /// a leader elected, the recorder and the writers running.
    pub async fn start(store: Store, test: &str) -> World {
        let net = Net::new();
        let dir = TempDir::new().unwrap();
        let members = if store == Store::Etcd3 { 3 } else { 1 };
        let back: Vec<usize> = (0..members).map(|i| net.add(&format!("b{i}"))).collect();
        let servers = match store {
            Store::Redis => vec![start_redis(&net, back[0], &dir).await],
            _ => start_etcd(&net, &back, &dir).await,
        };
        let name = election(test);
        let mut sidecars = Vec::new();
        let mut side = Vec::new();
        for i in 0..3 {
            let node = net.add(&format!("s{i}"));
            let server = net.ip(back[i % members]);
            let mut args: Vec<String> = match store {
                Store::Redis => vec!["--redis-url".into(), format!("redis://{server}:6379")],
                _ => vec!["--etcd-endpoints".into(), format!("http://{server}:2379")],
            };
            args.extend(FAST.iter().map(|s| s.to_string()));
            args.extend(["--http-addr".into(), format!("{}:0", net.ip(node))]);
            let wrapper = net.wrapper(node);
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            sidecars.push(Sidecar::start_wrapped(
                &wrapper,
                &name,
                &format!("s{i}"),
                &args,
                &[],
            ));
            side.push(node);
        }
        let rec = Recorder::new(TTL);
        let addrs: Vec<(IpAddr, u16)> = sidecars
            .iter()
            .zip(&side)
            .map(|(s, &n)| (net.ip(n), s.port))
            .collect();
        for (s, (ip, port)) in sidecars.iter().zip(&addrs) {
            rec.add_at(&s.identity, *ip, *port);
        }
        let reg = Arc::new(Register::default());
        let writers = Some(Writers::start(
            reg.clone(),
            &addrs,
            Duration::from_millis(50),
        ));
        let w = World {
            rec,
            reg,
            writers,
            _sidecars: sidecars,
            side,
            _servers: servers,
            back,
            heals: Mutex::new(Vec::new()),
            _dir: dir,
            net,
        };
        w.leader(Duration::from_secs(30)).await;
        w
    }

    /// The leading slot and its token; panics after `limit`.
    pub async fn leader(&self, limit: Duration) -> (usize, u64) {
        self.rec
            .wait_leader(limit)
            .await
            .unwrap_or_else(|| panic!("no leader within {limit:?}"))
    }

    /// Declare a fault on the current leader that must end its term; returns
    /// the fault's index and the leader's slot.
    pub async fn fault_on_leader(&self, name: &str, expect: Expect) -> (usize, usize) {
        let (slot, token) = self.leader(Duration::from_secs(30)).await;
        let mut f = Fault::new(name, Some(slot), expect, BOUND);
        f.ends_term = Some((slot, token));
        (self.rec.fault(f), slot)
    }

    /// Heal every cut now and note the instant (fault `i`, if any, ends).
    pub fn heal(&self, name: &str, fault: Option<usize>) {
        self.net.heal();
        if let Some(i) = fault {
            self.rec.heal(i, false);
        }
        self.heals
            .lock()
            .unwrap()
            .push((name.to_owned(), Instant::now()));
    }

    /// Wait `settle`, then judge the whole history; panics on any violation.
    /// Prints one line of figures (run with `--nocapture` to read them).
    pub async fn judge(mut self, scenario: &str, settle: Duration) {
        sleep(settle).await;
        self.leader(BOUND).await;
        self.writers.take();
        let report = self.rec.check(scenario);
        let reg = self.reg.stats();
        let slots = self.rec.snapshot();
        let end = Instant::now();
        let heals = self.heals.lock().unwrap().clone();
        let gaps: Vec<Duration> = heals
            .iter()
            .enumerate()
            .map(|(k, (_, at))| {
                let until = heals.get(k + 1).map_or(end, |(_, next)| *next);
                leaderless_after(&slots, *at, until.min(*at + BOUND * 2))
            })
            .collect();
        let worst = gaps.iter().max().copied().unwrap_or_default();
        eprintln!(
            "{}== partition [{scenario}]: overlaps {}, token regressions {}, writes accepted {}, stale writes refused {}, shared tokens {}, heals {}, longest leaderless after a heal {} ms, longest leaderless overall {} ms",
            report.summary(),
            report.overlaps.len(),
            report.token_regressions.len(),
            reg.accepted,
            reg.refused_stale,
            reg.shared_token.len(),
            heals.len(),
            worst.as_millis(),
            report.longest_gap.as_millis()
        );
        assert!(report.problems.is_empty(), "{}", report.summary());
        assert!(report.overlaps.is_empty() && report.token_regressions.is_empty());
        assert!(reg.shared_token.is_empty(), "{:?}", reg.shared_token);
        assert!(reg.accepted > 0, "no holder ever wrote to the register");
        assert!(
            worst <= BOUND,
            "leaderless for {worst:?} after a heal, over the bound {BOUND:?}: {gaps:?}"
        );
    }
}

/// Start etcd members on `nodes` (one cluster), ready.
async fn start_etcd(net: &Net, nodes: &[usize], dir: &TempDir) -> Vec<NsProcess> {
    require("etcd", "etcd-server");
    let cluster: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, &n)| format!("m{i}=http://{}:2380", net.ip(n)))
        .collect();
    let mut procs = Vec::new();
    for (i, &n) in nodes.iter().enumerate() {
        let ip = net.ip(n);
        let args: Vec<String> = [
            "--name".into(),
            format!("m{i}"),
            "--data-dir".into(),
            dir.path().join(format!("etcd{i}")).display().to_string(),
            "--listen-client-urls".into(),
            format!("http://{ip}:2379"),
            "--advertise-client-urls".into(),
            format!("http://{ip}:2379"),
            "--listen-peer-urls".into(),
            format!("http://{ip}:2380"),
            "--initial-advertise-peer-urls".into(),
            format!("http://{ip}:2380"),
            "--initial-cluster".into(),
            cluster.join(","),
        ]
        .into();
        let log = dir.path().join(format!("etcd{i}.log"));
        procs.push(net.spawn(n, "etcd", &args, &log));
    }
    for &n in nodes {
        let ip = net.ip(n);
        let what = format!("etcd on {ip} to answer /health");
        wait_for(Duration::from_secs(30), &what, || async move {
            let answer = http_request_at(ip, 2379, "GET", "/health", None, HTTP_LIMIT).await;
            matches!(answer, Ok((200, body)) if body.contains("true"))
        })
        .await;
    }
    procs
}

/// Start a Redis server on `node` (port 6379, nothing kept), ready.
async fn start_redis(net: &Net, node: usize, dir: &TempDir) -> NsProcess {
    require("redis-server", "redis-server");
    let ip = net.ip(node);
    let args: Vec<String> = [
        "--port",
        "6379",
        "--bind",
        &ip.to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
    ]
    .map(String::from)
    .into();
    let p = net.spawn(node, "redis-server", &args, &dir.path().join("redis.log"));
    wait_for(Duration::from_secs(15), "redis to accept", || async move {
        tokio::net::TcpStream::connect((ip, 6379)).await.is_ok()
    })
    .await;
    p
}
