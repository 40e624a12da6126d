//! The Pod labeler: patch a label on this sidecar's own Pod — `"true"` while
//! it leads, `"false"` otherwise — so a Service can select only the leader;
//! clear stale `"true"` labels left by a leader that died; record a
//! Kubernetes Event per transition, as client-go does.
//!
//! Invariants:
//! - The labeler only reads `LeaderState`; a failed patch (403 from RBAC,
//!   404, API down, timeout) is logged with the cause and the fix, counted,
//!   and retried with backoff. It never changes who leads or stops the process.
//! - Order: `"false"` at start-up; `"true"` after the term is acquired;
//!   `"false"` before the key is released. The labeler publishes the fencing
//!   token it still labels `"true"` for (a participant of the Elector), and the
//!   Elector waits for it (briefly) before releasing, so on a graceful
//!   handover the old Pod leaves the Service before the new one joins.
//! - A label edited by hand is put back on the next transition or renewal.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::time::Duration;

/// Default label key (`--pod-label-key`).
pub const DEFAULT_LABEL_KEY: &str = "leader-elector/leader";

/// Deadline of each Kubernetes API call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and what to label.
#[derive(Clone, Debug)]
pub struct LabelerConfig {
    /// Label key, e.g. `leader-elector/leader`.
    pub key: String,
    /// This Pod's name (`POD_NAME`).
    pub pod: String,
    /// This Pod's namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// Record a Kubernetes Event on the Pod for each transition.
    pub events: bool,
}

/// Check a label key: `[prefix/]name`, name ≤ 63 characters of
/// `[A-Za-z0-9._-]` starting and ending alphanumeric, prefix a DNS subdomain
/// (Kubernetes "Labels and Selectors").
///
/// # Errors
/// A message saying what is wrong.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !name_ok {
        return Err(format!(
            "{key} is not a label key: the name part must be 1-63 characters of letters, digits, '-', '_', '.', starting and ending with a letter or digit"
        ));
    }
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "{key} is not a label key: the prefix must be a lowercase DNS subdomain, e.g. example.com/leader"
            ));
        }
    }
    Ok(())
}

#[cfg(feature = "kubernetes")]
mod pod;
#[cfg(test)]
mod policy_tests;
#[cfg(feature = "kubernetes")]
pub use pod::{check_permissions, client, run_labeler};
