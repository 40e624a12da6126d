//! Cooperation with the app over HTTP, outside the election loop:
//! - [`health_checker`] polls `--candidate-health-url` and feeds the
//!   Elector's candidacy gate (campaign only while the app is healthy);
//! - [`notifier`] POSTs each transition to `--notify-url`, in order, with
//!   retries and a timeout.
//!
//! Invariant: neither can delay or change an election decision; they only
//! read the Elector's outputs (events) or write the gate it reads.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::elector::Event;

/// Attempts per notification before it is dropped (with a warning).
pub const NOTIFY_ATTEMPTS: u32 = 5;

/// Poll `url` every `interval` (each request under `interval` as its
/// timeout) and publish whether it answered 2xx. Starts as `false` (unknown:
/// do not campaign) until the first answer. Ends on `shutdown`.
pub async fn health_checker(
    url: String,
    interval: Duration,
    gate: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let client = match reqwest::Client::builder().timeout(interval).build() {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "cannot build the health-check client; candidacy is not gated");
            gate.send_replace(true);
            return;
        }
    };
    let mut first = true;
    loop {
        let healthy = match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => true,
            Ok(r) => {
                if *gate.borrow() || first {
                    warn!(url = %url, status = %r.status(), "the app is unhealthy: not a candidate");
                }
                false
            }
            Err(e) => {
                if *gate.borrow() || first {
                    warn!(url = %url, error = %e, "the app's health check failed: not a candidate");
                }
                false
            }
        };
        if healthy && (!*gate.borrow() || first) {
            info!(url = %url, "the app is healthy: a candidate");
        }
        first = false;
        // Only a change is sent: every receiver wakes on a send, and a
        // repeated answer is not news (the registry keeper writes the
        // record on each change of readiness).
        gate.send_if_modified(|was| std::mem::replace(was, healthy) != healthy);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// POST every event from `events` to `url` as JSON, one at a time in order,
/// each attempt under `timeout`, retried up to [`NOTIFY_ATTEMPTS`] times with
/// backoff. Ends when the Elector is gone and the queue is empty.
pub async fn notifier(url: String, mut events: broadcast::Receiver<Event>, timeout: Duration) {
    let client = match reqwest::Client::builder().timeout(timeout).build() {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "cannot build the notification client; notifications are off");
            return;
        }
    };
    loop {
        let event = match events.recv().await {
            Ok(e) => e,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                warn!(url = %url, skipped = n, "notifications fell behind; the oldest were dropped");
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=NOTIFY_ATTEMPTS {
            match client.post(&url).json(&event).send().await {
                Ok(r) if r.status().is_success() => break,
                Ok(r) => {
                    warn!(url = %url, status = %r.status(), attempt, event = event.event.as_str(), "notification refused")
                }
                Err(e) => {
                    warn!(url = %url, error = %e, attempt, event = event.event.as_str(), "notification failed")
                }
            }
            if attempt == NOTIFY_ATTEMPTS {
                warn!(url = %url, event = event.event.as_str(), transitions = event.transitions, "notification dropped after {NOTIFY_ATTEMPTS} attempts");
            } else {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}
