//! Failsafe: a running leader that cannot reach the backend keeps leading
//! while every member of its roster confirms it over direct peer HTTP
//! (Patroni's DCS failsafe mode, checked first in the election model:
//! `tests/election_model/failsafe.rs`).
//!
//! This module is the protocol as a capability beside the election; it
//! knows no backend and never talks to one:
//! - [`Roster`](crate::failsafe::Roster): the admitted members (identity and peer address), written
//!   by the leader with the term's compare-and-swap into a record that
//!   outlives the term (the model's first counterexample: a roster that
//!   expires with the key lets a never-admitted candidate campaign while
//!   the leader still claims).
//! - [`Heartbeat`](crate::failsafe::Heartbeat) / [`Ack`](crate::failsafe::Ack): what the leader sends each member, and the
//!   member's answer.
//! - [`Promises`](crate::failsafe::Promises): a member's side. It promises not to campaign for the
//!   heartbeat's promise on its own monotonic clock from the receipt, and
//!   a (re)started process waits one maximum promise before it campaigns
//!   (a restart forgets what the old process promised: the model's third
//!   counterexample).
//! - [`Confirmations`](crate::failsafe::Confirmations): the leader's side. It claims only until the
//!   earliest bound **every** required member acknowledged, each counted
//!   from the heartbeat's *send* instant, minus the drift margin; the
//!   required set is every roster the leader *sent* this term since its
//!   last acknowledged write (the model's second counterexample: a renewal
//!   that admitted a member was applied but its answer lost).
//! - [`peer`](crate::failsafe::peer): the peer listener's router (one route) and the heartbeat
//!   client; [`sign`](crate::failsafe::sign): their signatures (HMAC-SHA256 keyed by a shared
//!   secret that never travels; replays refused).
//!
//! The invariant kept: at no instant may a member that promised campaign
//! while the leader counts that promise; a leader whose bound has passed
//! never resumes on a late acknowledgement.

mod confirm;
mod node;
pub mod peer;
mod promise;
pub mod sign;

pub use crate::backend::roster::{Member, Roster, RosterStore};
pub use confirm::Confirmations;
pub use node::{Failsafe, Hold};
pub use promise::{Promises, Refusal};

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The leader's heartbeat to one member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The election's name (a heartbeat for another election is refused).
    pub election: String,
    /// The leader's identity.
    pub leader: String,
    /// The leader's fencing token (the term it claims).
    pub fencing_token: u64,
    /// How long the member is asked not to campaign, from the receipt on
    /// its own clock, in milliseconds (the `until` of the design, sent as
    /// a duration because the two clocks share no epoch).
    pub promise_ms: u64,
}

impl Heartbeat {
    /// The promise asked for.
    pub fn promise(&self) -> Duration {
        Duration::from_millis(self.promise_ms)
    }
}

/// A member's answer to a heartbeat it accepted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The member's identity.
    pub member: String,
    /// The promise it gave, in milliseconds (never more than was asked).
    pub promise_ms: u64,
}

#[cfg(test)]
mod tests;
