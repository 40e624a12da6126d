//! Memory of the sidecar under 5,000 open long-polls: RSS of the
//! real binary (read from /proc/PID/status) at idle, while the long-polls
//! are open, and after they close. Loopback only, bounded.
//!
//! Run: `MIMALLOC_PURGE_DELAY=0 MIMALLOC_ARENA_EAGER_COMMIT=0 cargo bench
//! --bench longpoll_memory` (the image sets both; the sidecar inherits them) with BENCH_CONNECTIONS
//! (default 5000) and BENCH_MAX_CONNECTIONS (default the sidecar's own).
//! `cargo test --bench longpoll_memory -- --bench` measures the debug build.
//! Under `cargo test --all-targets` it only says it was skipped.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::procfs::{open_fds, rss_kib};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Open `n` long-polls; returns the open streams and how many were answered
/// at once (503 beyond the cap) or closed.
async fn open_polls(port: u16, n: usize, index: u64) -> (Vec<TcpStream>, usize) {
    let req = format!("GET /leader?index={index}&wait=120s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut open = Vec::with_capacity(n);
    let mut refused = 0;
    for _ in 0..n {
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(mut s) => {
                if s.write_all(req.as_bytes()).await.is_ok() {
                    open.push(s);
                } else {
                    refused += 1;
                }
            }
            Err(_) => refused += 1,
        }
    }
    // Streams that already got an answer (503) or were closed are not held.
    let mut held = Vec::with_capacity(open.len());
    for mut s in open {
        let mut b = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(1), s.read(&mut b)).await {
            Err(_) => held.push(s),
            Ok(_) => refused += 1,
        }
    }
    (held, refused)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("long-poll memory benchmark: skipped (cargo bench --bench longpoll_memory)");
        return;
    }
    let n: usize = std::env::var("BENCH_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let redis = RedisServer::start().await;
    let mut args = vec!["--redis-url".to_owned(), redis.url.clone()];
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(["--log-level".into(), "warn".into()]);
    if let Ok(cap) = std::env::var("BENCH_MAX_CONNECTIONS") {
        args.extend(["--max-connections".into(), cap]);
    }
    let sidecar = Sidecar::start_raw(&election("longpoll-mem"), "bench", &args);
    let port = sidecar.port;
    wait_for(Duration::from_secs(20), "the sidecar to lead", || async {
        sidecar.is_leader().await
    })
    .await;
    let (_, body) = sidecar.leader().await.expect("a /leader answer");
    let index = body["transitions"].as_u64().unwrap();
    // Warm up the allocator and the runtime with a few ordinary requests.
    for _ in 0..100 {
        http_get(port, "/leader").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = sidecar.pid();
    let idle = rss_kib(pid);
    println!("## Long-poll memory: {n} open /leader long-polls (loopback)\n");
    println!(
        "| round | held | refused/503 | RSS before | RSS during | fds during | RSS 1 s after close | fds 1 s after | RSS 5 s after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for round in 1..=3 {
        let before = rss_kib(pid);
        let (held, refused) = open_polls(port, n, index).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let during = rss_kib(pid);
        let fds_during = open_fds(pid);
        let held_n = held.len();
        drop(held);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after1 = rss_kib(pid);
        let fds_after = open_fds(pid);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let after5 = rss_kib(pid);
        println!(
            "| {round} | {held_n} | {refused} | {} | {} | {fds_during} | {} | {fds_after} | {} |",
            mib(before),
            mib(during),
            mib(after1),
            mib(after5)
        );
    }
    let last = rss_kib(pid);
    println!(
        "\nidle before any long-poll: {}; after three rounds: {} (+{})",
        mib(idle),
        mib(last),
        mib(last.saturating_sub(idle))
    );
    assert!(
        sidecar.is_leader().await,
        "the sidecar still answers /leader after the load"
    );
}
