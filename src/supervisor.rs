//! Run mode: `leader-elector run [flags] -- COMMAND ARGS…` starts COMMAND
//! only while this candidate leads.
//!
//! Invariants:
//! - The child starts only while `is_leader(now)` holds with more than
//!   `--kill-grace` of validity left, and gets `LEADER_ELECTOR_ELECTION`,
//!   `LEADER_ELECTOR_IDENTITY` and `LEADER_ELECTOR_FENCING_TOKEN`.
//! - When leadership ends (or renewals are so late that `valid_until` is
//!   nearer than `--kill-grace`), the child's process group gets SIGTERM, then
//!   SIGKILL at `min(now + kill_grace, valid_until - 20 ms)`: the child is gone before
//!   another candidate can lead. Only then does the supervisor tell the Elector
//!   to release the key ([`ElectorHandle::release`]).
//! - The child runs in its own process group under a tiny exec shim
//!   (`leader-elector __exec`) that sets the Linux parent-death signal to
//!   SIGKILL, so it dies with the sidecar even on SIGKILL or OOM. The death
//!   signal follows the thread that spawned it: the binary runs a
//!   current-thread runtime on the main thread, which lives as long as the
//!   process.
//! - A paused sidecar (SIGSTOP) cannot stop its child; its lease then ends on
//!   the backend. Freeze the whole container (cgroup freezer, which Kubernetes
//!   uses) or rely on the fencing token in the child's environment.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

/// How long before `valid_until` the SIGKILL is aimed: a timer fires at or
/// after its deadline (late by up to a few ms on a loaded host), and the
/// signal and the child's exit take a moment more. Aiming at `valid_until`
/// itself let a child that ignores SIGTERM write one more line up to a
/// millisecond after the term's validity ended (seen by
/// `tests/cooperate.rs`, a_child_that_ignores_sigterm_is_killed_before_valid_until).
const KILL_SLACK: Duration = Duration::from_millis(20);

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::elector::{ElectorHandle, LeaderState};

pub use crate::config::{OnChildExit, RunOptions};

/// The exit code that reflects `status` (128 + signal number when killed).
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

enum Outcome {
    Exited(ExitStatus),
    Stop { shutdown: bool },
}

fn spawn(opts: &RunOptions, state: &LeaderState, token: u64) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    Command::new(exe)
        .arg("__exec")
        .arg(std::process::id().to_string())
        .arg("--")
        .args(&opts.command)
        .env("LEADER_ELECTOR_ELECTION", &state.election)
        .env("LEADER_ELECTOR_IDENTITY", &state.identity)
        .env("LEADER_ELECTOR_FENCING_TOKEN", token.to_string())
        .process_group(0)
        .stdin(Stdio::null())
        .kill_on_drop(false)
        .spawn()
}

fn signal_group(child: &Child, sig: Signal) {
    if let Some(pid) = child.id() {
        // ESRCH: the group is already gone.
        let _ = killpg(Pid::from_raw(pid as i32), sig);
    }
}

