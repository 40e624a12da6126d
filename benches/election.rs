//! Benchmark of the core sidecar on a real etcd (loopback, TTL 5 s by default):
//! graceful handover, crash failover, footprint at rest and etcd requests at
//! rest. Prints markdown tables. Run with `scripts/bench` (or
//! `cargo bench --bench election`); under `cargo test` it does nothing.
//!
//! Environment: `BENCH_BACKEND` (`etcd`, default, or `redis`), `BENCH_RUNS`
//! (default 10), `BENCH_TTL` (default 5s), `BENCH_REST_SECS` (default 60).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use nix::sys::signal::Signal;
use support::backends::Backend;
use support::*;
use tokio::time::{Instant, sleep};

/// Median, p90 and maximum of `v`.
fn median(v: &mut [f64]) -> (f64, f64, f64) {
    let s = support::stats::summarize(v);
    (s.median, s.p90, s.max)
}

/// The first instant one of `candidates` answers 200, polling all of them in parallel.
async fn first_leader(cs: &[Sidecar], candidates: &[usize], limit: Duration) -> Option<usize> {
    let end = Instant::now() + limit;
    loop {
        let polls = candidates.iter().map(|i| {
            let i = *i;
            let port = cs[i].port;
            async move { matches!(http_get(port, "/leader").await, Ok((200, _))).then_some(i) }
        });
        if let Some(i) = futures_util::future::join_all(polls)
            .await
            .into_iter()
            .flatten()
            .next()
        {
            return Some(i);
        }
        if Instant::now() > end {
            return None;
        }
    }
}

/// RSS (MiB) and CPU seconds (user + system) of a process.
fn proc_stat(pid: u32) -> (f64, f64) {
    (
        procfs::rss_kib(pid) as f64 / 1024.0,
        procfs::cpu_seconds(pid),
    )
}

