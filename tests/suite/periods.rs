//! At most once per period, on real etcd and real Redis: `run --every 1s`
//! on three sidecars whose wall clocks are skewed by ±2 s with libfaketime
//! (monotonic clocks untouched), a backend stopped for whole periods, and
//! the HTTP route `POST /jobs/NAME/periods/START/claim`.
//!
//! The number of one-second periods of the skew tests is
//! `LEADER_ELECTOR_TEST_PERIODS` (default 20; the goal of 200 runs with
//! `LEADER_ELECTOR_TEST_PERIODS=200`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::backends::Backend;
use crate::support::*;
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::time::sleep;

/// libfaketime as Debian installs it (`apt-get install faketime`).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn periods_wanted() -> u64 {
    std::env::var("LEADER_ELECTOR_TEST_PERIODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// `run --every 1s` whose command appends "<period start> <identity>" to
/// `file`, under libfaketime with the wall clock moved by `skew` (e.g.
/// `+2s`).
fn skewed(server: &Backend, election: &str, id: &str, skew: &str, file: &Path) -> Sidecar {
    let mut args = server.server_flags();
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(["--every".into(), "1s".into(), "--".into()]);
    args.extend([
        "sh".into(),
        "-c".into(),
        format!(
            "echo \"$LEADER_ELECTOR_PERIOD_START $LEADER_ELECTOR_IDENTITY\" >> {}",
            file.display()
        ),
    ]);
    // Without the library the loader only warns and the clocks stay
    // unskewed: the test would prove nothing, so it fails instead.
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install the Debian package `faketime` (scripts/install-deps does)"
    );
    let env = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", skew),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    // `run` goes right after the binary, which the wrapper gets as "$0".
    let wrapper = ["sh", "-c", "exec \"$0\" run \"$@\""];
    Sidecar::start_wrapped(&wrapper, election, id, &args, &env)
}

/// The runs in `file`: period start (Unix seconds) -> who ran it.
fn runs(file: &Path) -> BTreeMap<u64, Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(start), Some(id)) = (f.next(), f.next()) else {
            panic!("a malformed line: {line:?}");
        };
        let at = humantime::parse_rfc3339(start).expect("an RFC 3339 period start");
        let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs();
        out.entry(secs).or_default().push(id.to_owned());
    }
    out
}

/// Safety: no period ran twice.
fn assert_at_most_once(runs: &BTreeMap<u64, Vec<String>>) {
    for (start, who) in runs {
        assert_eq!(
            who.len(),
            1,
            "period {start} ran {} times: {who:?}",
            who.len()
        );
    }
}

