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
//! - The command runs in its own process group under a tiny watchdog
//!   process (`leader-elector __watchdog`, see `watchdog`) that kills the
//!   command's whole process tree, grandchildren included, when the sidecar
//!   dies however it dies (SIGKILL, OOM) or when the command exits.
//! - A paused sidecar (SIGSTOP) cannot stop its child; its lease then ends on
//!   the backend. Freeze the whole container (cgroup freezer, which Kubernetes
//!   uses) or rely on the fencing token in the child's environment.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

/// How long before `valid_until` the SIGKILL is aimed: a timer fires at or
/// after its deadline (late by up to a few ms on a loaded host), and the
/// signal and the child's exit take a moment more. Aiming at `valid_until`
/// itself let a child that ignores SIGTERM write one more line up to a
/// millisecond after the term's validity ended (seen by
/// `tests/suite/cooperate.rs`, a_child_that_ignores_sigterm_is_killed_before_valid_until).
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

mod every;
mod watchdog;

pub use every::{Every, run_every};

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

/// How long the watchdog may take to report the command's process group.
const REPORT_LIMIT: Duration = Duration::from_secs(10);

/// The running command: its watchdog process and the command's group.
struct Running {
    /// The watchdog (it exits with the command's code once the command's
    /// tree is gone).
    child: Child,
    /// The command's process group, as the watchdog reported it; `None`
    /// when the command did not start (the watchdog then exits 126 or 127).
    group: Option<Pid>,
    /// Our end of the lifeline: when it closes (we died) the watchdog kills
    /// the command's tree. Kept while the watchdog runs.
    _lifeline: tokio::net::UnixStream,
}

impl Running {
    /// The watchdog's pid, for logs.
    fn id(&self) -> Option<u32> {
        self.child.id()
    }
}

async fn spawn(opts: &RunOptions, state: &LeaderState, token: u64) -> std::io::Result<Running> {
    let env = [
        ("LEADER_ELECTOR_ELECTION", state.election.clone()),
        ("LEADER_ELECTOR_IDENTITY", state.identity.clone()),
        ("LEADER_ELECTOR_FENCING_TOKEN", token.to_string()),
    ];
    spawn_with(&opts.command, &env).await
}

/// Start `command` under the watchdog, in its own process group, with `env`
/// added to its environment.
async fn spawn_with(command: &[String], env: &[(&str, String)]) -> std::io::Result<Running> {
    let exe = std::env::current_exe()?;
    // Both ends close on exec: only the watchdog's stdin (a dup) crosses.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let child = Command::new(exe)
        .arg("__watchdog")
        .arg(std::process::id().to_string())
        .arg("--")
        .args(command)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .kill_on_drop(false)
        .spawn()?;
    ours.set_nonblocking(true)?;
    let mut lifeline = tokio::net::UnixStream::from_std(ours)?;
    let group = match tokio::time::timeout(REPORT_LIMIT, read_group(&mut lifeline)).await {
        Ok(g) => g,
        Err(_) => {
            warn!(pid = child.id(), limit = ?REPORT_LIMIT, "the run-mode watchdog did not report the command's process group in time");
            None
        }
    };
    Ok(Running {
        child,
        group,
        _lifeline: lifeline,
    })
}

/// The command's process group id, the first line the watchdog writes;
/// `None` when it closes the lifeline first (the command did not start).
async fn read_group(lifeline: &mut tokio::net::UnixStream) -> Option<Pid> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    let mut buf = [0u8; 32];
    while !line.contains(&b'\n') && line.len() < 64 {
        match lifeline.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => line.extend_from_slice(&buf[..n]),
        }
    }
    let text = std::str::from_utf8(&line).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    (pid > 1).then(|| Pid::from_raw(pid))
}

fn signal_group(child: &Running, sig: Signal) {
    if let Some(group) = child.group {
        // ESRCH: the group is already gone.
        let _ = killpg(group, sig);
    }
}

/// SIGTERM the command's group, SIGKILL it at `deadline` if still there,
/// and reap the watchdog (which has killed the rest of the command's tree
/// by then).
async fn stop(child: &mut Running, deadline: Instant) -> Option<ExitStatus> {
    let pid = child.id();
    signal_group(child, Signal::SIGTERM);
    let status = tokio::select! {
        s = child.child.wait() => s.ok(),
        _ = sleep_until(deadline) => {
            warn!(pid, "the child did not stop by its deadline; SIGKILL");
            signal_group(child, Signal::SIGKILL);
            child.child.wait().await.ok()
        }
    };
    signal_group(child, Signal::SIGKILL);
    status
}

