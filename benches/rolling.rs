//! Benchmark of a rolling update on the Kubernetes Lease stand-in
//! (tests/support/kube_api/): N replicas replaced one by one (start a
//! new-revision replica, let it turn ready, SIGTERM the oldest old one),
//! with revisions (`--revision`, as the chart passes the Pod template hash)
//! and without, in one run. Prints, per trial and mode, the leader changes
//! and the leaderless time (summed, and the longest gap) measured by the
//! overlap checker's recorder, which also proves no overlap; writes the
//! figures into BENCHMARKS.md between `<!-- rolling:begin -->` and
//! `<!-- rolling:end -->`.
//!
//! `cargo bench --bench rolling`; under `cargo test` it does nothing.
//! Environment: `RBENCH_TRIALS` [3], `RBENCH_REPLICAS` [3]. Sidecars run
//! with the test timing (lease 2 s, renew 500 ms): a new replica is
//! listed by the leader within one lease duration (the Lease backend has
//! no registry watch), so each step waits 2.5 s before its SIGTERM.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::env_or;
use support::fleet::{FLEET_LEASE, Fleet, Rolled, rolling_update};

/// One mode's trials as a table row.
fn row(mode: &str, trials: &[Rolled]) -> String {
    let changes: Vec<String> = trials.iter().map(|r| r.changes.to_string()).collect();
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    let leaderless: Vec<String> = trials.iter().map(|r| ms(r.leaderless)).collect();
    let longest = trials
        .iter()
        .map(|r| r.longest_gap)
        .max()
        .unwrap_or_default();
    let problems: usize = trials.iter().map(|r| r.problems.len()).sum();
    format!(
        "| {mode} | {} | {} | {} | {problems} |",
        changes.join(", "),
        leaderless.join(", "),
        ms(longest)
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let trials: usize = env_or("RBENCH_TRIALS", 3);
    let replicas: usize = env_or("RBENCH_REPLICAS", 3);
    let settle = FLEET_LEASE + Duration::from_millis(500);
    let mut on = Vec::new();
    let mut off = Vec::new();
    for t in 0..trials {
        for (revisions, out) in [(true, &mut on), (false, &mut off)] {
            let mut fleet = Fleet::kubernetes(&format!("rbench-{revisions}-{t}")).await;
            let r = rolling_update(&mut fleet, replicas, revisions, settle).await;
            println!("trial {t}, revisions {revisions}: {r:?}");
            out.push(r);
        }
    }
    let md = format!(
        "### Rolling update (Kubernetes Lease stand-in)\n\n\
         {replicas} replicas replaced one by one ({trials} trials; lease 2 s; each new replica \
         gets {settle:?} to turn ready before the oldest old one gets SIGTERM). Leader changes \
         and leaderless time from the first leader on, per trial, by the overlap checker's \
         recorder (polling every 4 ms: a gap includes up to one poll round trip); overlaps \
         and other problems must be 0.\n\n\
         | revisions | leader changes | leaderless ms (sum) | longest gap ms | problems |\n\
         |---|---|---|---|---|\n{}\n{}\n",
        row("on (`--revision`)", &on),
        row("off (no revision)", &off)
    );
    println!("{md}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md");
    support::bench_md::replace_block(&path, "rolling", &md);
    eprintln!("wrote the rolling update section of {}", path.display());
}
