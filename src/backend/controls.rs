//! Operator controls of an election kept in its backend beside the
//! election key: a pause marker and a switchover request. Anyone with
//! access to the backend sets them (`leader-elector pause|resume|switchover`);
//! every sidecar of the election follows them
//! ([`LeaseBackend::watch_controls`](super::LeaseBackend::watch_controls)).
//!
//! Invariants:
//! - While [`Controls::paused`], a backend never starts a new term: its
//!   [`campaign`](super::LeaseBackend::campaign) answers
//!   [`Campaign::Waiting`](super::Campaign::Waiting) with [`PAUSED`] as the
//!   reason, decided in the same atomic step that would take the key (an
//!   etcd transaction's compare, a Redis script, a Lease's
//!   compare-and-swap), so a pause set before a campaign's write can never
//!   lose to it. A holder's renewals are not affected: the leader keeps
//!   its term.
//! - A switchover request is only a request: the leader acts on it by a
//!   graceful handover naming the target as successor, and the
//!   compare-and-swap still decides who leads.

/// The `why` of [`Campaign::Waiting`](super::Campaign::Waiting) while the
/// election is paused.
pub const PAUSED: &str = "the election is paused (leader-elector pause): no candidate takes a released or expired term until leader-elector resume";

/// The operator controls of one election.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Controls {
    /// Whether the election is paused: no new term starts; a leader keeps its term.
    pub paused: bool,
    /// The identity a switchover was requested to, until the leader acts on
    /// it (it clears the request when it hands over or refuses).
    pub switchover: Option<String>,
}
