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
    let (p50, p99, rate, _) = uncontended_phases(port, rounds).await;
    (p50, p99, rate)
}

/// [`uncontended`], with the p50 of the acquisition and of the release
/// apart (ms).
async fn uncontended_phases(port: u16, rounds: usize) -> (f64, f64, f64, (f64, f64)) {
    let client = client();
    let base = format!("http://127.0.0.1:{port}");
    let mut lat = Vec::with_capacity(rounds);
    let (mut acq, mut rel) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    let t0 = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let g = post_json(&client, &format!("{base}/locks/bench?ttl=10s"), CALL_LIMIT).await;
        let token = g["token"].as_str().expect("granted");
        let mid = Instant::now();
        let r = delete(&client, &format!("{base}/locks/bench?token={token}")).await;
        assert!(r.is_success());
        acq.push((mid - t).as_secs_f64() * 1000.0);
        rel.push(mid.elapsed().as_secs_f64() * 1000.0);
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let rate = rounds as f64 / t0.elapsed().as_secs_f64();
    let phases = (percentile(&acq, 0.5), percentile(&rel, 0.5));
    (percentile(&lat, 0.5), percentile(&lat, 0.99), rate, phases)
}

/// The HTTP hop alone: p50 (ms) of a request the sidecar refuses before
/// any backend call (a bad `ttl`), through the same client and router.
async fn http_hop(port: u16, rounds: usize) -> f64 {
    let client = client();
    let url = format!("http://127.0.0.1:{port}/locks/bench?ttl=0s");
    let mut lat = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = client.post(&url).send().await.expect("refused request");
        assert_eq!(r.status(), reqwest::StatusCode::BAD_REQUEST);
        r.bytes().await.expect("its body");
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    percentile(&lat, 0.5)
}

/// The ratio to etcd's Mutex protocol (`mutex` rounds/s) of a sidecar that
/// added nothing to its two etcd calls per round but one HTTP hop each
/// (`hop` ms): what no sidecar reached over HTTP can beat.
fn hop_ceiling(mutex: f64, hop: f64) -> f64 {
    1.0 / (1.0 + 2.0 * hop / 1000.0 * mutex)
}

/// A bare etcd transaction round trip, as the lock's acquisition makes it
/// (a compare on a prefix's create revision, then a put; a Raft write),
/// `rounds` times from one etcd-client connection; each round also deletes
/// the key (untimed) so the compare succeeds again. Returns p50 ms.
async fn bare_txn(url: &str, rounds: usize) -> f64 {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let mut c = etcd_client::Client::connect([url], None)
        .await
        .expect("etcd");
    let mut lat = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let txn = Txn::new()
            .when([Compare::create_revision("bare/", CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put("bare/k", "v", None)]);
        let t = Instant::now();
        c.txn(txn).await.expect("txn");
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        c.delete("bare/k", None).await.expect("delete");
    }
    percentile(&lat, 0.5)
}

/// etcd's own `concurrency.Mutex` (Go, `client/v3/concurrency`), its
/// protocol replayed from one etcd-client connection, `rounds` uncontended
/// rounds: a session lease granted once (60 s, kept alive by its own
/// stream, as `concurrency.NewSession` does), then per round `Lock` (one
/// transaction: if the session's key `<prefix><lease hex>` is absent put it
/// under the session lease and read the prefix's first creator, else read
/// both) and `Unlock` (one delete). Returns rounds/s.
async fn etcd_mutex_rounds(url: &str, rounds: usize) -> f64 {
    use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget};
    use etcd_client::{Txn, TxnOp};
    let mut c = etcd_client::Client::connect([url], None)
        .await
        .expect("etcd");
    let lease = c.lease_grant(60, None).await.expect("session lease").id();
    let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.expect("keep-alive");
    let session = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(20)).await;
            let _ = keeper.keep_alive().await;
            let _ = stream.message().await;
        }
    });
    let pfx = "mutex-bench/";
    let my_key = format!("{pfx}{lease:x}");
    let first_create = || {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
    };
    let t0 = Instant::now();
    for _ in 0..rounds {
        let txn = Txn::new()
            .when([Compare::create_revision(
                my_key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    my_key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(pfx, Some(first_create())),
            ])
            .or_else([
                TxnOp::get(my_key.as_str(), None),
                TxnOp::get(pfx, Some(first_create())),
            ]);
        let resp = c.txn(txn).await.expect("Lock");
        assert!(resp.succeeded(), "the uncontended Mutex key was taken");
        c.delete(my_key.as_str(), None).await.expect("Unlock");
    }
    let rate = rounds as f64 / t0.elapsed().as_secs_f64();
    session.abort();
    let _ = c.lease_revoke(lease).await;
    rate
}

