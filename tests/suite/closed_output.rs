//! The operator's commands with their output closed early (`| head -c 1`,
//! `>&-`, `2>&-`): no panic, and the documented exit code: what was read
//! or done decides it, never the closed output. On real etcd.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// `leader-elector ARGS REDIRECT` through bash; returns the command's exit
/// code (`PIPESTATUS[0]`) and what bash saw on its own stderr.
fn shell(args: &[&str], redirect: &str) -> (i32, String) {
    let bin = env!("CARGO_BIN_EXE_leader-elector");
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "'{bin}' {} {redirect}; echo \"exit=${{PIPESTATUS[0]}}\" >&3",
        quoted.join(" ")
    );
    let out = Command::new("bash")
        .args(["-c", &format!("exec 3>&1; {{ {script}; }} 3>&1 >/dev/null")])
        .env_remove("LEADER_ELECTOR_ELECTION")
        .output()
        .expect("run bash");
    let text = String::from_utf8_lossy(&out.stdout);
    let code = text
        .lines()
        .find_map(|l| l.strip_prefix("exit="))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or_else(|| panic!("no exit code from bash: {text}"));
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_switchover_and_pause_with_closed_output_exit_with_their_codes() {
    let etcd = Etcd::start().await;
    let name = election("closed-output");
    let a = Sidecar::start(&etcd.url, &name, "a", &[]);
    wait_for(Duration::from_secs(30), "a leads", || a.is_leader()).await;
    let _b = Sidecar::start(&etcd.url, &name, "b", &[]);
    let base = ["--election", &name, "--etcd-endpoints", &etcd.url];
    let with = |sub: &str, extra: &[&str]| -> Vec<String> {
        let mut v = vec![sub.to_owned()];
        v.extend(base.iter().map(|s| s.to_string()));
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: &[String], redirect: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        shell(&args, redirect)
    };
    for redirect in ["| head -c 1", ">&-", "2>&-", "2>&- | head -c 1"] {
        let (code, err) = run(&with("status", &[]), redirect);
        assert_eq!(code, 0, "status {redirect}: {err}");
        assert!(!err.contains("panicked"), "status {redirect}: {err}");
    }
    // Nobody reachable: the documented 1, said on a closed stderr quietly.
    let (code, err) = shell(
        &[
            "status",
            "--election",
            &name,
            "--etcd-endpoints",
            "http://127.0.0.1:1",
            "--timeout",
            "1s",
        ],
        "2>&-",
    );
    assert_eq!(code, 1, "{err}");
    let (code, err) = run(&with("switchover", &["--to", "nobody"]), "2>&- | head -c 1");
    assert_eq!(code, 5, "a refused switchover: {err}");
    let (code, err) = run(
        &with("switchover", &["--to", "b", "--wait", "30s"]),
        "| head -c 1",
    );
    assert_eq!(code, 0, "switchover to b: {err}");
    for (sub, redirect) in [("pause", "| head -c 1"), ("resume", "2>&- >&-")] {
        let (code, err) = run(&with(sub, &[]), redirect);
        assert_eq!(code, 0, "{sub} {redirect}: {err}");
        assert!(!err.contains("panicked"), "{sub}: {err}");
    }
}

/// `observe 2>&1 | head -c 300` against a backend that is down: its error
/// lines fill the pipe, the reader goes away, later lines are dropped
/// quietly, and SIGTERM still ends it with 0 (it exited 101 before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_survives_a_closed_stderr_pipe() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args([
            "observe",
            "--election",
            "e",
            "--etcd-endpoints",
            "http://127.0.0.1:1",
        ])
        .args(["--timeout", "200ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start observe");
    let mut err = child.stderr.take().unwrap();
    let mut first = [0u8; 300];
    err.read_exact(&mut first).expect("300 bytes of errors");
    drop(err);
    // Its retries (100 ms, doubling) write again within about 1.5 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "observe died when its stderr closed: {:?}",
        child.wait()
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}
