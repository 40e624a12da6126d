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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::elector::{Elector, ElectorConfig, OwnTerm};

    #[tokio::test(start_paused = true)]
    async fn leading_begins_with_the_term_and_ends_with_a_resign() {
        let backend = Arc::new(MemoryBackend::new());
        let (elector, mut rx) = Elector::builder(backend)
            .election("e")
            .identity("me")
            .lease_duration(Duration::from_secs(3))
            .build()
            .unwrap();
        let handle = elector.handle();
        let stop = CancellationToken::new();
        let run = tokio::spawn(elector.run(stop.clone()));
        let token = until_leading(&mut rx).await.expect("leads");
        assert_eq!(rx.borrow().own_term.map(|t| t.fencing_token), Some(token));
        assert!(handle.resign(Duration::from_secs(60)).await);
        until_not_leading(&mut rx).await;
        assert!(!rx.borrow().is_leader_now());
        stop.cancel();
        run.await.unwrap();
        assert_eq!(
            until_leading(&mut rx).await,
            None,
            "the Elector has stopped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn leading_ends_at_valid_until_without_a_message() {
        let mut state = LeaderState::new(
            &ElectorConfig::new("e", "me", Duration::from_secs(3)),
            "memory",
        );
        let valid_until = Instant::now() + Duration::from_secs(2);
        state.own_term = Some(OwnTerm {
            valid_until,
            fencing_token: 1,
            suspended_at_send: super::super::suspend::suspended(),
        });
        let (_tx, mut rx) = watch::channel(state);
        until_not_leading(&mut rx).await;
        let late = Instant::now().saturating_duration_since(valid_until);
        assert!(
            Instant::now() >= valid_until && late <= LEADING_RECHECK,
            "{late:?}"
        );
    }
}
