//! Side-by-side benchmark of leader-elector and the tools users would pick
//! instead: `etcdctl elect` on etcd, a seed-style Redis polling loop
//! (`bench/seed_loop.py`) and redis-py's `Lock` (`bench/redispy_lock.py`) on
//! Redis. Three candidates and TTL 5 s unless a section says otherwise.
//!
//! Sections (each writes `target/compare/<name>.md` and `.json`; at the end
//! every fragment present is assembled into `BENCHMARKS.md`):
//! `handover` (SIGTERM the leader), `failover` (SIGKILL it at a random point of
//! its renew cycle), `rest` (RSS, CPU, backend requests), `wrk` (`/leader`
//! throughput on one pinned core), `scale` (N candidates in one election) and
//! `multi` (many elections of 3 on one etcd).
//!
//! "Knows it leads": for us, the instant a `/leader` long-poll of another
//! candidate answers 200; for the peers, the instant their stdout line
//! (`LEADER …`, or etcdctl's first output line) is read.
//!
//! Run it with `scripts/bench-all` (installs the peers, then
//! `cargo bench --bench compare`). Under `cargo test` it does nothing.
//! Environment (defaults in brackets): `COMPARE_SECTIONS` [all],
//! `COMPARE_TRIALS` [20], `COMPARE_ETCDCTL_CRASH_TRIALS` [2],
//! `COMPARE_REST_SECS` [60], `COMPARE_ALONE_SECS` [30],
//! `COMPARE_SCALE` [3,10,50,200], `COMPARE_SCALE_REST_SECS` [20],
//! `COMPARE_SCALE_TRIALS` [3], `COMPARE_ELECTIONS` [500], `COMPARE_WRK_SECS`
//! [10], `COMPARE_MAX_LOAD` [1.5], `COMPARE_PYTHON`
//! [target/bench-venv/bin/python], `COMPARE_OUT` [BENCHMARKS.md].

#[path = "../../tests/support/mod.rs"]
mod support;

mod election;
mod fmt;
mod group;
mod machine;
mod rest;
mod scale;
mod server;
mod summary;
mod tools;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use support::procfs::{cpu_seconds, loadavg, pss_kib, rss_kib};
use support::{Sidecar, env_or, http_get, redis_sidecar, require};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout, timeout_at};

use election::*;
use fmt::*;
use group::*;
use machine::*;
use rest::*;
use scale::*;
use server::*;
use summary::*;
use tools::*;

// ---------------------------------------------------------------- config

struct Cfg {
    ttl: Duration,
    trials: usize,
    etcdctl_crash_trials: usize,
    rest_secs: u64,
    alone_secs: u64,
    scale: Vec<usize>,
    scale_rest_secs: u64,
    scale_trials: usize,
    elections: usize,
    wrk_secs: u64,
    max_load: f64,
    python: PathBuf,
    frag_dir: PathBuf,
    out: PathBuf,
}

impl Cfg {
    fn from_env() -> Cfg {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let scale = std::env::var("COMPARE_SCALE")
            .unwrap_or_else(|_| "3,10,50,200".into())
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        Cfg {
            ttl: Duration::from_secs(5),
            trials: env_or("COMPARE_TRIALS", 20),
            etcdctl_crash_trials: env_or("COMPARE_ETCDCTL_CRASH_TRIALS", 2),
            rest_secs: env_or("COMPARE_REST_SECS", 60),
            alone_secs: env_or("COMPARE_ALONE_SECS", 30),
            scale,
            scale_rest_secs: env_or("COMPARE_SCALE_REST_SECS", 20),
            scale_trials: env_or("COMPARE_SCALE_TRIALS", 3),
            elections: env_or("COMPARE_ELECTIONS", 500),
            wrk_secs: env_or("COMPARE_WRK_SECS", 10),
            max_load: env_or("COMPARE_MAX_LOAD", 1.5),
            python: std::env::var_os("COMPARE_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target/bench-venv/bin/python")),
            frag_dir: root.join("target/compare"),
            out: std::env::var_os("COMPARE_OUT")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("BENCHMARKS.md")),
        }
    }
}

/// Run order: the headline sections first, while the machine is quiet.
const ORDER: [&str; 6] = ["handover", "failover", "rest", "wrk", "multi", "scale"];
/// Order in BENCHMARKS.md: the numbering. `kubernetes` is written
/// by `benches/kubernetes.rs` (scripts/bench-all runs it first), never run here.
const DOC_ORDER: [&str; 7] = [
    "handover",
    "failover",
    "rest",
    "scale",
    "multi",
    "wrk",
    "kubernetes",
];

