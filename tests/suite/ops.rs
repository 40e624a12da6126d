//! The operator's commands `leader-elector status` and `leader-elector
//! observe` against real etcd and redis-server processes: who leads, the
//! fencing token, exit codes, JSON, and one line per leadership change.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::*;
use nix::sys::signal::Signal;

fn ops(sub: &str, election: &str, backend: &[&str], extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leader-elector"));
    c.arg(sub)
        .args(["--election", election])
        .args(backend)
        .args(extra)
        .env_remove("LEADER_ELECTOR_ELECTION");
    c
}

fn status_json(election: &str, backend: &[&str]) -> (i32, serde_json::Value) {
    let out = ops("status", election, backend, &["-o", "json"])
        .output()
        .expect("run leader-elector status");
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "status -o json printed no JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

/// `observe` as a child: its stdout lines arrive on the channel.
struct Observer {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Observer {
    fn start(election: &str, backend: &[&str]) -> Observer {
        let mut child = ops("observe", election, backend, &[])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start leader-elector observe");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Observer { child, lines }
    }

    fn next(&self, limit: Duration, what: &str) -> String {
        self.lines
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("observe printed no line within {limit:?} ({what})"))
    }

    fn stop(mut self) -> i32 {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            Signal::SIGINT,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        status.code().unwrap_or(-1)
    }
}

/// Status and observe through one graceful handover and one crash, on any backend.
async fn status_and_observe(backend: Vec<String>, start: impl Fn(&str) -> Sidecar, name: &str) {
    let election = election(name);
    let flags: Vec<&str> = backend.iter().map(String::as_str).collect();

    // Nobody leads yet: exit code 3, leader null.
    let (code, v) = status_json(&election, &flags);
    assert_eq!(code, 3, "status with nobody leading: {v}");
    assert_eq!(v["leader"], serde_json::Value::Null);

    let observer = Observer::start(&election, &flags);
    let first_line = observer.next(Duration::from_secs(10), "the initial state");
    assert!(
        first_line.ends_with(&format!("nobody leads {election}")),
        "{first_line}"
    );

    let cs = vec![start("a"), start("b")];
    let first = one_leader(&cs, Duration::from_secs(10)).await;
    let token = token_of(&cs[first]).await;
    let line = observer.next(Duration::from_secs(5), "the first leader");
    assert!(
        line.contains(&format!(
            "{} leads {election} (fencing token {token})",
            cs[first].identity
        )),
        "{line}"
    );

    // status: the leader, its token, its lease; exit code 0.
    let (code, v) = status_json(&election, &flags);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["leader"], cs[first].identity.as_str());
    assert_eq!(v["fencing_token"], token);
    let left = v["lease_remaining_seconds"]
        .as_f64()
        .expect("lease_remaining_seconds");
    assert!(
        left > 0.0 && left <= 2.0,
        "lease left {left} with a 2s lease: {v}"
    );
    let table = ops("status", &election, &flags, &[]).output().unwrap();
    assert_eq!(table.status.code(), Some(0));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("ELECTION"), "{text}");
    assert!(text.contains(&cs[first].identity), "{text}");

    // Graceful handover: observe prints the next leader (possibly after a
    // "nobody leads" line for the instant the key is free).
    cs[first].signal(Signal::SIGTERM);
    let second = 1 - first;
    let mut line = observer.next(Duration::from_secs(5), "the handover");
    if line.contains("nobody leads") {
        line = observer.next(Duration::from_secs(5), "the next leader after the handover");
    }
    assert!(
        line.contains(&format!("{} leads {election}", cs[second].identity)),
        "{line}"
    );

    // Crash: the lease expires; observe reports nobody, then (no one left) stays quiet.
    cs[second].signal(Signal::SIGKILL);
    let line = observer.next(Duration::from_secs(6), "the crashed leader's expiry");
    assert!(
        line.ends_with(&format!("nobody leads {election}")),
        "{line}"
    );
    assert_eq!(observer.stop(), 0, "observe must exit 0 on SIGINT");

    let (code, _) = status_json(&election, &flags);
    assert_eq!(code, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_observe_on_etcd() {
    let etcd = Etcd::start().await;
    let url = etcd.url.clone();
    status_and_observe(
        vec!["--etcd-endpoints".into(), url.clone()],
        |id| Sidecar::start(&url, &election("ops-etcd"), id, FAST),
        "ops-etcd",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_observe_on_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url.clone();
    status_and_observe(
        vec!["--redis-url".into(), url.clone()],
        |id| redis_sidecar(&[&url], &election("ops-redis"), id, FAST),
        "ops-redis",
    )
    .await;
}

#[test]
fn status_exits_1_when_the_backend_is_down_and_2_on_bad_flags() {
    // An etcd endpoint that refuses connections for the whole test.
    let down = RefusedPort::new();
    let out = ops(
        "status",
        "nobody",
        &["--etcd-endpoints", &down.url("")],
        &["--timeout", "2s"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach etcd"), "{err}");
    assert!(
        !err.contains("tonic::transport::Error"),
        "raw transport error text: {err}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");

    let out = ops("status", "x", &[], &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "no backend flags");
    let out = ops(
        "status",
        "x",
        &["--redis-url", "redis://127.0.0.1:1"],
        &["-o", "yaml"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "bad -o");
}