/// The etcd messages of each method one uncontended round (acquire +
/// release of a free lock, its lease kept from the round before) makes,
/// from etcd's own counters over `rounds` rounds.
async fn etcd_messages_per_round(etcd: &Etcd, port: u16, rounds: usize) -> String {
    let before = etcd_messages(etcd.port()).await;
    uncontended(port, rounds).await;
    let after = etcd_messages(etcd.port()).await;
    let per: Vec<String> = after
        .iter()
        .filter_map(|(m, v)| {
            let d = (v - before.get(m).copied().unwrap_or(0.0)) / rounds as f64;
            (d >= 0.05).then(|| format!("{m} {d:.2}"))
        })
        .collect();
    per.join(", ")
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
    let (p50, p99, rate, (acq, rel)) = uncontended_phases(pe, knob("BENCH_ROUNDS", 1000)).await;
    let bare = bare_txn(&etcd.url, 1000).await;
    let mutex = etcd_mutex_rounds(&etcd.url, knob("BENCH_ROUNDS", 1000)).await;
    let per = etcd_messages_per_round(&etcd, pe, 200).await;
    let hop = http_hop(pe, 1000).await;
    println!(
        "etcd uncontended: p50 {p50:.2} ms (acquire {acq:.2}, release {rel:.2}; an HTTP hop alone {hop:.2}), p99 {p99:.2} ms, {rate:.0} rounds/s = {:.2}x etcd's concurrency.Mutex protocol ({mutex:.0} rounds/s, same etcd; the Mutex's calls plus one HTTP hop each: {:.2}x); {:.2}x a bare etcd transaction (p50 {bare:.2} ms); etcd messages per round: {per}",
        rate / mutex,
        hop_ceiling(mutex, hop),
        p50 / bare
    );
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
async fn kubernetes(rounds: usize, each: usize, waiters: usize) -> (String, String) {
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
    let row = format!(
        "| sidecar on a Kubernetes Lease (API stand-in) | {p50:.2} ms | {p99:.2} ms | {rate:.0} | {hot:.0} |\n"
    );
    let count = || {
        let ep = ep.clone();
        async move { ep.total() as f64 }
    };
    let (idle, per) = at_rest(port, waiters, Duration::from_secs(10), count).await;
    let rest = format!(
        "\n{waiters} clients waiting on a held lock: Kubernetes API {per:.3} requests/s per waiting client (at rest with nobody waiting: {idle:.1}/s).\n"
    );
    (row, rest)
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
        let (row, rest) = kubernetes(rounds, each, waiters).await;
        println!("{row}{rest}");
        return;
    }
    let md = full_run(rounds, each, waiters).await;
    println!("{md}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md");
    support::bench_md::replace_block(&path, "coord", &md);
    eprintln!("wrote the coordination section of {}", path.display());
}

