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
/// lines fill the pipe, the reader goes away, and observe exits 0 on its
/// own within a second, as for a closed stdout (it used to run until
/// killed; before that it exited 101).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_exits_0_when_its_stderr_pipe_closes() {
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
    let (code, after) = exit_after_close(&mut child).await;
    assert_eq!(code, Some(0), "exited {code:?} after {after:?}");
}

/// `observe | head -1` on a stable election: the line is read, the reader
/// goes away while nothing changes (nothing is written), and observe sees
/// the closed pipe and exits 0 within a second (it ran until the next
/// change of leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_exits_0_when_its_stdout_closes_on_a_stable_election() {
    let etcd = Etcd::start().await;
    let name = election("closed-stdout");
    let a = Sidecar::start(&etcd.url, &name, "a", &[]);
    wait_for(Duration::from_secs(30), "a leads", || a.is_leader()).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args([
            "observe",
            "--election",
            &name,
            "--etcd-endpoints",
            &etcd.url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start observe");
    let out = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .map(|_| line)
    });
    let line = tokio::time::timeout(Duration::from_secs(30), line)
        .await
        .expect("observe printed no line within 30 s")
        .unwrap()
        .expect("read observe's line");
    assert!(line.contains("a leads"), "{line}");
    // The reader (and its end of the pipe) is gone now.
    let (code, after) = exit_after_close(&mut child).await;
    assert_eq!(code, Some(0), "exited {code:?} after {after:?}");
    assert!(
        a.is_leader().await,
        "the election changed: the exit proves nothing"
    );
}

/// Wait for `child` to exit after its reader closed: its exit code and how
/// long it took. Fails when it is still running after 2 s (it checks every
/// 250 ms; the rest is this machine's load).
async fn exit_after_close(child: &mut std::process::Child) -> (Option<i32>, Duration) {
    let closed = tokio::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code(), closed.elapsed());
        }
        if closed.elapsed() > Duration::from_secs(2) {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = child.wait();
            panic!("observe still ran 2 s after its reader closed");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
