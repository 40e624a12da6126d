//! Benchmark of the Kubernetes Lease backend against the API stand-in
//! (tests/support/kube_api/): graceful handover, crash failover, API
//! requests per candidate at rest, and RSS. Three candidates, TTL 5 s (the
//! other backends' setting in BENCHMARKS.md), release build.
//!
//! `cargo bench --bench kubernetes`; under `cargo test` it does nothing.
//! Environment: `KBENCH_TRIALS` [10], `KBENCH_REST_SECS` [30], `KBENCH_TTL` [5s].
//! The stand-in answers on loopback in microseconds; a real API server adds
//! its own latency (typically 1-10 ms per write through etcd) to handover.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use nix::sys::signal::Signal;
use rand::Rng;
use support::kube_api::{Endpoint, KubeApi};
use support::procfs::rss_kib;
use support::{Sidecar, env_or, http_get};
use tokio::time::{Instant, sleep};

async fn leads(port: u16) -> bool {
    matches!(http_get(port, "/leader").await, Ok((200, _)))
}

struct Cand {
    ep: std::sync::Arc<Endpoint>,
    s: Option<Sidecar>,
}

async fn start(api: &KubeApi, election: &str, id: &str, ttl: &str) -> Cand {
    let ep = api.endpoint(id).await;
    let args: Vec<String> = [
        "--backend",
        "kubernetes",
        "--lease-duration",
        ttl,
        "--log-level",
        "warn",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let kc = ep.kubeconfig().to_string_lossy().into_owned();
    let s = Sidecar::start_env(election, id, &args, &[("KUBECONFIG", kc.as_str())]);
    Cand { ep, s: Some(s) }
}

async fn leader_of(cs: &[Cand], limit: Duration) -> usize {
    let end = Instant::now() + limit;
    loop {
        for (i, c) in cs.iter().enumerate() {
            if let Some(s) = &c.s
                && leads(s.port).await
            {
                return i;
            }
        }
        assert!(Instant::now() < end, "no leader within {limit:?}");
        sleep(Duration::from_millis(2)).await;
    }
}

async fn new_leader(cs: &[Cand], not: usize, limit: Duration) -> usize {
    let end = Instant::now() + limit;
    loop {
        for (i, c) in cs.iter().enumerate() {
            if i != not
                && let Some(s) = &c.s
                && leads(s.port).await
            {
                return i;
            }
        }
        assert!(Instant::now() < end, "no new leader within {limit:?}");
        sleep(Duration::from_millis(1)).await;
    }
}

fn stats(v: &mut [f64]) -> String {
    let s = support::stats::summarize(v);
    format!(
        "median {:.1} ms, min {:.1}, max {:.1} (n={})",
        s.median, s.min, s.max, s.n
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let trials: usize = env_or("KBENCH_TRIALS", 10);
    let rest: u64 = env_or("KBENCH_REST_SECS", 30);
    let ttl_s: String = env_or("KBENCH_TTL", "5s".to_string());
    let ttl = humantime::parse_duration(&ttl_s).unwrap();
    let api = KubeApi::start("bench");
    let election = format!("kbench-{}", std::process::id());
    let mut cs = Vec::new();
    for id in ["a", "b", "c"] {
        cs.push(start(&api, &election, id, &ttl_s).await);
    }
    leader_of(&cs, Duration::from_secs(30)).await;
    sleep(Duration::from_secs(2)).await;
    at_rest(&cs, rest, &ttl_s).await;

    // Graceful handover: SIGTERM the leader, restart it under its name.
    let mut hand = Vec::new();
    for _ in 0..trials {
        let l = leader_of(&cs, Duration::from_secs(30)).await;
        sleep(Duration::from_millis(300)).await;
        let t0 = Instant::now();
        cs[l].s.as_ref().unwrap().signal(Signal::SIGTERM);
        new_leader(&cs, l, Duration::from_secs(30)).await;
        hand.push(t0.elapsed().as_secs_f64() * 1000.0);
        restart(&api, &election, &mut cs, l, &ttl_s).await;
    }
    println!(
        "== graceful handover (SIGTERM → another answers 200): {}",
        stats(&mut hand)
    );

    // Crash failover: SIGKILL at a random point of the renew cycle.
    let mut fail = Vec::new();
    for _ in 0..trials {
        let l = leader_of(&cs, Duration::from_secs(30)).await;
        let wait = ttl / 3;
        sleep(wait.mul_f64(rand::rng().random_range(1.0..2.0))).await;
        let t0 = Instant::now();
        cs[l].s.as_ref().unwrap().signal(Signal::SIGKILL);
        new_leader(&cs, l, ttl * 3).await;
        fail.push(t0.elapsed().as_secs_f64() * 1000.0);
        restart(&api, &election, &mut cs, l, &ttl_s).await;
    }
    println!(
        "== crash failover (SIGKILL → another answers 200): {}",
        stats(&mut fail)
    );
}

/// At rest for `rest` seconds: print each candidate's requests per second
/// (by kind) and RSS.
async fn at_rest(cs: &[Cand], rest: u64, ttl_s: &str) {
    let l = leader_of(cs, Duration::from_secs(10)).await;
    let before: Vec<_> = cs.iter().map(|c| c.ep.counts()).collect();
    sleep(Duration::from_secs(rest)).await;
    println!("== at rest for {rest} s (TTL {ttl_s}, renew every TTL/3):");
    for (i, c) in cs.iter().enumerate() {
        let after = c.ep.counts();
        let mut parts = Vec::new();
        let mut total = 0;
        for (k, n) in &after {
            let d = n - before[i].get(k).copied().unwrap_or(0);
            if d > 0 {
                parts.push(format!("{k} {d}"));
                total += d;
            }
        }
        let role = if i == l { "leader" } else { "follower" };
        let pid = c.s.as_ref().unwrap().pid();
        println!(
            "  {} ({role}): {:.3} requests/s [{}]; RSS {:.1} MiB",
            c.s.as_ref().unwrap().identity,
            total as f64 / rest as f64,
            parts.join(", "),
            rss_kib(pid) as f64 / 1024.0
        );
    }
}

/// Wait for the signalled candidate `l` to exit, start it again under its
/// name, and let it settle.
async fn restart(api: &KubeApi, election: &str, cs: &mut [Cand], l: usize, ttl_s: &str) {
    let mut old = cs[l].s.take().unwrap();
    old.wait_exit(Duration::from_secs(5)).await;
    let id = old.identity.clone();
    drop(old);
    cs[l] = start(api, election, &id, ttl_s).await;
    sleep(Duration::from_millis(500)).await;
}
