//! The `dist_lock_*` metrics of the coordination API.

use std::sync::Mutex;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Names tracked individually in metrics; the rest share `_other`.
pub const MAX_TRACKED_NAMES: usize = 100;

/// `dist_lock_*` metrics, with a cap on label cardinality.
pub struct CoordMetrics {
    pub(super) acquisitions: IntCounterVec,
    pub(super) wait: HistogramVec,
    pub(super) active: IntGaugeVec,
    tracked: Mutex<Vec<String>>,
}

impl CoordMetrics {
    /// Register on `registry`.
    ///
    /// # Errors
    /// A [`prometheus::Error`] when the names are taken.
    pub fn new(registry: &Registry) -> std::result::Result<Self, prometheus::Error> {
        let m = CoordMetrics {
            acquisitions: IntCounterVec::new(
                Opts::new(
                    "dist_lock_acquisitions_total",
                    "Lock, permit and claim attempts by result (acquired, busy, error).",
                ),
                &["lock_name", "result"],
            )?,
            wait: HistogramVec::new(
                HistogramOpts::new(
                    "dist_lock_wait_seconds",
                    "Time from request to grant, in seconds.",
                )
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
                &["lock_name"],
            )?,
            active: IntGaugeVec::new(
                Opts::new(
                    "dist_locks_active",
                    "Locks, permits and claims granted through this sidecar and not released or expired.",
                ),
                &["lock_name"],
            )?,
            tracked: Mutex::new(Vec::new()),
        };
        registry.register(Box::new(m.acquisitions.clone()))?;
        registry.register(Box::new(m.wait.clone()))?;
        registry.register(Box::new(m.active.clone()))?;
        Ok(m)
    }

    pub(super) fn label(&self, name: &str) -> String {
        let mut t = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        if t.iter().any(|n| n == name) {
            return name.to_owned();
        }
        if t.len() < MAX_TRACKED_NAMES {
            t.push(name.to_owned());
            return name.to_owned();
        }
        "_other".to_owned()
    }
}
