//! Run mode's watchdog: the small process between the sidecar and the
//! command (`leader-elector __watchdog PARENT_PID -- COMMAND ARGS…`) that
//! makes the command's whole process tree die with the sidecar: a
//! parent-death signal on the command alone would leave the command's own
//! children running after a SIGKILL of the sidecar, reparented to PID 1.
//!
//! How:
//! - The sidecar starts the watchdog in a process group of its own, with one
//!   end of a socket pair (the *lifeline*) as its stdin; the sidecar keeps the
//!   other end (close-on-exec, so nothing else inherits it). The kernel closes
//!   it when the sidecar dies, however it dies (SIGKILL, OOM): the watchdog
//!   reads end-of-file and SIGKILLs every descendant.
//! - The watchdog is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a
//!   descendant whose parent exits is reparented to it rather than to PID 1,
//!   so "every descendant" also covers a grandchild whose parent (a wrapper
//!   script) already died, and one that left the command's process group or
//!   session (`setsid`). Descendants are found in `/proc` by parent pid.
//! - The command runs in a process group of its own, whose id (the command's
//!   pid) the watchdog writes to the lifeline; the sidecar signals that group
//!   (SIGTERM, SIGKILL, forwarded SIGHUP/SIGUSR1/SIGUSR2), which does not
//!   include the watchdog. Signals that reach the watchdog anyway (a wrapper
//!   signalling a group) are blocked: only the sidecar's death or the
//!   command's exit ends it.
//! - When the command exits, the watchdog SIGKILLs what it left behind (for
//!   up to [`CLEANUP_LIMIT`]) and exits with the command's code (128 +
//!   signal when the command was killed).
//!
//! Limits: a descendant that is not killable by this user (a setuid
//! program) survives; a process forked between the last look at `/proc` and
//! the watchdog's exit is missed, except that its parent was just killed; if
//! the watchdog itself is SIGKILLed (by hand, or an OOM kill of it rather
//! than of the sidecar) while the sidecar lives, the command keeps running
//! until the sidecar stops its group. A cgroup (Kubernetes kills a
//! container's whole cgroup) has none of these gaps where it is available.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// How long the watchdog keeps killing and reaping what the command left
/// behind before it exits anyway (what is left is then reparented to PID 1,
/// already sent SIGKILL).
pub const CLEANUP_LIMIT: Duration = Duration::from_secs(1);

/// The signals the watchdog blocks: those a wrapper or the sidecar may send
/// to a group it is in. The command starts with an empty mask (the standard
/// library resets it when spawning).
fn blocked() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        set.add(s);
    }
    set
}

/// The watchdog's `main`: start COMMAND, report its process group on the
/// lifeline (stdin), and kill the whole tree when the lifeline closes or
/// COMMAND exits. Returns the exit code (COMMAND's, 128 + signal when it
/// was killed; 126 when it cannot start, 127 when it is not found; 2 on bad
/// arguments).
pub fn main(args: &[String]) -> i32 {
    let (Some(parent), Some("--"), Some(program)) =
        (args.first(), args.get(1).map(String::as_str), args.get(2))
    else {
        crate::say!("error: __watchdog needs PARENT_PID -- COMMAND [ARGS]...");
        return 2;
    };
    let lifeline = match prepare() {
        Ok(l) => l,
        Err(e) => {
            crate::say!("error: the run-mode watchdog {e}");
            return 126;
        }
    };
    if nix::unistd::getppid().to_string() != *parent {
        // The sidecar died before the watchdog started.
        return 137;
    }
    let child = match Command::new(program)
        .args(&args[3..])
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            crate::say!("error: cannot run {program}: {e}");
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let command = Pid::from_raw(child.id() as i32);
    let mut report = &lifeline;
    // Unheard only when the sidecar is gone, which the lifeline thread sees.
    let _ = writeln!(report, "{command}");
    // A small stack: the thread only reads and walks /proc.
    let watcher = std::thread::Builder::new()
        .name("lifeline".into())
        .stack_size(64 * 1024)
        .spawn(move || watch_lifeline(lifeline));
    if let Err(e) = watcher {
        crate::say!(
            "error: the run-mode watchdog cannot watch its lifeline: {e}; stopping the command"
        );
        kill_descendants_for(CLEANUP_LIMIT);
        return 126;
    }
    let code = reap_until(command);
    kill_descendants_for(CLEANUP_LIMIT);
    code
}

/// Block the forwarded signals (before any thread starts, so every thread
/// inherits the mask), become the subreaper of the command's tree, and take
/// the lifeline from stdin.
///
/// # Errors
/// What the watchdog cannot do, in words following "the run-mode watchdog".
fn prepare() -> Result<UnixStream, String> {
    blocked()
        .thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("cannot become a child subreaper: {e}"))?;
    std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(UnixStream::from)
        .map_err(|e| format!("has no lifeline on stdin: {e}"))
}

/// Block until the lifeline closes (the sidecar is gone), then kill every
/// descendant and exit.
fn watch_lifeline(mut lifeline: UnixStream) {
    let mut buf = [0u8; 64];
    loop {
        match lifeline.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    kill_descendants_for(CLEANUP_LIMIT);
    std::process::exit(137);
}

/// Reap children (the command, and orphans handed to this subreaper) until
/// the command exits; its exit code.
fn reap_until(command: Pid) -> i32 {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => return code,
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == command => return 128 + sig as i32,
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(e) => {
                crate::say!("error: the run-mode watchdog lost its command: {e}");
                return 1;
            }
        }
    }
}

/// SIGKILL every live descendant, reaping the dead, until none is left or
/// `limit` has passed.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn kill_descendants_for(limit: Duration) {
    // No async runtime in the watchdog: std's clock and sleep.
    let end = std::time::Instant::now() + limit;
    loop {
        let live = descendants(Pid::this());
        if live.is_empty() {
            return;
        }
        for pid in live {
            let _ = kill(pid, Signal::SIGKILL);
        }
        while let Ok(s) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if s == WaitStatus::StillAlive {
                break;
            }
        }
        if std::time::Instant::now() >= end {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The live (not zombie) descendants of `root`, read from `/proc`.
fn descendants(root: Pid) -> Vec<Pid> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((state, ppid)) = parse_stat(&stat)
            && state != 'Z'
            && state != 'X'
        {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root.as_raw()];
    while let Some(p) = todo.pop() {
        for c in children.remove(&p).unwrap_or_default() {
            out.push(Pid::from_raw(c));
            todo.push(c);
        }
    }
    out
}

/// The state and parent pid in a `/proc/PID/stat` line (the command name
/// may hold spaces and parentheses: fields are read after the last `)`).
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        assert_eq!(parse_stat("42 (a) b (c)) S 7 42 42 0 -1"), Some(('S', 7)));
        assert_eq!(parse_stat("9 (sleep) Z 1 9 9"), Some(('Z', 1)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_process_has_its_spawned_children_among_its_descendants() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert!(descendants(Pid::this()).contains(&pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!descendants(Pid::this()).contains(&pid));
    }
}
