//! Waiting on the published [`LeaderState`] for leadership to begin or end,
//! for a program that does leader-only work (a controller that reconciles
//! only while leading).
//!
//! Leadership can end without a message: when no renewal is acknowledged
//! before `valid_until`, [`LeaderState::is_leader`] turns false at that
//! instant, before the Elector publishes its step-down. So
//! [`until_not_leading`] also sleeps until the validity runs out.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep};

use super::LeaderState;

/// Longest sleep between two looks at the validity while leading: tokio's
/// clock stops while the host is suspended, so a sleep until `valid_until`
/// would fire late after a resume; looking this often bounds that delay.
pub const LEADING_RECHECK: Duration = Duration::from_millis(250);

/// Wait until this candidate leads. Returns the fencing token of its term,
/// or `None` when the Elector has stopped (its sender is gone).
pub async fn until_leading(state: &mut watch::Receiver<LeaderState>) -> Option<u64> {
    loop {
        {
            let s = state.borrow_and_update();
            if s.is_leader_now() {
                return s.own_term.map(|t| t.fencing_token);
            }
        }
        state.changed().await.ok()?;
    }
}

/// Wait until this candidate no longer leads: a step-down, a resign, the
/// start of shutdown, or `valid_until` passing without an acknowledged
/// renewal (noticed within [`LEADING_RECHECK`] even across a host suspend).
/// Returns at once when it does not lead, and when the Elector has stopped.
pub async fn until_not_leading(state: &mut watch::Receiver<LeaderState>) {
    loop {
        let left = state.borrow_and_update().valid_for(Instant::now());
        if left.is_zero() {
            return;
        }
        tokio::select! {
            changed = state.changed() => if changed.is_err() { return },
            _ = sleep(left.min(LEADING_RECHECK)) => {}
        }
    }
}