async fn once_per_period_with_skewed_clocks(kind: &str) {
    let server = Backend::start(kind).await;
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("runs");
    let election = election(&format!("periods-skew-{kind}"));
    let skews = ["+2s", "+0s", "-2s"];
    let sidecars: Vec<Sidecar> = skews
        .iter()
        .enumerate()
        .map(|(i, skew)| skewed(&server, &election, &format!("p{i}"), skew, &file))
        .collect();
    // All three are up: every period from 3 s on is claimed by someone.
    let first = now().as_secs() + 3;
    let n = periods_wanted();
    sleep(Duration::from_secs(n + 4)).await;
    drop(sidecars);
    let runs = runs(&file);
    assert_at_most_once(&runs);
    let missing: Vec<u64> = (first..first + n)
        .filter(|p| !runs.contains_key(p))
        .collect();
    assert!(
        missing.is_empty(),
        "periods that did not run: {missing:?} of {first}..{}",
        first + n
    );
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for who in runs.values() {
        *by.entry(who[0].as_str()).or_default() += 1;
    }
    eprintln!(
        "{kind}: {} periods ran once each ({n} checked for liveness); runs by sidecar: {by:?}",
        runs.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_runs_each_period_once_across_skewed_clocks() {
    once_per_period_with_skewed_clocks("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_runs_each_period_once_across_skewed_clocks() {
    once_per_period_with_skewed_clocks("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_runs_each_period_once_across_skewed_clocks() {
    once_per_period_with_skewed_clocks("redlock").await;
}

async fn a_period_without_the_backend_does_not_run(kind: &str) {
    let server = Backend::start(kind).await;
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("runs");
    let election = election(&format!("periods-cut-{kind}"));
    let sidecars: Vec<Sidecar> = (0..3)
        .map(|i| skewed(&server, &election, &format!("c{i}"), "+0s", &file))
        .collect();
    sleep(Duration::from_secs(3)).await;
    // Cut 0.3 s into a period, for 2.4 s: at least one whole period.
    let t = now();
    sleep(Duration::from_nanos(
        1_300_000_000 - u64::from(t.subsec_nanos()),
    ))
    .await;
    let cut_from = now().as_secs_f64();
    server.signal(Signal::SIGSTOP);
    sleep(Duration::from_millis(2400)).await;
    let cut_to = now().as_secs_f64();
    server.signal(Signal::SIGCONT);
    sleep(Duration::from_secs(5)).await;
    drop(sidecars);
    let runs = runs(&file);
    assert_at_most_once(&runs);
    let inside: Vec<u64> = (cut_from.ceil() as u64..)
        .take_while(|p| (*p + 1) as f64 <= cut_to)
        .collect();
    assert!(!inside.is_empty(), "the cut covers a whole period");
    for p in &inside {
        assert!(
            !runs.contains_key(p),
            "period {p} ran while the backend was stopped ({cut_from}..{cut_to}): {runs:?}"
        );
    }
    // Liveness twin: the first period starting after the backend is back
    // (with 1 s for the sidecars to reconnect) runs.
    let next = cut_to.ceil() as u64 + 1;
    assert!(
        runs.contains_key(&next),
        "period {next} after the cut ({cut_from}..{cut_to}) did not run: {runs:?}"
    );
    assert!(
        runs.contains_key(&(cut_from as u64 - 1)),
        "a period before the cut ran: {runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_period_without_the_backend_does_not_run_and_the_next_does() {
    a_period_without_the_backend_does_not_run("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_period_without_the_backend_does_not_run_and_the_next_does() {
    a_period_without_the_backend_does_not_run("redis").await;
}

async fn call(port: u16, path: &str, body: Option<&str>) -> (u16, Value) {
    http_json(port, "POST", path, body, Duration::from_secs(30))
        .await
        .expect("the control API answers")
}

fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

async fn the_period_route(kind: &str) {
    let server = Backend::start(kind).await;
    let mut args = server.server_flags();
    args.extend(FAST.iter().chain(CONTROL).map(|s| s.to_string()));
    let s = Sidecar::start_raw(&election(&format!("periods-http-{kind}")), "me", &args);
    let port = s.control();
    // Periods of 4 s: the current one stays claimable for the test's steps,
    // and the next one is near enough (within the 5 s skew margin).
    let start = now().as_secs() / 4 * 4;
    let at = |secs: u64, q: &str| format!("/jobs/nightly/periods/{}/claim?{q}", rfc3339(secs));
    let (st, v) = call(port, &at(start, ""), None).await;
    assert_eq!(
        (st, v["error"].as_str().unwrap().contains("every")),
        (400, true),
        "{v}"
    );
    let (st, v) = call(port, &at(start, "every=soon"), None).await;
    assert_eq!(
        (st, v["error"].as_str().unwrap().contains("every")),
        (400, true),
        "{v}"
    );
    let (st, v) = call(port, &at(start + 1, "every=4s"), None).await;
    assert_eq!(
        (st, v["error"].as_str().unwrap().contains("period start")),
        (400, true),
        "{v}"
    );
    let (st, v) = call(port, "/jobs/nightly/periods/tomorrow/claim?every=4s", None).await;
    assert_eq!(
        (st, v["error"].as_str().unwrap().contains("RFC 3339")),
        (400, true),
        "{v}"
    );
    let (st, grant) = call(port, &at(start, "every=4s"), None).await;
    assert_eq!(st, 200, "{grant}");
    assert!(
        grant["ttl_ms"].as_u64().unwrap() >= 5000,
        "until the end plus the margin: {grant}"
    );
    let (st, v) = call(port, &at(start, "every=4s"), None).await;
    assert_eq!((st, v["state"].as_str()), (409, Some("claimed")), "{v}");
    let done = format!("/jobs/nightly/periods/{}/complete?every=4s", rfc3339(start));
    let token = format!("{{\"token\":\"{}\"}}", grant["token"].as_str().unwrap());
    let (st, v) = call(port, &done, Some(&token)).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(port, &at(start, "every=4s"), None).await;
    assert_eq!((st, v["state"].as_str()), (409, Some("completed")), "{v}");
    let (st, v) = call(port, &at(start + 4, "every=4s"), None).await;
    assert_eq!(st, 200, "the next period: {v}");
    let (st, v) = call(port, &at(start - 3600, "every=4s"), None).await;
    assert_eq!((st, v["state"].as_str()), (409, Some("ended")), "{v}");
    let (st, v) = call(port, &at(start + 3600, "every=4s"), None).await;
    assert_eq!((st, v["state"].as_str()), (409, Some("not_started")), "{v}");
    // An ordinary queue of the same name is another queue.
    let (st, v) = call(port, &format!("/jobs/nightly/{start}/claim"), None).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn etcd_the_period_route_answers_like_a_job_claim() {
    the_period_route("etcd").await;
}

#[tokio::test]
async fn redis_the_period_route_answers_like_a_job_claim() {
    the_period_route("redis").await;
}

#[tokio::test]
async fn redlock_the_period_route_answers_like_a_job_claim() {
    the_period_route("redlock").await;
}

/// A command that outlives its period keeps its claim by renewing it
/// (liveness: it runs past the claim's first deadline, the period's end
/// plus the 5 s margin); once renewals fail (the Redis server frozen with
/// SIGSTOP), it is gone by the last renewal's deadline (safety: the send
/// of the last renewal before the freeze plus the claim's TTL, at most
/// 6 s), never later.
#[tokio::test]
async fn a_long_run_keeps_its_claim_by_renewing_and_stops_when_it_cannot() {
    let server = Backend::start("redis").await;
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("runs");
    let mut args = server.server_flags();
    args.extend(FAST.iter().map(|s| s.to_string()));
    let script = format!(
        "while :; do echo \"$LEADER_ELECTOR_PERIOD_START $(date +%s%N)\" >> {}; sleep 0.1; done",
        file.display()
    );
    args.extend(["--every", "1s", "--", "sh", "-c", &script].map(String::from));
    let s = Sidecar::start_run(&election("periods-deadline"), "slow", &args);
    sleep(Duration::from_secs(9)).await;
    let frozen_at = now().as_nanos();
    server.signal(Signal::SIGSTOP);
    sleep(Duration::from_secs(8)).await;
    server.signal(Signal::SIGCONT);
    drop(s);
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    // Period start -> (first beat, last beat), in ns.
    let mut beats: BTreeMap<u64, (u128, u128)> = BTreeMap::new();
    for line in text.lines() {
        let (start, ns) = line.split_once(' ').expect("two fields");
        let p = humantime::parse_rfc3339(start).unwrap();
        let p = p.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let ns: u128 = ns.parse().unwrap();
        let e = beats.entry(p).or_insert((ns, ns));
        e.1 = e.1.max(ns);
    }
    let (&period, &(_, last)) = beats.iter().next().expect("a run");
    let first_deadline = Duration::from_secs(period + 6).as_nanos();
    assert!(
        last > first_deadline,
        "the run did not keep its claim past its first deadline: {last} <= {first_deadline}"
    );
    let bound = frozen_at + Duration::from_millis(6500).as_nanos();
    assert!(
        last < bound,
        "beats {} ms after the backend froze (claim TTL at most 6 s)",
        (last - frozen_at) / 1_000_000
    );
    assert_eq!(beats.len(), 1, "one run at a time: {beats:?}");
}