/// Requests the group sent so far, by method (our own INFO calls are not
/// the group's load).
async fn counts(server: &Backend) -> BTreeMap<String, f64> {
    match server {
        Backend::Redis(r) => {
            let mut m = redis_calls(&mut r.conn().await).await;
            m.remove("info");
            m
        }
        Backend::Etcd(e) => etcd_messages(e.port()).await,
        other => panic!(
            "the election bench runs on etcd or Redis, not {}",
            other.name()
        ),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("election benchmark: skipped (run scripts/bench)");
        return;
    }
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let ttl = std::env::var("BENCH_TTL").unwrap_or_else(|_| "5s".into());
    let rest_secs: u64 = std::env::var("BENCH_REST_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let backend = std::env::var("BENCH_BACKEND").unwrap_or_else(|_| "etcd".into());
    let server = match backend.as_str() {
        "redis" => Backend::start("redis").await,
        _ => Backend::start("etcd").await,
    };
    let mut b = Bench {
        server,
        election: election("bench"),
        ttl,
        next_id: 0,
        cs: Vec::new(),
        leader: 0,
    };
    b.cs = (0..3).map(|_| b.spawn()).collect();
    b.leader = one_leader(&b.cs, Duration::from_secs(20)).await;
    let mut handover = b
        .trials("graceful handover (SIGTERM)", Signal::SIGTERM, runs)
        .await;
    let mut failover = b
        .trials("crash failover (SIGKILL)", Signal::SIGKILL, runs)
        .await;
    let rest = b.at_rest(rest_secs).await;

    let (hm, hp, hx) = median(&mut handover);
    let (fm, fp, fx) = median(&mut failover);
    let ttl = &b.ttl;
    match &b.server {
        Backend::Etcd(_) => println!(
            "## leader-elector on etcd {} (loopback, 1 member, TTL {ttl}, {runs} runs)\n",
            etcd_version()
        ),
        _ => println!(
            "## leader-elector on Redis {} (loopback, single instance, TTL {ttl}, {runs} runs)\n",
            redis_version()
        ),
    }
    println!("| measure | median | p90 | max |");
    println!("|---|---|---|---|");
    println!(
        "| graceful handover: SIGTERM → another sidecar's /leader answers 200 | {hm:.2} ms | {hp:.2} ms | {hx:.2} ms |"
    );
    println!("| crash failover: SIGKILL → same | {fm:.0} ms | {fp:.0} ms | {fx:.0} ms |");
    println!();
    rest.print(&backend, matches!(b.server, Backend::Etcd(_)));
}

/// The benchmark's election: its server, its three candidates, and the
/// leader among them.
struct Bench {
    server: Backend,
    election: String,
    /// The lease duration, as given (`5s`).
    ttl: String,
    next_id: usize,
    cs: Vec<Sidecar>,
    leader: usize,
}

impl Bench {
    /// A new candidate `c<n>` on the server.
    fn spawn(&mut self) -> Sidecar {
        self.next_id += 1;
        let id = format!("c{}", self.next_id);
        let flags = ["--lease-duration", self.ttl.as_str(), "--log-level", "warn"];
        match &self.server {
            Backend::Etcd(e) => Sidecar::start(&e.url, &self.election, &id, &flags),
            Backend::Redis(r) => redis_sidecar(&[&r.url], &self.election, &id, &flags),
            other => panic!(
                "the election bench runs on etcd or Redis, not {}",
                other.name()
            ),
        }
    }

    /// `runs` times: send `sig` to the leader and time until another
    /// candidate's `/leader` answers 200 (ms); a fresh candidate replaces
    /// the old leader each time.
    async fn trials(&mut self, label: &str, sig: Signal, runs: usize) -> Vec<f64> {
        let mut out = Vec::new();
        for run in 0..runs {
            // Let the followers settle into their watches; for a crash, also
            // hit a random point of the leader's renew cycle (TTL/3).
            sleep(Duration::from_millis(300)).await;
            if sig == Signal::SIGKILL {
                let cycle = humantime::parse_duration(&self.ttl).unwrap() / 3;
                sleep(cycle.mul_f64(rand::random::<f64>())).await;
            }
            let leader = self.leader;
            let others: Vec<usize> = (0..self.cs.len()).filter(|i| *i != leader).collect();
            let t0 = Instant::now();
            self.cs[leader].signal(sig);
            let Some(next) = first_leader(&self.cs, &others, Duration::from_secs(30)).await else {
                panic!("{label}: no new leader within 30 s");
            };
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            eprintln!("{label} run {}: {ms:.2} ms", run + 1);
            out.push(ms);
            self.cs[leader] = self.spawn();
            self.leader = next;
        }
        out
    }

    /// One leader and two followers at rest for `rest_secs`.
    async fn at_rest(&mut self, rest_secs: u64) -> AtRest {
        self.leader = one_leader(&self.cs, Duration::from_secs(20)).await;
        let (cs, leader) = (&self.cs, self.leader);
        let follower = (0..cs.len()).find(|i| *i != leader).unwrap();
        sleep(Duration::from_secs(5)).await;
        let pid = |s: &Sidecar| s.pid();
        let (_, cpu_l0) = proc_stat(pid(&cs[leader]));
        let (_, cpu_f0) = proc_stat(pid(&cs[follower]));
        let m0 = counts(&self.server).await;
        sleep(Duration::from_secs(rest_secs)).await;
        let m1 = counts(&self.server).await;
        let (rss_l, cpu_l1) = proc_stat(pid(&cs[leader]));
        let (rss_f, cpu_f1) = proc_stat(pid(&cs[follower]));
        let per_min = 60.0 / rest_secs as f64;
        let mut by_method = Vec::new();
        let mut total = 0.0;
        for (k, v1) in &m1 {
            let d = v1 - m0.get(k).copied().unwrap_or(0.0);
            if d > 0.0 {
                by_method.push(format!("{k} {:.1}/min", d * per_min));
                total += d;
            }
        }
        // etcd: Range (ownership check) and LeaseKeepAlive come from the leader's
        // renewals only; Redis: the renew script runs as EVALSHA from the leader,
        // the followers' campaign script too, so Redis is reported as a whole.
        let leader_only = ["Range", "LeaseKeepAlive"];
        let follower_msgs: f64 = m1
            .iter()
            .filter(|(k, _)| !leader_only.contains(&k.as_str()))
            .map(|(k, v)| v - m0.get(k).copied().unwrap_or(0.0))
            .sum();
        AtRest {
            rest_secs,
            rss: (rss_l, rss_f),
            cpu: (cpu_l1 - cpu_l0, cpu_f1 - cpu_f0),
            by_method,
            total,
            follower_msgs,
        }
    }
}

/// What the group did at rest over `rest_secs`.
struct AtRest {
    rest_secs: u64,
    /// RSS (MiB) of the leader and of a follower.
    rss: (f64, f64),
    /// CPU seconds of the leader and of a follower over the window.
    cpu: (f64, f64),
    /// Backend requests by method, per minute, as `name n/min`.
    by_method: Vec<String>,
    /// Backend requests over the window, in all and from the followers.
    total: f64,
    follower_msgs: f64,
}

impl AtRest {
    /// Print the at-rest table and the backend's request counts.
    fn print(&self, backend: &str, etcd: bool) {
        let rest_secs = self.rest_secs;
        let per_min = 60.0 / rest_secs as f64;
        let (rss_l, rss_f) = self.rss;
        println!("| at rest ({rest_secs} s) | leader | follower |");
        println!("|---|---|---|");
        println!("| RSS | {rss_l:.1} MiB | {rss_f:.1} MiB |");
        println!(
            "| CPU seconds per minute | {:.3} | {:.3} |",
            self.cpu.0 * per_min,
            self.cpu.1 * per_min
        );
        println!();
        println!(
            "{backend} requests at rest, whole group of 3: {:.1}/min ({})",
            self.total * per_min,
            self.by_method.join(", ")
        );
        if etcd {
            println!(
                "etcd messages from the two followers at rest: {:.1}/min",
                self.follower_msgs * per_min
            );
        }
    }
}

fn etcd_version() -> String {
    std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.trim_start_matches("etcd Version: ").to_owned())
        })
        .unwrap_or_default()
}

fn redis_version() -> String {
    std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_owned))
        })
        .unwrap_or_default()
}
