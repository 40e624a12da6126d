//! Cooperation with the workload, against a real etcd and real child
//! processes: run mode, drain before release, resign with cooldown,
//! health-gated candidacy and notifications.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep};

/// A child that appends "<identity> <fencing token> <unix ns>" to `file`
/// every 10 ms while it lives. With `ignore_term` it ignores SIGTERM.
fn beating_child(file: &std::path::Path, ignore_term: bool) -> Vec<String> {
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "{trap}while :; do echo \"$LEADER_ELECTOR_IDENTITY $LEADER_ELECTOR_FENCING_TOKEN $(date +%s%N)\" >> {}; sleep 0.01; done",
            file.display()
        ),
    ]
}

/// Child runs from the beat file: (identity, token) -> (first ns, last ns).
fn runs(file: &std::path::Path) -> BTreeMap<(String, u64), (u128, u128)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut out: BTreeMap<(String, u64), (u128, u128)> = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(id), Some(tok), Some(ns)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Ok(tok), Ok(ns)) = (tok.parse::<u64>(), ns.parse::<u128>()) else {
            continue;
        };
        let e = out.entry((id.to_owned(), tok)).or_insert((ns, ns));
        e.0 = e.0.min(ns);
        e.1 = e.1.max(ns);
    }
    out
}

