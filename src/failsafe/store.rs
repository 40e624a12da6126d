//! The roster record as a capability beside the election: a backend that
//! can keep a roster offers a [`RosterStore`] on the same connection; the
//! election seam ([`LeaseBackend`](crate::backend::LeaseBackend)) does not
//! change. The roster itself is written by the backend's own campaign and
//! renewal, in the same atomic step as the term (etcd: the same `Txn`;
//! Redis: the same script; a Lease: the same update), from what the
//! Elector staged for that identity just before it sent them.

use std::time::Duration;

use async_trait::async_trait;

use super::{Member, Roster};
use crate::backend::BackendError;

/// Where a backend keeps the failsafe roster and the members' applications.
#[async_trait]
pub trait RosterStore: Send + Sync {
    /// The roster the election record holds; `None` before the first
    /// failsafe term wrote one (anyone may campaign then).
    ///
    /// # Errors
    /// Any [`BackendError`]; the caller must then not campaign.
    async fn roster(&self) -> Result<Option<Roster>, BackendError>;

    /// Ask to be admitted (or stay admitted): `member`'s application, kept
    /// for `ttl` unless written again. The leader admits the applicants at
    /// its next campaign or renewal.
    ///
    /// # Errors
    /// Any [`BackendError`]; the application then lapses at its last TTL.
    async fn apply(&self, member: &Member, ttl: Duration) -> Result<(), BackendError>;

    /// Withdraw `identity`'s application (graceful shutdown): the leader's
    /// next write leaves it off the roster.
    ///
    /// # Errors
    /// Any [`BackendError`]; the application then lapses by its TTL.
    async fn withdraw(&self, identity: &str) -> Result<(), BackendError>;

    /// The applications alive now.
    ///
    /// # Errors
    /// Any [`BackendError`].
    async fn applicants(&self) -> Result<Vec<Member>, BackendError>;

    /// The roster `identity`'s next campaign or renewal writes with its
    /// term, in the same compare-and-swap (replacing any staged before).
    fn stage(&self, identity: &str, roster: Roster);
}
