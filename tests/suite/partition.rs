//! Real partitions (issue 48): every server and sidecar in its own network
//! namespace (`support::netns`), faults made by nftables rules between
//! them, the sidecars' `/leader` sampled from the host by the recorder, and
//! a fenced register written by every sidecar that says it leads
//! (`support::history`). Each scenario holds: no two sidecars lead at once,
//! fencing tokens grow, the register never takes a write of a term held
//! twice, and a leader is back within the bound after each heal.
//!
//! Two scenarios run in every `cargo test`; the whole set runs with
//! `LEADER_ELECTOR_PARTITIONS=all` (the others return at once without it;
//! `scripts/partitions` runs it and writes BENCHMARKS.md's figures). This
//! file builds the world; the scenarios are in `partition_scenarios` (etcd
//! and Redis), `partition_sentinel`, `partition_kube` and
//! `partition_failsafe`.

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

/// The bound when the fault may cost etcd its Raft leader (the leader's
/// member cut into the minority): the book's "etcd's downtime + TTL + 0.5 s"
/// after the last renewal, where the downtime is the majority's election:
/// etcd's 1 s election timeout, randomized up to twice that. [`BOUND`] plus
/// that election.
pub const RAFT_BOUND: Duration = Duration::from_millis(2 * 2000 + 1500 + 2000);

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
    /// [`Store::Etcd3`] with `--pre-vote` (etcd 3.4's default is off; 3.5
    /// turns it on): a member rejoining from a partition does not force an
    /// election.
    Etcd3PreVote,
    /// One Redis server.
    Redis,
    /// One etcd member; the sidecars with `--failsafe`, their peer
    /// listeners on their own addresses.
    EtcdFailsafe,
    /// A Redis primary, two replicas and three Sentinels (`back` in that
    /// order); the sidecars follow the Sentinels with `--redis-min-replicas 1`.
    Sentinel,
    /// The Kubernetes API stand-in, in the test process on the host,
    /// reached through the bridge.
    Kube,
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
    /// The Kubernetes API stand-in, when that is the backend.
    pub kube: Option<super::partition_kube::KubeHost>,
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
        let servers = backend(store, &net, &dir).await;
        let env: Vec<(&str, &str)> = servers
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let name = election(test);
        let mut sidecars = Vec::new();
        let mut side = Vec::new();
        for (i, flags) in servers.flags.iter().enumerate() {
            let node = net.add(&format!("s{i}"));
            let mut args = flags.clone();
            args.extend(FAST.iter().map(|s| s.to_string()));
            args.extend(["--http-addr".into(), format!("{}:0", net.ip(node))]);
            if store == Store::EtcdFailsafe {
                args.extend(super::partition_failsafe::flags(net.ip(node), dir.path()));
            }
            let wrapper = net.wrapper(node);
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            let id = format!("s{i}");
            sidecars.push(Sidecar::start_wrapped(&wrapper, &name, &id, &args, &env));
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
        let writers = Some(Writers::start(reg.clone(), &addrs, TTL / 2));
        let w = World {
            rec,
            reg,
            writers,
            _sidecars: sidecars,
            side,
            back: servers.back.clone(),
            kube: servers.kube,
            _servers: servers.procs,
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
    /// A new term must come within `within` of the fault.
    pub async fn fault_on_leader(
        &self,
        name: &str,
        expect: Expect,
        within: Duration,
    ) -> (usize, usize) {
        let (slot, token) = self.leader(Duration::from_secs(30)).await;
        let mut f = Fault::new(name, Some(slot), expect, within);
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
        let recovery = report
            .slowest_recovery
            .as_ref()
            .map_or("—".into(), |(r, b, _)| {
                format!("{} ({})", r.as_millis(), b.as_millis())
            });
        // One tab-separated line for scripts/partitions (BENCHMARKS.md).
        eprintln!(
            "partition-result\t{scenario}\t{}\t{}\t{}\t{recovery}\t{}\t{}\t{}\t{}\t{}",
            report.faults,
            report.overlaps.len(),
            report.token_regressions.len(),
            worst.as_millis(),
            report.longest_gap.as_millis(),
            reg.accepted,
            reg.refused_stale,
            reg.shared_token.len()
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

/// What a world's backend is made of.
pub struct Servers {
    /// The servers' nodes (none for the stand-in, which runs on the host).
    pub back: Vec<usize>,
    /// Their processes.
    pub procs: Vec<NsProcess>,
    /// The backend flags of each of the three sidecars.
    pub flags: Vec<Vec<String>>,
    /// Environment for every sidecar (`KUBECONFIG`).
    pub env: Vec<(String, String)>,
    /// The Kubernetes API stand-in, when that is the backend.
    pub kube: Option<super::partition_kube::KubeHost>,
}

/// The servers of `store` on new nodes.
async fn backend(store: Store, net: &Net, dir: &TempDir) -> Servers {
    match store {
        Store::Sentinel => return super::partition_sentinel::start(net, dir).await,
        Store::Kube => return super::partition_kube::start(net, dir).await,
        _ => {}
    }
    let members = if matches!(store, Store::Etcd3 | Store::Etcd3PreVote) {
        3
    } else {
        1
    };
    let back: Vec<usize> = (0..members).map(|i| net.add(&format!("b{i}"))).collect();
    let procs = match store {
        Store::Redis => vec![start_redis(net, back[0], dir, &[]).await],
        _ => start_etcd(net, &back, dir, store == Store::Etcd3PreVote).await,
    };
    let flags = (0..3)
        .map(|i| {
            let server = net.ip(back[i % members]);
            match store {
                Store::Redis => vec!["--redis-url".into(), format!("redis://{server}:6379")],
                _ => vec!["--etcd-endpoints".into(), format!("http://{server}:2379")],
            }
        })
        .collect();
    Servers {
        back,
        procs,
        flags,
        env: Vec::new(),
        kube: None,
    }
}

/// Start etcd members on `nodes` (one cluster; with Raft's pre-vote when
/// `pre_vote`), every one answering `/health`.
async fn start_etcd(net: &Net, nodes: &[usize], dir: &TempDir, pre_vote: bool) -> Vec<NsProcess> {
    require("etcd", "etcd-server");
    let cluster: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, &n)| format!("m{i}=http://{}:2380", net.ip(n)))
        .collect();
    let mut procs = Vec::new();
    for (i, &n) in nodes.iter().enumerate() {
        let ip = net.ip(n);
        let mut args: Vec<String> = [
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
        if pre_vote {
            args.push("--pre-vote".into());
        }
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

/// Start a Redis server on `node` (port 6379, nothing kept; `extra` flags
/// after the defaults), accepting connections.
pub async fn start_redis(net: &Net, node: usize, dir: &TempDir, extra: &[String]) -> NsProcess {
    require("redis-server", "redis-server");
    let ip = net.ip(node);
    let mut args: Vec<String> = [
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
    args.extend_from_slice(extra);
    let log = dir.path().join(format!("redis{node}.log"));
    let p = net.spawn(node, "redis-server", &args, &log);
    wait_for(Duration::from_secs(15), "redis to accept", || async move {
        tokio::net::TcpStream::connect((ip, 6379)).await.is_ok()
    })
    .await;
    p
}
