//! Run mode's start checks: a command that cannot start is a usage error at
//! start (exit 2, naming it); one that fails to start while leading (exit
//! 126 or 127 at once) is reported as that and ends the run after
//! `--start-failures` in a row, never a loop; run-only flags need `run`.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// Run `leader-elector ARGS`; expect exit 2 and `needle` on stderr.
fn refused(args: &[&str], needle: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args(args)
        .env_remove("LEADER_ELECTOR_ELECTION")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: no {needle:?} in: {err}");
}

#[test]
fn a_command_that_cannot_start_and_run_only_flags_outside_run_are_refused_at_start() {
    let dir = tempfile::TempDir::new().unwrap();
    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let script = script.to_str().unwrap();
    let base = ["--election", "x", "--etcd-endpoints", "http://127.0.0.1:1"];
    let run = |tail: &[&'static str]| -> Vec<String> {
        let mut v = vec!["run".to_owned()];
        v.extend(base.iter().map(|s| s.to_string()));
        v.extend(tail.iter().map(|s| s.to_string()));
        v
    };
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            run(&["--", "/nonexistent/cmd"]),
            "the command /nonexistent/cmd does not exist".into(),
        ),
        (
            run(&["--", "no-such-command-for-leader-elector"]),
            "no-such-command-for-leader-elector is not found on PATH".into(),
        ),
        (
            [run(&["--"]), vec![script.to_owned()]].concat(),
            format!("the command {script} is not executable"),
        ),
    ];
    for (args, needle) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, needle);
    }
    for flag in [
        ["--kill-grace", "1s"],
        ["--on-child-exit", "exit"],
        ["--start-failures", "2"],
        ["--every", "5m"],
    ] {
        let args = [&base[..], &flag[..]].concat();
        refused(&args, &format!("{} needs run mode", flag[0]));
    }
    refused(
        &run(&["--start-failures", "0", "--", "true"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "--start-failures (0) must be between 1 and 1000",
    );
}

/// `sh -c 'exit 127'` (the shell's "not found") fails to start every time it
/// leads: each failure is logged as a failed start (not a freeze), and the
/// second in a row ends the sidecar with 127.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_exits_127_at_once_ends_the_run_after_start_failures() {
    let etcd = Etcd::start().await;
    let mut args: Vec<String> = vec!["--etcd-endpoints".into(), etcd.url.clone()];
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(
        ["--start-failures", "2", "--", "sh", "-c", "exit 127"]
            .iter()
            .map(|s| s.to_string()),
    );
    let mut s = Sidecar::start_run(&election("start-failures"), "a", &args);
    let status = s.wait_exit(Duration::from_secs(60)).await;
    let log = s.log();
    assert_eq!(status.and_then(|s| s.code()), Some(127), "{log}");
    assert_eq!(
        log.matches("the command failed to start").count(),
        2,
        "{log}"
    );
    assert!(log.contains("2 times in a row"), "{log}");
    assert!(!log.contains("freeze"), "{log}");
}

/// A listen address another process holds: exit 1, and the log line names
/// the flag with its hint on the same line, without a literal `\n` (it was
/// printed as `…address\nhint: …` inside the quoted field).
#[test]
fn a_port_in_use_is_one_log_line_naming_the_flag_and_the_hint() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to hold");
    let addr = held.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args(["--election", "e", "--etcd-endpoints", "http://127.0.0.1:1"])
        .args(["--http-addr", &addr, "--control-addr", "127.0.0.1:0"])
        .env_remove("LEADER_ELECTOR_ELECTION")
        .output()
        .expect("run leader-elector");
    let logs =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{logs}");
    let line = logs
        .lines()
        .find(|l| l.contains("cannot listen on --http-addr"))
        .unwrap_or_else(|| panic!("no line names --http-addr: {logs}"));
    assert!(line.contains("hint: another process holds"), "{line}");
    assert!(!line.contains("\\n"), "a literal \\n in: {line}");
    drop(held);
}
