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

fn proc_stat(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (rss_kib / 1024.0, ticks / 100.0)
}

async fn etcd_messages(url: &str) -> BTreeMap<String, f64> {
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let (_, text) = http_get(port, "/metrics").await.expect("etcd metrics");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{grpc_method=\"") {
            let method = rest.split('"').next().unwrap().to_owned();
            let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap_or(0.0);
            *out.entry(method).or_default() += v;
        }
    }
    out
}

/// Redis `INFO commandstats` call counts per command.
async fn redis_commands(server: &RedisServer) -> BTreeMap<String, f64> {
    let mut c = server.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for line in info.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (name, stats) = rest.split_once(':').unwrap();
            let calls: f64 = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            out.insert(name.to_owned(), calls);
        }
    }
    out
}

enum Server {
    Etcd(Etcd),
    Redis(RedisServer),
}

impl Server {
    async fn counts(&self) -> BTreeMap<String, f64> {
        match self {
            Server::Etcd(e) => etcd_messages(&e.url).await,
            Server::Redis(r) => {
                let mut m = redis_commands(r).await;
                // Our own INFO calls are not the group's load.
                m.remove("info");
                m
            }
        }
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
    let flags = ["--lease-duration", ttl.as_str(), "--log-level", "warn"];
    let server = match backend.as_str() {
        "redis" => Server::Redis(RedisServer::start().await),
        _ => Server::Etcd(Etcd::start().await),
    };
    let election = election("bench");
    let mut next_id = 0;
    let mut spawn = |server: &Server| {
        next_id += 1;
        let id = format!("c{next_id}");
        match server {
            Server::Etcd(e) => Sidecar::start(&e.url, &election, &id, &flags),
            Server::Redis(r) => redis_sidecar(&[&r.url], &election, &id, &flags),
        }
    };
    let mut cs: Vec<Sidecar> = (0..3).map(|_| spawn(&server)).collect();
    let mut leader = one_leader(&cs, Duration::from_secs(20)).await;

    let mut handover = Vec::new();
    let mut failover = Vec::new();
    for (label, sig, out) in [
        (
            "graceful handover (SIGTERM)",
            Signal::SIGTERM,
            &mut handover,
        ),
        ("crash failover (SIGKILL)", Signal::SIGKILL, &mut failover),
    ] {
        for run in 0..runs {
            // Let the followers settle into their watches; for a crash, also
            // hit a random point of the leader's renew cycle (TTL/3).
            sleep(Duration::from_millis(300)).await;
            if sig == Signal::SIGKILL {
                let cycle = humantime::parse_duration(&ttl).unwrap() / 3;
                sleep(cycle.mul_f64(rand::random::<f64>())).await;
            }
            let others: Vec<usize> = (0..cs.len()).filter(|i| *i != leader).collect();
            let t0 = Instant::now();
            cs[leader].signal(sig);
            let Some(next) = first_leader(&cs, &others, Duration::from_secs(30)).await else {
                panic!("{label}: no new leader within 30 s");
            };
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            eprintln!("{label} run {}: {ms:.2} ms", run + 1);
            out.push(ms);
            cs[leader] = spawn(&server);
            leader = next;
        }
    }

    // At rest: one leader, two followers.
    leader = one_leader(&cs, Duration::from_secs(20)).await;
    let follower = (0..cs.len()).find(|i| *i != leader).unwrap();
    sleep(Duration::from_secs(5)).await;
    let pid = |s: &Sidecar| s.pid();
    let (_, cpu_l0) = proc_stat(pid(&cs[leader]));
    let (_, cpu_f0) = proc_stat(pid(&cs[follower]));
    let m0 = server.counts().await;
    sleep(Duration::from_secs(rest_secs)).await;
    let m1 = server.counts().await;
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

    let (hm, hp, hx) = median(&mut handover);
    let (fm, fp, fx) = median(&mut failover);
    match &server {
        Server::Etcd(_) => println!(
            "## leader-elector on etcd {} (loopback, 1 member, TTL {ttl}, {runs} runs)\n",
            etcd_version()
        ),
        Server::Redis(_) => println!(
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
    println!("| at rest ({rest_secs} s) | leader | follower |");
    println!("|---|---|---|");
    println!("| RSS | {rss_l:.1} MiB | {rss_f:.1} MiB |");
    println!(
        "| CPU seconds per minute | {:.3} | {:.3} |",
        (cpu_l1 - cpu_l0) * per_min,
        (cpu_f1 - cpu_f0) * per_min
    );
    println!();
    println!(
        "{backend} requests at rest, whole group of 3: {:.1}/min ({})",
        total * per_min,
        by_method.join(", ")
    );
    if let Server::Etcd(_) = server {
        println!(
            "etcd messages from the two followers at rest: {:.1}/min",
            follower_msgs * per_min
        );
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
