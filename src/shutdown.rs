//! Signal handling: the first SIGTERM or SIGINT cancels the shutdown token
//! (the sidecar then stops claiming, resigns and exits 0); a second signal
//! ends [`on_signals`], and the app returns
//! [`RunError::SecondSignal`](crate::app::RunError::SecondSignal) to `main`,
//! which exits at once with code 1.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Wait for SIGTERM or SIGINT and cancel `token`; return on a second signal
/// with its name (`"SIGTERM"` or `"SIGINT"`).
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
    info!(signal = name, "shutting down: stop claiming, resign, exit");
    token.cancel();
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    warn!(signal = name, "second signal: exiting at once");
    Ok(name)
}
