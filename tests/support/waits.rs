//! Polling waits with a limit.

use std::time::Duration;

use tokio::time::{Instant, sleep};

/// Poll `cond` every 5 ms until it holds; panic with `what` after `limit`.
pub async fn wait_for<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if cond().await {
            return;
        }
        if Instant::now() > end {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        sleep(Duration::from_millis(5)).await;
    }
}

/// Whether a TCP connection to `127.0.0.1:port` opens right now.
pub async fn port_open(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// Run blocking `f` from async code without stalling a multi-thread
/// runtime's other tasks (on a current-thread runtime it simply blocks).
pub fn block<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
