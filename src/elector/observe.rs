//! What the Elector reports to an observer (the Prometheus metrics): one
//! [`Observation`] per step of the loop, through the one-method [`Observer`]
//! trait. The Elector knows no metric names and does not depend on
//! [`crate::metrics`]; the metrics implement this trait (the dependency points
//! from the observer to the observed, so there is no module cycle).
//!
//! Observers are called synchronously from the loop, so they must not block:
//! counters and gauges only. They cannot change what the Elector does.

use std::time::Duration;

/// One step of the election loop, as seen by an observer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Observation {
    /// A campaign (an attempt to acquire the key) is about to be sent.
    CampaignSent,
    /// A campaign failed with a backend error of this
    /// [`crate::backend::BackendError::reason`].
    CampaignFailed {
        /// The error's reason (`unreachable`, `timeout`, …).
        reason: &'static str,
    },
    /// A renewal of our term is about to be sent.
    RenewSent,
    /// A renewal was acknowledged after this round trip.
    Renewed {
        /// From sending the renewal to its acknowledgement.
        round_trip: Duration,
    },
    /// A renewal failed with a backend error of this reason; it is retried
    /// within the renew cycle (client-go's slow path).
    RenewFailed {
        /// The error's reason.
        reason: &'static str,
    },
    /// The last backend call succeeded (`true`) or failed (`false`).
    BackendUp(bool),
    /// The observed leader changed (including to or from nobody); the long-poll
    /// index moved by one.
    Transition,
    /// A new term was observed; the previous one was last shown alive by a
    /// backend answer sent this long before.
    Failover {
        /// From the send instant of the last answer showing the previous
        /// term to the observation of the new one.
        took: Duration,
    },
    /// This leader handed its term over on purpose, for `reason`:
    /// `shutdown`, `resign`, `switchover`, `preemption`, `revision` or
    /// `unhealthy` (a lost term or a missed deadline is no handover).
    Handover {
        /// Why, in the words above.
        reason: &'static str,
    },
    /// This candidate was frozen (`POST /resign?freeze=`) until this
    /// instant of the monotonic clock (`None`: the freeze ended).
    Frozen(Option<tokio::time::Instant>),
    /// The candidate registry as this leader last listed it: the records
    /// alive, by whether they are ready (and not frozen).
    Candidates {
        /// Ready and not frozen.
        ready: u32,
        /// Not ready, or frozen.
        not_ready: u32,
    },
}

/// Receives the Elector's [`Observation`]s. The sidecar's Prometheus
/// metrics implement it; pass yours to
/// [`ElectorBuilder::observer`](super::ElectorBuilder::observer).
pub trait Observer: Send + Sync {
    /// Record one observation. Called on the Elector's task: must not block.
    fn observe(&self, observation: Observation);
}
