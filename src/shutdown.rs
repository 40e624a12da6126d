//! Signal handling: the first SIGTERM or SIGINT cancels the shutdown token
//! (the sidecar then stops claiming, resigns and exits 0); a second signal
//! exits at once with code 1.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Wait for SIGTERM or SIGINT and cancel `token`; on a second signal exit the
/// process at once.
///
/// # Errors
/// An I/O error if the signal handlers cannot be installed.
pub async fn on_signals(token: CancellationToken) -> std::io::Result<()> {
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
    std::process::exit(1);
}