/// The whole coordination section: the table (etcd and Redis through the
/// sidecar, redis-py's `Lock` directly), the ratio to a bare etcd
/// transaction and the etcd messages per round, and the requests of
/// waiting clients at rest; all measured in this one run.
async fn full_run(rounds: usize, each: usize, waiters: usize) -> String {
    let etcd = Etcd::start().await;
    let redis = RedisServer::start().await;
    let (_se, pe) = start_sidecar(vec!["--etcd-endpoints".into(), etcd.url.clone()]).await;
    let (_sr, pr) = start_sidecar(vec!["--redis-url".into(), redis.url.clone()]).await;
    let mut md = String::from(
        "## Coordination API: lock acquire + release (loopback, HTTP keep-alive)\n\n\
         Generated by `scripts/bench-coord` (`benches/coord.rs`): one run, fresh etcd and Redis.\n\n\
         | client | uncontended p50 | p99 | uncontended rounds/s | contended (20 clients) acquisitions/s |\n|---|---|---|---|---|\n",
    );
    let (mut etcd_p50, mut etcd_rate, mut phases) = (0.0, 0.0, (0.0, 0.0));
    for (name, port) in [("sidecar on etcd", pe), ("sidecar on Redis", pr)] {
        let (p50, p99, rate, split) = uncontended_phases(port, rounds).await;
        let hot = contended(port, each).await;
        md += &format!("| {name} | {p50:.2} ms | {p99:.2} ms | {rate:.0} | {hot:.0} |\n");
        if name.ends_with("etcd") {
            (etcd_p50, etcd_rate, phases) = (p50, rate, split);
        }
    }
    let (kube_row, kube_rest) = kubernetes(rounds, each, waiters).await;
    md += &kube_row;
    md += &redispy_row(&redis.url, rounds);
    let bare = bare_txn(&etcd.url, rounds).await;
    let mutex = etcd_mutex_rounds(&etcd.url, rounds).await;
    let hop = http_hop(pe, rounds).await;
    md += &format!(
        "| etcd's `concurrency.Mutex` protocol directly (no sidecar; one session lease, Lock = one transaction, Unlock = one delete) | — | — | {mutex:.0} | — |\n\nUncontended rounds through the sidecar on etcd ÷ etcd's `concurrency.Mutex` protocol on the same etcd: **{:.2}x**. A sidecar that added nothing to the Mutex's two etcd calls but one HTTP hop each (p50 {hop:.2} ms, a request refused before any backend call, same run) would reach {:.2}x.\n",
        etcd_rate / mutex,
        hop_ceiling(mutex, hop)
    );
    let per = etcd_messages_per_round(&etcd, pe, rounds.min(200)).await;
    md += &format!(
        "\nUncontended acquire + release through the sidecar on etcd: p50 {etcd_p50:.2} ms (acquire {:.2} ms, release {:.2} ms) = **{:.2}x** a bare etcd transaction round trip (a compare-and-put from one etcd-client connection, p50 {bare:.2} ms; same etcd, same run). etcd messages per round: {per}.\n",
        phases.0,
        phases.1,
        etcd_p50 / bare
    );
    let window = Duration::from_secs(10);
    let (idle, per) = at_rest(pe, waiters, window, || etcd_requests(&etcd)).await;
    md += &format!(
        "\n{waiters} clients waiting on a held lock: etcd {per:.3} requests/s per waiting client (at rest with nobody waiting: {idle:.1}/s); "
    );
    let (idle, per) = at_rest(pr, waiters, window, || redis_commands(&redis)).await;
    md += &format!(
        "Redis {per:.3} commands/s per waiting client (at rest with nobody waiting: {idle:.1}/s).\n"
    );
    md += &kube_rest;
    md
}

/// redis-py's `Lock`, the same uncontended loop directly against the same
/// Redis: a table row, or a line saying why there is none.
fn redispy_row(url: &str, rounds: usize) -> String {
    let py = std::process::Command::new("python3")
        .arg("bench/redispy_lock_loop.py")
        .arg(url)
        .arg(rounds.to_string())
        .output();
    match py {
        Ok(o) if o.status.success() => format!(
            "| redis-py `Lock` directly (no sidecar) | {} |\n",
            String::from_utf8_lossy(&o.stdout).trim()
        ),
        Ok(o) => format!(
            "\nredis-py comparison failed: {}\n",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("\nredis-py comparison not run: {e}\n"),
    }
}
