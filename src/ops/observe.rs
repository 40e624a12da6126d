//! `leader-elector observe`: one line per leadership change until
//! interrupted, read through the backend's `read` and `watch` only.

use std::io::Write;
use std::time::{Duration, SystemTime};

use super::{OpsCli, Output, Report};
use crate::backend::{BackendError, Holder, LeaseBackend};

/// What identifies one term: a change of any of these is a change of leader
/// (or a new term of the same leader).
fn term_key(h: Option<&Holder>) -> Option<(String, u64, String)> {
    h.map(|h| (h.identity.clone(), h.fencing_token, h.term_id.to_string()))
}

/// How often `observe` reads again when no change notice arrives (a crashed
/// Redis holder's key expires without one).
const OBSERVE_POLL: Duration = Duration::from_secs(1);
/// How often `observe` reads while nobody leads (there is nothing to watch):
/// from every 10 ms right after the key became free (a handover ends within
/// milliseconds) to every 500 ms while it stays free.
const OBSERVE_POLL_FREE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_millis(500));

/// `observe`: print the current state, then one line per change, until
/// `stop` resolves or the output is closed. Returns the exit code.
pub async fn observe(
    cli: &OpsCli,
    backend: &dyn LeaseBackend,
    out: &mut dyn Write,
    stop: impl std::future::Future<Output = ()>,
) -> u8 {
    tokio::pin!(stop);
    let mut last: Option<Option<(String, u64, String)>> = None;
    let mut backoff = Duration::from_millis(100);
    let mut free_poll = OBSERVE_POLL_FREE.0;
    loop {
        let read = tokio::select! {
            r = read_holder(cli, backend, &mut backoff) => r,
            _ = &mut stop => return 0,
        };
        let Some(holder) = read else { continue };
        let key = term_key(holder.as_ref());
        if last.as_ref() != Some(&key) {
            let line = change_line(cli, backend.name(), holder.as_ref());
            // A closed output (`| head -1`) ends the command quietly.
            if !crate::console::Lines::new(out).put(&line) {
                return 0;
            }
            last = Some(key);
        }
        tokio::select! {
            _ = next_change(backend, holder.as_ref(), &mut free_poll) => {}
            _ = &mut stop => return 0,
        }
    }
}

/// One read for `observe`: the holder, or `None` after an error (said on
/// stderr, and waited out with a doubling backoff up to 5 s).
async fn read_holder(
    cli: &OpsCli,
    backend: &dyn LeaseBackend,
    backoff: &mut Duration,
) -> Option<Option<Holder>> {
    match tokio::time::timeout(cli.timeout, backend.read()).await {
        Ok(Ok(h)) => {
            *backoff = Duration::from_millis(100);
            Some(h)
        }
        Ok(Err(e)) => {
            crate::say!("error: {}; retrying in {backoff:?}", e.report());
            tokio::time::sleep(*backoff).await;
            *backoff = (*backoff * 2).min(Duration::from_secs(5));
            None
        }
        Err(_) => {
            crate::say!(
                "error: {} did not answer within {}; retrying",
                backend.name(),
                crate::flags::format_duration(cli.timeout)
            );
            None
        }
    }
}

/// Wait until the term may have changed: the holder's watch fires, or its
/// lease may have run out (at most [`OBSERVE_POLL`]); while nobody leads,
/// a poll from every 10 ms, doubling to every 500 ms.
async fn next_change(
    backend: &dyn LeaseBackend,
    holder: Option<&Holder>,
    free_poll: &mut Duration,
) {
    let Some(h) = holder else {
        tokio::time::sleep(*free_poll).await;
        *free_poll = (*free_poll * 2).min(OBSERVE_POLL_FREE.1);
        return;
    };
    *free_poll = OBSERVE_POLL_FREE.0;
    let poll = h.expires_in.map_or(OBSERVE_POLL, |e| {
        (e + Duration::from_millis(10)).min(OBSERVE_POLL)
    });
    tokio::select! {
        r = backend.watch(h) => {
            if let Err(e) = r {
                report_watch_error(&e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        _ = tokio::time::sleep(poll) => {}
    }
}

/// One `observe` line: the holder (or nobody) since now, as a table line or
/// as JSON.
fn change_line(cli: &OpsCli, backend: &'static str, holder: Option<&Holder>) -> String {
    let now = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    match cli.output {
        Output::Json => {
            let mut r = Report::new(&cli.election, backend, holder);
            r.since = Some(now);
            serde_json::to_string(&r).unwrap_or_default()
        }
        Output::Table => match holder {
            Some(h) => format!(
                "{now} {} leads {} (fencing token {})",
                h.identity, cli.election, h.fencing_token
            ),
            None => format!("{now} nobody leads {}", cli.election),
        },
    }
}

fn report_watch_error(e: &BackendError) {
    // A watch that ends (compaction, a broken subscription) is followed by a
    // fresh read; only say so at debug level of detail.
    if !matches!(e, BackendError::WatchEnded { .. }) {
        crate::say!("error: {}; reading again", e.report());
    }
}

/// How often `observe` looks whether its stdout or stderr was closed while
/// nothing is written (`| head -1` on a stable election).
const CLOSED_CHECK: Duration = Duration::from_millis(250);

/// Resolves once stdout or stderr is a pipe or socket whose reader is gone
/// (`observe … | head -1`), seen without writing: a zero-timeout `poll(2)`
/// of both descriptors every [`CLOSED_CHECK`], which reports `POLLERR` (a
/// pipe) or `POLLHUP` (a socket, a terminal) for a closed reader. A file, a
/// terminal or `/dev/null` (where `main` reopened a closed descriptor)
/// never resolves it.
pub(super) async fn output_closed() {
    while !stdio_hung_up() {
        tokio::time::sleep(CLOSED_CHECK).await;
    }
}

fn stdio_hung_up() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let (out, err) = (std::io::stdout(), std::io::stderr());
    // No event asked for: `poll` reports the hang-up and error states anyway.
    let mut fds = [
        PollFd::new(out.as_fd(), PollFlags::empty()),
        PollFd::new(err.as_fd(), PollFlags::empty()),
    ];
    if poll(&mut fds, PollTimeout::ZERO).unwrap_or(0) <= 0 {
        return false;
    }
    let gone = PollFlags::POLLERR | PollFlags::POLLHUP;
    fds.iter()
        .any(|f| f.revents().is_some_and(|r| r.intersects(gone)))
}

/// Resolves on SIGINT or SIGTERM, or when stdout or stderr is closed
/// ([`output_closed`]): what ends `observe` with exit code 0.
pub(super) async fn stop_signal() {
    tokio::select! {
        _ = shutdown_signal() => {}
        _ = output_closed() => {}
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