/// SIGTERM the child's group, SIGKILL it at `deadline` if still there, and
/// reap it. Also SIGKILLs what the child left behind in its group.
async fn stop(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    let pid = child.id();
    signal_group(child, Signal::SIGTERM);
    let status = tokio::select! {
        s = child.wait() => s.ok(),
        _ = sleep_until(deadline) => {
            warn!(pid, "the child did not stop by its deadline; SIGKILL");
            signal_group(child, Signal::SIGKILL);
            child.wait().await.ok()
        }
    };
    if let Some(pid) = pid {
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    status
}

/// Start and stop the child as leadership comes and goes, until `shutdown`.
/// Returns the exit code for the process when `--on-child-exit exit` ended
/// the run, else `None`.
pub async fn supervise(
    opts: RunOptions,
    mut state: watch::Receiver<LeaderState>,
    handle: ElectorHandle,
    shutdown: CancellationToken,
) -> Option<i32> {
    let mut signals = Forwarded::install();
    let mut restart_delay = Duration::from_millis(100);
    loop {
        // Wait until we lead with enough validity left to stop in time.
        let (token, mut valid_until) = wait_to_lead(&opts, &mut state, &handle, &shutdown).await?;
        let snapshot = state.borrow().clone();
        let mut child = match spawn(&opts, &snapshot, token) {
            Ok(c) => c,
            Err(e) => {
                error!(command = ?opts.command, error = %e, "cannot start the command; resigning");
                handle.resign(opts.resign_cooldown).await;
                continue;
            }
        };
        info!(pid = child.id(), fencing_token = token, command = ?opts.command, "started the command as leader");
        let outcome = watch_child(
            &mut child,
            token,
            &mut valid_until,
            &opts,
            &mut state,
            &shutdown,
            &mut signals,
        )
        .await;
        match outcome {
            Outcome::Stop { shutdown: stopping } => {
                let deadline = (Instant::now() + opts.kill_grace)
                    .min(valid_until.checked_sub(KILL_SLACK).unwrap_or(valid_until));
                let status = stop(&mut child, deadline).await;
                info!(status = ?status.map(exit_code), "stopped the command");
                handle.release().await;
                if stopping {
                    return None;
                }
                restart_delay = Duration::from_millis(100);
            }
            Outcome::Exited(status) => {
                let code = exit_code(status);
                // Reap anything the child left in its group.
                signal_group(&child, Signal::SIGKILL);
                match opts.on_child_exit {
                    OnChildExit::Restart => {
                        warn!(code, delay = ?restart_delay, "the command exited; restarting it while leading");
                        tokio::select! {
                            _ = sleep(restart_delay) => {}
                            _ = shutdown.cancelled() => {}
                        }
                        restart_delay = (restart_delay * 2).min(Duration::from_secs(10));
                    }
                    OnChildExit::Resign => {
                        warn!(code, cooldown = ?opts.resign_cooldown, "the command exited; resigning");
                        handle.resign(opts.resign_cooldown).await;
                        handle.release().await;
                    }
                    OnChildExit::Exit => {
                        info!(
                            code,
                            "the command exited; resigning and exiting with its code"
                        );
                        shutdown.cancel();
                        handle.release().await;
                        return Some(code);
                    }
                }
            }
        }
    }
}

/// Wait until we lead with enough validity left (more than `--kill-grace`)
/// to stop the child in time; returns our fencing token and how long our
/// term is valid. `None` when the run is over: shutdown (after releasing) or
/// the Elector gone.
async fn wait_to_lead(
    opts: &RunOptions,
    state: &mut watch::Receiver<LeaderState>,
    handle: &ElectorHandle,
    shutdown: &CancellationToken,
) -> Option<(u64, Instant)> {
    loop {
        if shutdown.is_cancelled() {
            handle.release().await;
            return None;
        }
        {
            let s = state.borrow_and_update();
            let now = Instant::now();
            if s.is_leader(now)
                && s.valid_for(now) > opts.kill_grace
                && let (Some(t), Some(own)) = (s.fencing_token, s.own_term)
            {
                return Some((t, own.valid_until));
            }
        }
        tokio::select! {
            r = state.changed() => if r.is_err() { return None },
            _ = shutdown.cancelled() => {}
        }
    }
}

/// The signals the sidecar forwards to the child's process group (SIGHUP,
/// SIGUSR1, SIGUSR2); `None` where a handler cannot be installed.
struct Forwarded {
    hup: Option<tokio::signal::unix::Signal>,
    usr1: Option<tokio::signal::unix::Signal>,
    usr2: Option<tokio::signal::unix::Signal>,
}

impl Forwarded {
    fn install() -> Self {
        Forwarded {
            hup: signal(SignalKind::hangup()).ok(),
            usr1: signal(SignalKind::user_defined1()).ok(),
            usr2: signal(SignalKind::user_defined2()).ok(),
        }
    }
}

/// The next delivery of `s`; pending forever when it has no handler.
async fn recv(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s.as_mut() {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Watch the running child until it exits, our term ends or runs out
/// without a renewal (`valid_until` follows renewals), or shutdown;
/// forward SIGHUP, SIGUSR1 and SIGUSR2 to its group meanwhile.
async fn watch_child(
    child: &mut Child,
    token: u64,
    valid_until: &mut Instant,
    opts: &RunOptions,
    state: &mut watch::Receiver<LeaderState>,
    shutdown: &CancellationToken,
    signals: &mut Forwarded,
) -> Outcome {
    loop {
        tokio::select! {
            s = child.wait() => match s {
                Ok(s) => return Outcome::Exited(s),
                Err(e) => {
                    error!(error = %e, "cannot wait for the child");
                    return Outcome::Stop { shutdown: false };
                }
            },
            r = state.changed() => {
                if r.is_err() { return Outcome::Stop { shutdown: true }; }
                let s = state.borrow_and_update();
                match s.own_term {
                    Some(own) if s.is_leader(Instant::now()) && own.fencing_token == token => *valid_until = own.valid_until,
                    _ => return Outcome::Stop { shutdown: false },
                }
            }
            // Renewals are late: stop now, so the child is gone by valid_until.
            _ = sleep_until(valid_until.checked_sub(opts.kill_grace).unwrap_or(*valid_until)) => {
                warn!("leadership validity is running out without a renewal; stopping the command");
                return Outcome::Stop { shutdown: false };
            }
            _ = shutdown.cancelled() => return Outcome::Stop { shutdown: true },
            Some(()) = recv(&mut signals.hup) => signal_group(child, Signal::SIGHUP),
            Some(()) = recv(&mut signals.usr1) => signal_group(child, Signal::SIGUSR1),
            Some(()) = recv(&mut signals.usr2) => signal_group(child, Signal::SIGUSR2),
        }
    }
}

/// The exec shim run as `leader-elector __exec PARENT_PID -- COMMAND ARGS…`:
/// set the parent-death signal to SIGKILL, make sure the parent is still
/// there, then become COMMAND. Only returns on failure, with an exit code.
pub fn exec_shim(args: &[String]) -> i32 {
    use nix::sys::prctl::set_pdeathsig;
    use std::ffi::CString;
    let (Some(parent), Some(sep)) = (args.first(), args.get(1)) else {
        eprintln!("error: __exec needs PARENT_PID -- COMMAND");
        return 2;
    };
    if sep != "--" || args.len() < 3 {
        eprintln!("error: __exec needs PARENT_PID -- COMMAND");
        return 2;
    }
    if let Err(e) = set_pdeathsig(Signal::SIGKILL) {
        eprintln!("error: cannot set the parent-death signal: {e}");
        return 126;
    }
    if nix::unistd::getppid().to_string() != *parent {
        // The sidecar died before the death signal was armed.
        return 137;
    }
    let argv: Result<Vec<CString>, _> =
        args[2..].iter().map(|a| CString::new(a.as_str())).collect();
    let Ok(argv) = argv else {
        eprintln!("error: the command contains a NUL byte");
        return 2;
    };
    let err = nix::unistd::execvp(&argv[0], &argv).unwrap_err();
    eprintln!("error: cannot run {}: {err}", args[2]);
    if err == nix::errno::Errno::ENOENT {
        127
    } else {
        126
    }
}
