//! Benchmark of the coordination API: uncontended acquire+release latency
//! (p50 / p99) and throughput on etcd and on Redis through the sidecar, and
//! contended throughput with 20 clients; beside it, the same loop done by
//! redis-py's `Lock` directly against the same Redis. Run with
//! `scripts/bench-coord`; under `cargo test` it does nothing.
//! `BENCH_ROUNDS` (default 1000) sets the uncontended rounds,
//! `BENCH_EACH` (default 25) the rounds of each contended client, and
//! `BENCH_ONLY=etcd` runs only etcd's contended case and its at-rest count
//! (for comparing two builds back to back).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::*;
use tokio::time::Instant;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * p).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 1)]
}

async fn start_sidecar(args: Vec<String>) -> (Sidecar, u16) {
    let port = server_port();
    let mut a = args;
    a.extend([
        "--control-addr".into(),
        format!("127.0.0.1:{port}"),
        "--log-level".into(),
        "warn".into(),
    ]);
    let s = Sidecar::start_raw(&election("coord-bench"), "bench", &a);
    wait_for(Duration::from_secs(10), "the control API", || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    (s, port)
}

/// Uncontended: one client, `rounds` x (acquire, release). Returns (p50 ms, p99 ms, ops/s).
async fn uncontended(port: u16, rounds: usize) -> (f64, f64, f64) {
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let mut lat = Vec::with_capacity(rounds);
    let t0 = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let g: serde_json::Value = client
            .post(format!("{base}/locks/bench?ttl=10s"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = g["token"].as_str().expect("granted");
        let r = client
            .delete(format!("{base}/locks/bench?token={token}"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let rate = rounds as f64 / t0.elapsed().as_secs_f64();
    (pct(&mut lat, 0.5), pct(&mut lat, 0.99), rate)
}

/// Contended: 20 clients x `each` rounds on one lock. Returns acquisitions/s.
async fn contended(port: u16, each: usize) -> f64 {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let base = format!("http://127.0.0.1:{port}");
            for _ in 0..each {
                let g: serde_json::Value = client
                    .post(format!("{base}/locks/hot?ttl=10s&wait=60s"))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let token = g["token"].as_str().expect("granted").to_owned();
                client
                    .delete(format!("{base}/locks/hot?token={token}"))
                    .send()
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (20 * each) as f64 / t0.elapsed().as_secs_f64()
}

/// Backend requests per second while `waiters` clients wait (wait=60s) on a
/// lock that stays held, measured over `window` after the waiters settled,
/// minus the rate with nobody waiting. `count` reads the backend's total of
/// requests served. Returns (requests/s at rest with nobody waiting, extra
/// requests/s per waiting client).
async fn at_rest<F, Fut>(port: u16, waiters: usize, window: Duration, count: F) -> (f64, f64)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let g: serde_json::Value = client
        .post(format!("{base}/locks/rest?ttl=120s"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        g["token"].is_string(),
        "the at-rest lock was not granted: {g}"
    );
    let before = count().await;
    tokio::time::sleep(window).await;
    let idle = (count().await - before) / window.as_secs_f64();
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let client = client.clone();
        let url = format!("{base}/locks/rest?ttl=10s&wait=300s");
        tasks.push(tokio::spawn(async move {
            let _ = client.post(url).send().await;
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = count().await;
    tokio::time::sleep(window).await;
    let busy = (count().await - before) / window.as_secs_f64();
    for t in tasks {
        t.abort();
    }
    (idle, (busy - idle).max(0.0) / waiters as f64)
}

/// etcd's count of gRPC requests started (unary and streams), from its /metrics.
async fn etcd_requests(url: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("grpc_server_started_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Redis's count of commands processed.
async fn redis_commands(redis: &RedisServer) -> f64 {
    let mut c = redis.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The etcd-only run of `BENCH_ONLY=etcd`: contended throughput and the
/// requests of waiting clients at rest.
async fn etcd_only(each: usize, waiters: usize) {
    let etcd = Etcd::start().await;
    let (_se, pe) = start_sidecar(vec!["--etcd-endpoints".into(), etcd.url.clone()]).await;
    let hot = contended(pe, each).await;
    println!("etcd contended (20 clients x {each}): {hot:.0} acquisitions/s");
    let url = etcd.url.clone();
    let window = Duration::from_secs(10);
    let (idle, per) = at_rest(pe, waiters, window, || etcd_requests(&url)).await;
    println!(
        "{waiters} clients waiting on a held lock: etcd {per:.3} requests/s per waiting client (at rest with nobody waiting: {idle:.1}/s)"
    );
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("coordination benchmark: skipped (run scripts/bench-coord)");
        return;
    }
    let rounds = knob("BENCH_ROUNDS", 1000);
    let each = knob("BENCH_EACH", 25);
    let waiters = knob("BENCH_WAITERS", 500);
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "etcd") {
        return etcd_only(each, waiters).await;
    }
    let etcd = Etcd::start().await;
    let redis = RedisServer::start().await;
    let (_se, pe) = start_sidecar(vec!["--etcd-endpoints".into(), etcd.url.clone()]).await;
    let (_sr, pr) = start_sidecar(vec!["--redis-url".into(), redis.url.clone()]).await;
    println!(
        "## Coordination API: lock acquire + release through the sidecar (loopback, HTTP keep-alive)\n"
    );
    println!(
        "| backend | uncontended p50 | p99 | uncontended rounds/s | contended (20 clients) acquisitions/s |"
    );
    println!("|---|---|---|---|---|");
    for (name, port) in [("etcd", pe), ("redis", pr)] {
        let (p50, p99, rate) = uncontended(port, rounds).await;
        let hot = contended(port, each).await;
        println!("| {name} | {p50:.2} ms | {p99:.2} ms | {rate:.0} | {hot:.0} |");
    }
    let window = Duration::from_secs(10);
    let url = etcd.url.clone();
    let (idle, per) = at_rest(pe, waiters, window, || etcd_requests(&url)).await;
    println!(
        "\n{waiters} clients waiting on a held lock: etcd {per:.3} requests/s per waiting client (at rest with nobody waiting: {idle:.1}/s)"
    );
    let (idle, per) = at_rest(pr, waiters, window, || redis_commands(&redis)).await;
    println!(
        "{waiters} clients waiting on a held lock: Redis {per:.3} commands/s per waiting client (at rest with nobody waiting: {idle:.1}/s)\n"
    );
    // redis-py's Lock, the same loop directly against the same Redis.
    let py = std::process::Command::new("python3")
        .arg("bench/redispy_lock_loop.py")
        .arg(&redis.url)
        .arg(rounds.to_string())
        .output();
    match py {
        Ok(o) if o.status.success() => {
            println!(
                "| redis-py `Lock` directly (no sidecar) | {} |",
                String::from_utf8_lossy(&o.stdout).trim()
            );
        }
        Ok(o) => println!(
            "\nredis-py comparison failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => println!("\nredis-py comparison not run: {e}"),
    }
}