/// The `main` of the run-mode watchdog process (`leader-elector __watchdog
/// PARENT_PID -- COMMAND ARGS…`, started by run mode, not by users): it
/// starts COMMAND and kills COMMAND's whole process tree when the sidecar
/// dies or COMMAND exits. Returns the exit code: COMMAND's (128 + signal
/// when it was killed), 126 when it cannot start, 127 when it is not
/// found, 2 on bad arguments.
pub fn watchdog_main(args: &[String]) -> i32 {
    watchdog::main(args)
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
    let mut starts = Starts::new(&opts, &handle, &shutdown);
    loop {
        // Wait until we lead with enough validity left to stop in time.
        let (token, mut valid_until) = wait_to_lead(&opts, &mut state, &handle, &shutdown).await?;
        let snapshot = state.borrow().clone();
        let mut child = match start(&opts, &snapshot, token, &mut starts).await {
            Ok(c) => c,
            Err(None) => continue,
            Err(Some(code)) => return Some(code),
        };
        info!(watchdog = child.id(), pid = child.group.map(Pid::as_raw), fencing_token = token, command = ?opts.command, "started the command as leader");
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
                starts.started();
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
                // Reap anything the child left in its group.
                signal_group(&child, Signal::SIGKILL);
                let code = exit_code(status);
                let end = if START_FAILED.contains(&code) {
                    starts.failed(code).await
                } else {
                    starts.started();
                    after_exit(code, &opts, &handle, &shutdown, &mut restart_delay).await
                };
                if end.is_some() {
                    return end;
                }
            }
        }
    }
}

/// Start the command; a failed start is counted (`Err(None)`: try again
/// once leading; `Err(Some(code))`: the run is over with `code`).
async fn start(
    opts: &RunOptions,
    snapshot: &LeaderState,
    token: u64,
    starts: &mut Starts<'_>,
) -> Result<Running, Option<i32>> {
    match spawn(opts, snapshot, token).await {
        Ok(c) if c.group.is_some() => Ok(c),
        Ok(mut c) => {
            // The watchdog could not start the command (126, 127).
            let code = c.child.wait().await.map_or(127, exit_code);
            Err(starts.failed(code).await)
        }
        Err(e) => {
            error!(command = ?opts.command, error = %e, "cannot start the command's watchdog");
            Err(starts.failed(126).await)
        }
    }
}

/// Exit codes that say the command could not start: 126 cannot execute,
/// 127 not found (the watchdog's, and the shell's, convention).
const START_FAILED: [i32; 2] = [126, 127];

/// Failed starts in a row, against `--start-failures`.
struct Starts<'a> {
    failures: u32,
    delay: Duration,
    opts: &'a RunOptions,
    handle: &'a ElectorHandle,
    shutdown: &'a CancellationToken,
}

impl<'a> Starts<'a> {
    fn new(
        opts: &'a RunOptions,
        handle: &'a ElectorHandle,
        shutdown: &'a CancellationToken,
    ) -> Self {
        Starts {
            failures: 0,
            delay: Duration::from_millis(100),
            opts,
            handle,
            shutdown,
        }
    }

    /// The command started (and ran until it was stopped or exited with
    /// another code): the count starts again.
    fn started(&mut self) {
        self.failures = 0;
        self.delay = Duration::from_millis(100);
    }

    /// The command failed to start with `code`. Below `--start-failures`:
    /// say so, give the term up without a freeze (another candidate may be
    /// able to run the command) and wait a doubling delay; `Some(code)`,
    /// after shutting the run down, when this was the last failure allowed.
    async fn failed(&mut self, code: i32) -> Option<i32> {
        self.failures += 1;
        let (failures, limit) = (self.failures, self.opts.start_failures);
        let command = &self.opts.command;
        let why = if code == 127 {
            "not found"
        } else {
            "cannot be executed"
        };
        if failures >= limit {
            error!(
                ?command,
                code,
                failures,
                "the command failed to start {failures} times in a row ({why}); exiting with its code (--start-failures)"
            );
            self.shutdown.cancel();
            self.handle.release().await;
            return Some(code);
        }
        error!(
            ?command,
            code,
            failures,
            limit,
            "the command failed to start while leading ({why}); resigning so another candidate may run it"
        );
        self.handle.resign(Duration::ZERO).await;
        self.handle.release().await;
        tokio::select! {
            _ = sleep(self.delay) => {}
            _ = self.shutdown.cancelled() => {}
        }
        self.delay = (self.delay * 2).min(Duration::from_secs(10));
        None
    }
}

/// What `--on-child-exit` says to do once the command exited with `code`
/// on its own: restart it (after a doubling delay), resign, or resign and
/// end the run with its code (`Some(code)`).
async fn after_exit(
    code: i32,
    opts: &RunOptions,
    handle: &ElectorHandle,
    shutdown: &CancellationToken,
    restart_delay: &mut Duration,
) -> Option<i32> {
    match opts.on_child_exit {
        OnChildExit::Restart => {
            warn!(code, delay = ?restart_delay, "the command exited; restarting it while leading");
            tokio::select! {
                _ = sleep(*restart_delay) => {}
                _ = shutdown.cancelled() => {}
            }
            *restart_delay = (*restart_delay * 2).min(Duration::from_secs(10));
            None
        }
        OnChildExit::Resign => {
            warn!(code, cooldown = ?opts.resign_cooldown, "the command exited; resigning");
            handle.resign(opts.resign_cooldown).await;
            handle.release().await;
            None
        }
        OnChildExit::Exit => {
            info!(
                code,
                "the command exited; resigning and exiting with its code"
            );
            shutdown.cancel();
            handle.release().await;
            Some(code)
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
    child: &mut Running,
    token: u64,
    valid_until: &mut Instant,
    opts: &RunOptions,
    state: &mut watch::Receiver<LeaderState>,
    shutdown: &CancellationToken,
    signals: &mut Forwarded,
) -> Outcome {
    loop {
        tokio::select! {
            s = child.child.wait() => match s {
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