/// No two child runs overlap: every beat of one precedes every beat of the other.
fn assert_no_overlap(file: &std::path::Path) -> usize {
    let r: Vec<_> = runs(file).into_iter().collect();
    for (i, (a, (a0, a1))) in r.iter().enumerate() {
        for (b, (b0, b1)) in r.iter().skip(i + 1) {
            assert!(
                a1 < b0 || b1 < a0,
                "child runs overlap: {a:?} [{a0}, {a1}] and {b:?} [{b0}, {b1}]"
            );
        }
    }
    r.len()
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn run_sidecar(
    etcd: &str,
    election: &str,
    id: &str,
    extra: &[&str],
    command: &[String],
) -> Sidecar {
    let mut args: Vec<String> = vec!["--etcd-endpoints".into(), etcd.into()];
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(command.iter().cloned());
    Sidecar::start_run(election, id, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_mode_children_never_overlap_across_sigterm_sigkill_and_a_cut() {
    let mut etcd = Etcd::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let beats = dir.path().join("beats");
    let cmd = beating_child(&beats, false);
    let name = election("run");
    let mut cs: Vec<Sidecar> = ["a", "b", "c"]
        .iter()
        .map(|id| run_sidecar(&etcd.url, &name, id, &[], &cmd))
        .collect();
    let first = one_leader(&cs, Duration::from_secs(10)).await;
    wait_for(
        Duration::from_secs(3),
        "the leader's child to beat",
        || async { !runs(&beats).is_empty() },
    )
    .await;
    // The child's fencing token matches /leader.
    let token = token_of(&cs[first]).await;
    assert!(
        runs(&beats).contains_key(&(cs[first].identity.clone(), token)),
        "{:?}",
        runs(&beats)
    );

    // SIGTERM: the child stops before the next leader's child starts.
    sigterm_stops_cleanly(&mut cs[first]).await;
    let second = one_leader(&cs, Duration::from_secs(5)).await;
    sleep(Duration::from_millis(300)).await;

    // SIGKILL: the child dies with its parent (the run-mode watchdog).
    cs[second].signal(Signal::SIGKILL);
    let killed = now_ns();
    sleep(Duration::from_millis(200)).await;
    let orphan = last_beat_of(&beats, &cs[second].identity);
    assert!(
        orphan < killed + 50_000_000,
        "the child outlived its SIGKILLed sidecar by {} ms",
        (orphan.saturating_sub(killed)) / 1_000_000
    );
    let third = one_leader(&cs, Duration::from_secs(6)).await;
    sleep(Duration::from_millis(300)).await;

    // Cut the leader off (etcd down): its child is stopped by valid_until.
    let valid_until = valid_until_ns(&cs[third]).await;
    etcd.stop();
    sleep(Duration::from_secs(3)).await;
    let last = last_beat_of(&beats, &cs[third].identity);
    assert!(
        last <= valid_until,
        "the child beat {} ms after valid_until",
        (last - valid_until) / 1_000_000
    );
    etcd.restart().await;
    one_leader(&cs, Duration::from_secs(8)).await;
    sleep(Duration::from_millis(300)).await;
    let n = assert_no_overlap(&beats);
    assert!(n >= 4, "expected at least 4 child runs, saw {n}");
    for (i, s) in cs.iter_mut().enumerate() {
        if i != first && i != second {
            assert!(s.exited().is_none());
        }
    }
}

/// SIGTERM `s` and check that it exits 0, without draining (none was
/// configured) and without logging an ERROR.
async fn sigterm_stops_cleanly(s: &mut Sidecar) {
    s.signal(Signal::SIGTERM);
    assert_eq!(
        s.wait_exit(Duration::from_secs(5))
            .await
            .and_then(|s| s.code()),
        Some(0)
    );
    // No drain was configured: run mode stops the child, it does not "drain"
    // and a clean SIGTERM logs no ERROR.
    let log = s.log();
    assert!(!log.contains("draining"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

/// The last beat (unix ns) of any child run by the sidecar `identity`.
fn last_beat_of(beats: &std::path::Path, identity: &str) -> u128 {
    runs(beats)
        .iter()
        .filter(|((id, _), _)| *id == identity)
        .map(|(_, (_, last))| *last)
        .max()
        .unwrap()
}

/// The leader `s`'s `valid_until` as unix ns: now plus its `valid_for_ms`.
async fn valid_until_ns(s: &Sidecar) -> u128 {
    let (_, body) = s.leader().await.unwrap();
    now_ns() + u128::from(body["valid_for_ms"].as_u64().unwrap()) * 1_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ignores_sigterm_is_killed_before_valid_until() {
    let mut etcd = Etcd::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let beats = dir.path().join("beats");
    let cmd = beating_child(&beats, true);
    let s = run_sidecar(
        &etcd.url,
        &election("stubborn"),
        "a",
        &["--kill-grace", "300ms"],
        &cmd,
    );
    wait_for(Duration::from_secs(10), "the sidecar to lead", || {
        s.is_leader()
    })
    .await;
    sleep(Duration::from_millis(700)).await;
    let valid_until = valid_until_ns(&s).await;
    etcd.stop();
    sleep(Duration::from_secs(3)).await;
    let last = runs(&beats).values().map(|(_, l)| *l).max().unwrap();
    let margin_ms = (valid_until as i128 - last as i128) as f64 / 1e6;
    eprintln!("kill-to-valid_until margin: last beat {margin_ms:.1} ms before valid_until");
    assert!(
        last <= valid_until,
        "the child beat after valid_until (margin {margin_ms} ms)"
    );
    assert!(s.log().contains("SIGKILL"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_child_exit_exit_ends_the_sidecar_with_the_childs_code() {
    let etcd = Etcd::start().await;
    let cmd: Vec<String> = ["sh", "-c", "sleep 0.2; exit 3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut s = run_sidecar(
        &etcd.url,
        &election("exitcode"),
        "a",
        &["--on-child-exit", "exit"],
        &cmd,
    );
    let status = s.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(3), "{}", s.log());
}

#[test]
fn run_mode_needs_a_command_and_a_command_needs_run_mode() {
    refused(
        &[
            "run",
            "--election",
            "x",
            "--etcd-endpoints",
            "http://127.0.0.1:1",
        ],
        "run needs a command",
    );
    refused(
        &[
            "--election",
            "x",
            "--etcd-endpoints",
            "http://127.0.0.1:1",
            "--",
            "true",
        ],
        "needs run mode",
    );
    refused(
        &[
            "run",
            "--election",
            "x",
            "--etcd-endpoints",
            "http://127.0.0.1:1",
            "--lease-duration",
            "2s",
            "--kill-grace",
            "2s",
            "--",
            "true",
        ],
        "--kill-grace",
    );
    refused(
        &[
            "--election",
            "x",
            "--etcd-endpoints",
            "http://127.0.0.1:1",
            "--control-addr",
            "0.0.0.0:4041",
        ],
        "--control-addr",
    );
}

/// Run the sidecar with `args` and check that it refuses them: exit code 2
/// (a usage error) and `needle` in its stderr.
fn refused(args: &[&str], needle: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(needle));
}

/// POST `path` on a loopback port; returns the status and body.
async fn http_post(port: u16, path: &str) -> (u16, String) {
    http_request(port, "POST", path, None, HTTP_LIMIT)
        .await
        .expect("POST answered")
}

fn with_control(etcd: &str, election: &str, id: &str, extra: &[&str]) -> (Sidecar, u16) {
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend(["--control-addr", "127.0.0.1:0"]);
    args.extend(extra);
    let s = Sidecar::start(etcd, election, id, &args);
    let port = s.control_port.expect("the control API's bound address");
    (s, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_holds_the_lease_until_release_then_hands_over() {
    let etcd = Etcd::start().await;
    let name = election("drain");
    let hook = Hook::start(200).await;
    let url = hook.url();
    let (a, a_ctl) = with_control(
        &etcd.url,
        &name,
        "a",
        &["--drain-timeout", "20s", "--notify-url", &url],
    );
    wait_for(Duration::from_secs(10), "a to lead", || a.is_leader()).await;
    let (b, _) = with_control(&etcd.url, &name, "b", &[]);
    wait_for(Duration::from_secs(5), "b to follow", || async {
        b.leader().await.is_some_and(|(_, j)| j["leader"] == "a")
    })
    .await;
    // The app follows a's long-poll: it must return at SIGTERM.
    let (_, now) = a.leader().await.unwrap();
    let index = now["transitions"].as_u64().unwrap();
    let port = a.port;
    let poll =
        tokio::spawn(
            async move { http_get(port, &format!("/leader?index={index}&wait=60s")).await },
        );
    sleep(Duration::from_millis(200)).await;
    assert!(!poll.is_finished(), "the long-poll returned before SIGTERM");
    a.signal(Signal::SIGTERM);
    wait_for(Duration::from_millis(500), "a to stop claiming", || async {
        !a.is_leader().await
    })
    .await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(2), poll)
        .await
        .expect("the long-poll did not return when a stopped claiming")
        .unwrap()
        .unwrap();
    assert_eq!(status, 503, "{body}");
    wait_for(
        Duration::from_secs(2),
        "stopped_leading before the release",
        || async {
            hook.seen
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.contains("\"stopped_leading\""))
        },
    )
    .await;
    // Three seconds later nobody leads: a keeps its lease while draining.
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        assert!(!b.is_leader().await, "b led while a was draining");
        sleep(Duration::from_millis(20)).await;
    }
    let released = Instant::now();
    let (status, body) = http_post(a_ctl, "/release").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"released\":true"), "{body}");
    wait_for(
        Duration::from_secs(1),
        "b to lead after the release",
        || b.is_leader(),
    )
    .await;
    eprintln!("release to new leader: {:?}", released.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_ends_by_its_timeout_when_the_app_never_releases() {
    let etcd = Etcd::start().await;
    let name = election("drain-timeout");
    let (a, _) = with_control(&etcd.url, &name, "a", &["--drain-timeout", "2s"]);
    wait_for(Duration::from_secs(10), "a to lead", || a.is_leader()).await;
    let (b, _) = with_control(&etcd.url, &name, "b", &[]);
    sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    a.signal(Signal::SIGTERM);
    wait_for(
        Duration::from_secs(4),
        "b to lead after the drain timeout",
        || b.is_leader(),
    )
    .await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1900),
        "b led after {took:?}, before the drain timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_on_demand_hands_over_and_stays_out_for_the_cooldown() {
    let etcd = Etcd::start().await;
    let name = election("resign");
    let (a, a_ctl) = with_control(&etcd.url, &name, "a", &[]);
    wait_for(Duration::from_secs(10), "a to lead", || a.is_leader()).await;
    let (mut b, b_ctl) = with_control(&etcd.url, &name, "b", &[]);
    sleep(Duration::from_millis(300)).await;
    let (status, body) = http_post(a_ctl, "/resign?cooldown=3s").await;
    assert_eq!(status, 200);
    assert!(body.contains("\"resigned\":true"), "{body}");
    wait_for(Duration::from_secs(1), "b to lead after a resigned", || {
        b.is_leader()
    })
    .await;
    wait_for(
        Duration::from_secs(2),
        "a to see b as leader during its cooldown",
        || async { a.leader().await.is_some_and(|(_, j)| j["leader"] == "b") },
    )
    .await;
    // b leaves; a is still cooling down and must not take over at once.
    b.signal(Signal::SIGTERM);
    b.wait_exit(Duration::from_secs(3)).await;
    sleep(Duration::from_millis(800)).await;
    assert!(!a.is_leader().await, "a campaigned during its cooldown");
    wait_for(
        Duration::from_secs(4),
        "a to lead after the cooldown",
        || a.is_leader(),
    )
    .await;
    // Bad input gets a 4xx with a JSON error; unknown paths 404.
    let _ = b_ctl;
    assert_eq!(http_post(a_ctl, "/resign?cooldown=soon").await.0, 400);
    assert_eq!(http_post(a_ctl, "/nope").await.0, 404);
    assert_eq!(http_get(a_ctl, "/resign").await.unwrap().0, 405);
}

/// A tiny HTTP server: answers every request with the status in `status`
/// and records (method, path, body) of each request.
struct Hook {
    port: u16,
    status: Arc<Mutex<u16>>,
    seen: Arc<Mutex<Vec<String>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Hook {
    async fn start(status: u16) -> Hook {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let status = Arc::new(Mutex::new(status));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (st, sn) = (status.clone(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let (st, sn) = (st.clone(), sn.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    // Read the head, then the body by Content-Length.
                    loop {
                        let Ok(n) = sock.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&got).into_owned();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let len: usize = head
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            if body.len() >= len {
                                sn.lock().unwrap().push(body.to_owned());
                                break;
                            }
                        }
                    }
                    let code = *st.lock().unwrap();
                    let _ = sock
                        .write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
                        .await;
                });
            }
        });
        Hook {
            port,
            status,
            seen,
            _task: task,
        }
    }
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }
    fn set(&self, status: u16) {
        *self.status.lock().unwrap() = status;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_app_never_leads_and_a_leader_turning_unhealthy_resigns() {
    let etcd = Etcd::start().await;
    let hook = Hook::start(503).await;
    let name = election("health");
    let url = hook.url();
    let (a, _) = with_control(
        &etcd.url,
        &name,
        "a",
        &[
            "--candidate-health-url",
            &url,
            "--health-interval",
            "200ms",
            "--health-grace",
            "1s",
        ],
    );
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        assert!(!a.is_leader().await, "a led with an unhealthy app");
        sleep(Duration::from_millis(20)).await;
    }
    hook.set(200);
    wait_for(Duration::from_secs(3), "a to lead once healthy", || {
        a.is_leader()
    })
    .await;
    let (b, _) = with_control(&etcd.url, &name, "b", &[]);
    sleep(Duration::from_millis(300)).await;
    hook.set(500);
    let t0 = Instant::now();
    wait_for(Duration::from_secs(4), "b to lead after a resigned", || {
        b.is_leader()
    })
    .await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "a resigned after {took:?}, before the grace"
    );
    assert!(!a.is_leader().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_arrive_in_order_and_a_dead_url_never_delays_the_election() {
    let etcd = Etcd::start().await;
    let hook = Hook::start(200).await;
    let name = election("notify");
    let url = hook.url();
    let (mut a, _) = with_control(&etcd.url, &name, "a", &["--notify-url", &url]);
    wait_for(Duration::from_secs(10), "a to lead", || a.is_leader()).await;
    // A sidecar whose notify URL is dead (refuses connections for the whole
    // test) elects as fast as any other.
    let refused = RefusedPort::new();
    let dead = refused.url("/dead");
    let t0 = Instant::now();
    let (b, _) = with_control(&etcd.url, &name, "b", &["--notify-url", &dead]);
    a.signal(Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(5)).await.expect("a exits");
    wait_for(Duration::from_secs(2), "b to lead", || b.is_leader()).await;
    eprintln!(
        "b led {:?} after start despite a dead notify URL",
        t0.elapsed()
    );
    let seen = hook.seen.lock().unwrap().clone();
    let kinds: Vec<String> = seen
        .iter()
        .map(|b| {
            serde_json::from_str::<serde_json::Value>(b).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["became_leader", "stopped_leading"], "{seen:?}");
    let first: serde_json::Value = serde_json::from_str(&seen[0]).unwrap();
    assert_eq!(first["identity"], "a");
    assert_eq!(first["leader"], "a");
    assert!(first["fencing_token"].as_u64().is_some());
}

/// Whether process `pid` is gone (no such process, or a zombie nobody reaped
/// yet: it runs no more).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// A command whose own children outlive it unless killed: a `sleep` in its
/// process group and one in a session of its own (`setsid`), their pids
/// written to `pids`; the shell then waits.
fn command_with_grandchildren(pids: &std::path::Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "sleep 1000 & a=$!; setsid sleep 1001 & b=$!; echo \"$a $b\" > {p}.tmp; mv {p}.tmp {p}; wait",
            p = pids.display()
        ),
    ]
}

/// The grandchildren's pids, once the command wrote them.
async fn grandchildren(pids: &std::path::Path) -> Vec<u32> {
    wait_for(
        Duration::from_secs(10),
        "the command to start its children",
        || async { pids.exists() },
    )
    .await;
    let text = std::fs::read_to_string(pids).unwrap();
    let out: Vec<u32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(out.len(), 2, "{text}");
    assert!(
        out.iter().all(|p| !gone(*p)),
        "the grandchildren did not start"
    );
    out
}

/// A SIGKILL of the sidecar (or an OOM kill) takes the
/// command's whole process tree with it, grandchildren included (one in the
/// command's process group, one that left it with `setsid`), within ~1 s:
/// another candidate may start its own copy after the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_sidecar_takes_the_commands_grandchildren_with_it() {
    let etcd = Etcd::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let pids = dir.path().join("pids");
    let s = run_sidecar(
        &etcd.url,
        &election("grandchildren-kill"),
        "a",
        &[],
        &command_with_grandchildren(&pids),
    );
    let kids = grandchildren(&pids).await;
    s.signal(Signal::SIGKILL);
    let t0 = Instant::now();
    let all_gone = || async { kids.iter().all(|p| gone(*p)) };
    let limit = Duration::from_secs(1);
    while !all_gone().await && t0.elapsed() < limit {
        sleep(Duration::from_millis(5)).await;
    }
    let alive: Vec<u32> = kids.iter().copied().filter(|p| !gone(*p)).collect();
    for p in &alive {
        // Do not leave them behind for the rest of the suite.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p as i32), Signal::SIGKILL);
    }
    assert!(
        alive.is_empty(),
        "grandchildren {alive:?} of {kids:?} outlived the SIGKILLed sidecar by {limit:?}"
    );
    eprintln!(
        "the command's tree was gone {:?} after the SIGKILL",
        t0.elapsed()
    );
}

/// A clean stop (SIGTERM) also ends the command's
/// grandchildren, the one that left its process group included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_command_leaves_no_grandchildren() {
    let etcd = Etcd::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let pids = dir.path().join("pids");
    let mut s = run_sidecar(
        &etcd.url,
        &election("grandchildren-stop"),
        "a",
        &[],
        &command_with_grandchildren(&pids),
    );
    let kids = grandchildren(&pids).await;
    sigterm_stops_cleanly(&mut s).await;
    let alive: Vec<u32> = kids.iter().copied().filter(|p| !gone(*p)).collect();
    for p in &alive {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p as i32), Signal::SIGKILL);
    }
    assert!(
        alive.is_empty(),
        "grandchildren {alive:?} of {kids:?} outlived a clean stop of the command"
    );
}
