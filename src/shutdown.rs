//! Signal handling: the first SIGTERM or SIGINT cancels the shutdown token
//! (the sidecar then stops claiming, resigns and exits 0); a signal that
//! comes later than [`REPEAT_WINDOW`] after the first ends [`on_signals`], and
//! the app returns
//! [`RunError::SecondSignal`](crate::app::RunError::SecondSignal) to `main`,
//! which exits at once with code 1.
//!
//! Signals within the window are the same request, not a second one: GNU
//! `timeout`, `tini -g` and shell wrappers send SIGTERM to the child and then
//! to its process group, so one stop arrives twice a moment apart; taken for a
//! second request, the copy would cut the release short and leave the lease
//! held for its whole duration.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Signals this soon after the first are repeats of it (ignored), not a
/// request to exit at once.
pub const REPEAT_WINDOW: Duration = Duration::from_millis(500);

/// Whether a signal received at `now` repeats the first one, received at
/// `first` (it came within [`REPEAT_WINDOW`]).
pub fn is_repeat(first: Instant, now: Instant) -> bool {
    now.saturating_duration_since(first) < REPEAT_WINDOW
}

/// Wait for SIGTERM or SIGINT and cancel `token`; return on a later signal
/// (more than [`REPEAT_WINDOW`] after the first) with its name (`"SIGTERM"`
/// or `"SIGINT"`).
///
/// # Errors
/// An I/O error if the signal handlers cannot be installed.
pub async fn on_signals(token: CancellationToken) -> std::io::Result<&'static str> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    let first = Instant::now();
    info!(signal = name, "shutting down: stop claiming, resign, exit");
    token.cancel();
    loop {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        if is_repeat(first, Instant::now()) {
            debug!(
                signal = name,
                window = ?REPEAT_WINDOW,
                "a repeat of the first signal (a wrapper signalled the process and its group); still shutting down"
            );
            continue;
        }
        warn!(signal = name, "second signal: exiting at once");
        return Ok(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_within_the_window_repeats_the_first_and_a_later_one_does_not() {
        let first = Instant::now();
        assert!(is_repeat(first, first));
        assert!(is_repeat(first, first + Duration::from_millis(1)));
        assert!(is_repeat(first, first + Duration::from_millis(499)));
        assert!(!is_repeat(first, first + REPEAT_WINDOW));
        assert!(!is_repeat(first, first + Duration::from_secs(2)));
    }
}