fn assemble(cfg: &Cfg, ran: &[String]) {
    let mut json = BTreeMap::new();
    let mut body = String::new();
    for name in DOC_ORDER {
        let md = cfg.frag_dir.join(format!("{name}.md"));
        let js = cfg.frag_dir.join(format!("{name}.json"));
        if let (Ok(m), Ok(j)) = (std::fs::read_to_string(md), std::fs::read_to_string(js)) {
            body.push_str(&m);
            body.push('\n');
            let v = serde_json::from_str::<Value>(&j).unwrap_or(Value::Null);
            json.insert(format!("{name}_load"), v["load_start"].clone());
            json.insert(name.to_owned(), v["data"].clone());
        }
    }
    let mut out = header(cfg);
    out.push('\n');
    out.push_str(&summary(&json, cfg));
    out.push('\n');
    out.push_str(&body);
    // The run record: the wall time of the last full run, then any sections
    // re-run on their own since.
    let run_md = cfg.frag_dir.join("run.md");
    let partial = std::env::var("COMPARE_SECTIONS").is_ok();
    let mut run = std::fs::read_to_string(&run_md).unwrap_or_default();
    if let Ok(started) = std::env::var("COMPARE_STARTED_AT")
        && let Ok(s) = started.parse::<u64>()
        && !ran.is_empty()
    {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mins = now.saturating_sub(s) as f64 / 60.0;
        if partial {
            let _ = writeln!(
                run,
                "- Re-run on their own afterwards with `COMPARE_SECTIONS={} scripts/bench-all`: {mins:.1} min.",
                ran.join(",")
            );
        } else {
            run = format!(
                "Wall time of the full `scripts/bench-all` run, installs, build, waits for a quiet machine and re-runs included: {mins:.1} min.\n\n"
            );
        }
        std::fs::write(&run_md, &run).unwrap();
    }
    if !run.is_empty() {
        let _ = write!(out, "## Run\n\n{run}");
    }
    // The sections other benches write (`scripts/bench-coord`, the
    // Kubernetes bench) are carried over as they are.
    let old = std::fs::read_to_string(&cfg.out).unwrap_or_default();
    for block in support::bench_md::blocks(&old) {
        out.push('\n');
        out.push_str(&block);
    }
    std::fs::write(&cfg.out, out).expect("write BENCHMARKS.md");
    eprintln!("wrote {}", cfg.out.display());
}

async fn run(name: &str, cfg: &Cfg) -> Section {
    match name {
        "handover" => sec_handover(cfg).await,
        "failover" => sec_failover(cfg).await,
        "rest" => sec_rest(cfg).await,
        "wrk" => sec_wrk(cfg).await,
        "scale" => sec_scale(cfg).await,
        "multi" => sec_multi(cfg).await,
        other => panic!("unknown section {other} (known: {ORDER:?})"),
    }
}

/// Wait (up to 3 min) until the 1-minute load average is under `max`.
async fn wait_quiet(max: f64) {
    let end = Instant::now() + Duration::from_secs(180);
    while loadavg() > max && Instant::now() < end {
        sleep(Duration::from_secs(5)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("compare benchmark: skipped (run scripts/bench-all)");
        return;
    }
    let cfg = Cfg::from_env();
    assert!(
        cfg.python.exists(),
        "{} is missing: run scripts/bench-all (it makes the venv with redis-py)",
        cfg.python.display()
    );
    require("etcdctl", "etcd-client");
    std::fs::create_dir_all(&cfg.frag_dir).unwrap();
    let sections: Vec<String> = std::env::var("COMPARE_SECTIONS")
        .map(|s| {
            s.split(',')
                .map(|x| x.trim().to_owned())
                .filter(|x| !x.is_empty() && x != "none" && x != "kubernetes")
                .collect()
        })
        .unwrap_or_else(|_| ORDER.iter().map(|s| s.to_string()).collect());
    let headline = ["handover", "failover", "rest", "wrk"];
    for name in &sections {
        let is_headline = headline.contains(&name.as_str());
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Every section starts on a quiet machine (the earlier ones leave
            // load behind); only the headline ones are re-run if it was not.
            wait_quiet(cfg.max_load).await;
            let l0 = loadavg();
            let t0 = Instant::now();
            eprintln!("== section {name} (attempt {attempt}, load {l0:.2})");
            let s = run(name, &cfg).await;
            let l1 = loadavg();
            // wrk loads both cores itself: judge it by the load it started under.
            let worst = if name == "wrk" { l0 } else { l0.max(l1) };
            if is_headline && worst > cfg.max_load && attempt < 2 {
                eprintln!("section {name} ran under load {worst:.2}: re-running");
                continue;
            }
            let mut md = format!("## {}\n\n", s.title);
            let _ = writeln!(
                md,
                "_1-minute load average {l0:.2} at the start, {l1:.2} at the end; {:.0} s{}._\n",
                t0.elapsed().as_secs_f64(),
                if attempt > 1 {
                    format!(
                        "; re-run {} time(s) because the load exceeded {}",
                        attempt - 1,
                        cfg.max_load
                    )
                } else {
                    String::new()
                }
            );
            md.push_str(&s.md);
            std::fs::write(cfg.frag_dir.join(format!("{name}.md")), md).unwrap();
            let j = json!({"load_start": l0, "load_end": l1, "attempts": attempt, "data": s.json});
            std::fs::write(
                cfg.frag_dir.join(format!("{name}.json")),
                serde_json::to_string_pretty(&j).unwrap(),
            )
            .unwrap();
            break;
        }
    }
    assemble(&cfg, &sections);
}
