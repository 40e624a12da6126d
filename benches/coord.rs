//! Benchmark of the coordination API: uncontended acquire+release latency
//! (p50 / p99) and throughput on etcd and on Redis through the sidecar, and
//! contended throughput with 20 clients; beside it, the same loop done by
//! redis-py's `Lock` directly against the same Redis. Run with
//! `scripts/bench-coord`; under `cargo test` it does nothing.
//! `BENCH_ROUNDS` (default 1000) sets the uncontended rounds,
//! `BENCH_EACH` (default 25) the rounds of each contended client, and
//! `BENCH_ONLY=etcd` runs only etcd's contended case and its at-rest count
//! (for comparing two builds back to back); `BENCH_ONLY=kubernetes` only the
//! Lease backend on the Kubernetes API stand-in (every row of it).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::stats::percentile;
use support::*;
use tokio::time::Instant;

/// The limit of a request that does not set its own (one without `wait`).
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// A client of the bench: reqwest for its keep-alive (the table measures
/// loopback with keep-alive, which `support::http` does not do), every
/// request within [`CALL_LIMIT`] unless it sets a longer limit.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(CALL_LIMIT)
        .build()
        .expect("an HTTP client")
}

/// What a failed request probably means: on a timeout, what hung.
fn failed(what: &str, e: &reqwest::Error) -> String {
    if e.is_timeout() {
        format!(
            "{what}: no answer within its limit: the server probably hung (its handler, or the backend behind it): {e}"
        )
    } else {
        format!("{what}: {e}")
    }
}

/// `POST url` within `limit`; its JSON answer. Panics saying what probably hung.
async fn post_json(client: &reqwest::Client, url: &str, limit: Duration) -> serde_json::Value {
    let what = format!("POST {url}");
    let r = client.post(url).timeout(limit).send().await;
    let r = r.unwrap_or_else(|e| panic!("{}", failed(&what, &e)));
    r.json()
        .await
        .unwrap_or_else(|e| panic!("{}", failed(&what, &e)))
}

/// `DELETE url` within [`CALL_LIMIT`]; its status. Panics saying what probably hung.
async fn delete(client: &reqwest::Client, url: &str) -> reqwest::StatusCode {
    let r = client.delete(url).send().await;
    r.unwrap_or_else(|e| panic!("{}", failed(&format!("DELETE {url}"), &e)))
        .status()
}

async fn start_sidecar(args: Vec<String>) -> (Sidecar, u16) {
    let mut a = args;
    a.extend(CONTROL.iter().map(|s| s.to_string()));
    a.extend(["--log-level".into(), "warn".into()]);
    let s = Sidecar::start_raw(&election("coord-bench"), "bench", &a);
    // Bound before the "starting" line: connections queue until it serves.
    let port = s.control();
    (s, port)
}

/// Uncontended: one client, `rounds` x (acquire, release). Returns (p50 ms, p99 ms, ops/s).
async fn uncontended(port: u16, rounds: usize) -> (f64, f64, f64) {
    let client = client();
    let base = format!("http://127.0.0.1:{port}");
    let mut lat = Vec::with_capacity(rounds);
    let t0 = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let g = post_json(&client, &format!("{base}/locks/bench?ttl=10s"), CALL_LIMIT).await;
        let token = g["token"].as_str().expect("granted");
        let r = delete(&client, &format!("{base}/locks/bench?token={token}")).await;
        assert!(r.is_success());
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let rate = rounds as f64 / t0.elapsed().as_secs_f64();
    (percentile(&lat, 0.5), percentile(&lat, 0.99), rate)
}

/// Contended: 20 clients x `each` rounds on one lock. Returns acquisitions/s.
async fn contended(port: u16, each: usize) -> f64 {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(tokio::spawn(async move {
            let client = client();
            let base = format!("http://127.0.0.1:{port}");
            // The `wait` plus the usual limit.
            let limit = Duration::from_secs(60) + CALL_LIMIT;
            for _ in 0..each {
                let g = post_json(
                    &client,
                    &format!("{base}/locks/hot?ttl=10s&wait=60s"),
                    limit,
                )
                .await;
                let token = g["token"].as_str().expect("granted").to_owned();
                delete(&client, &format!("{base}/locks/hot?token={token}")).await;
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
    let client = client();
    let base = format!("http://127.0.0.1:{port}");
    let g = post_json(&client, &format!("{base}/locks/rest?ttl=120s"), CALL_LIMIT).await;
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
            // Aborted once measured; the limit only bounds a forgotten task.
            let limit = Duration::from_secs(300) + CALL_LIMIT;
            let _ = client.post(url).timeout(limit).send().await;
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

/// etcd's count of requests received, from its /metrics: every unary call
/// and every message on a stream (a lease keep-alive, a watch request), so
/// keep-alives on a stream opened earlier count too.
/// etcd's gRPC messages received so far, every method.
async fn etcd_requests(etcd: &Etcd) -> f64 {
    etcd_messages(etcd.port()).await.values().sum()
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
    let window = Duration::from_secs(10);
    let (idle, per) = at_rest(pe, waiters, window, || etcd_requests(&etcd)).await;
    println!(
        "{waiters} clients waiting on a held lock: etcd {per:.3} requests/s per waiting client (at rest with nobody waiting: {idle:.1}/s)"
    );
}

/// The Lease backend on the Kubernetes API stand-in: the table's row, and
/// the API requests of waiting clients at rest.
async fn kubernetes(rounds: usize, each: usize, waiters: usize) {
    let api = support::kube_api::KubeApi::start("bench");
    let ep = api.endpoint("bench").await;
    let mut args: Vec<String> = vec!["--backend".into(), "kubernetes".into()];
    args.extend(
        CONTROL
            .iter()
            .chain(&["--log-level", "warn"])
            .map(|s| s.to_string()),
    );
    let kubeconfig = ep.kubeconfig().to_string_lossy().into_owned();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let s = Sidecar::start_env(&election("coord-bench"), "bench", &args, &env);
    let port = s.control();
    let (p50, p99, rate) = uncontended(port, rounds).await;
    let hot = contended(port, each).await;
    println!("| kubernetes (API stand-in) | {p50:.2} ms | {p99:.2} ms | {rate:.0} | {hot:.0} |");
    let count = || {
        let ep = ep.clone();
        async move { ep.total() as f64 }
    };
    let (idle, per) = at_rest(port, waiters, Duration::from_secs(10), count).await;
    println!(
        "\n{waiters} clients waiting on a held lock: Kubernetes API {per:.3} requests/s per waiting client (at rest with nobody waiting: {idle:.1}/s)"
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
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "kubernetes") {
        return kubernetes(rounds, each, waiters).await;
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
    kubernetes(rounds, each, waiters).await;
    let window = Duration::from_secs(10);
    let (idle, per) = at_rest(pe, waiters, window, || etcd_requests(&etcd)).await;
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
