//! The capabilities a backend may offer beside the election's term: the
//! candidate registry ([`CandidateRegistry`], see
//! [`candidates`](super::candidates)) and the operator controls
//! ([`ControlStore`], see [`controls`](super::controls)). Each is a trait of
//! its own, delivered beside the election as an `Option` of
//! [`registry::Connected`](super::registry::Connected): a backend that keeps
//! none is simply `None`, so no flag asks a backend what it keeps.
//!
//! Invariant: a backend implements them on the same struct as its
//! [`LeaseBackend`](super::LeaseBackend) (one `Arc` serves all three), so
//! the registry and the controls live over the election's own connection.

use std::time::Duration;

use async_trait::async_trait;

use super::Result;
use super::candidates::{Candidate, Listed};
use super::controls::Controls;

/// The candidate registry of one election: each candidate's record with a
/// TTL, listed by a releasing leader to choose its successor.
#[async_trait]
pub trait CandidateRegistry: Send + Sync {
    /// Write (or renew) `candidate`'s record for `ttl` (whole seconds,
    /// rounded up, where the backend counts so).
    ///
    /// # Errors
    /// Any [`BackendError`](super::BackendError); the record then lapses at
    /// its previous TTL.
    async fn publish_candidate(&self, candidate: &Candidate, ttl: Duration) -> Result<()>;

    /// Remove `identity`'s record (graceful shutdown). Removing a record
    /// that is gone is not an error.
    ///
    /// # Errors
    /// Any [`BackendError`](super::BackendError); the record then lapses by
    /// its TTL.
    async fn withdraw_candidate(&self, identity: &str) -> Result<()>;

    /// The records in the registry, lapsed ones included (see
    /// [`Listed::alive`]).
    ///
    /// # Errors
    /// Any [`BackendError`](super::BackendError).
    async fn candidates(&self) -> Result<Vec<Listed>>;

    /// The records as the backend holds them now, never a copy a watch
    /// keeps (which may trail the backend by a delivery): for a decision an
    /// operator waits on, such as a switchover's check of its target, which
    /// must not be refused on a view older than what `status` just showed.
    /// The default is [`candidates`](CandidateRegistry::candidates), for the
    /// backends whose list is a read of the backend.
    ///
    /// # Errors
    /// Any [`BackendError`](super::BackendError).
    async fn candidates_now(&self) -> Result<Vec<Listed>> {
        self.candidates().await
    }

    /// Resolve when the registry may have changed since the last call (a
    /// record written, renewed with other fields, withdrawn or lapsed), so
    /// a leader re-reads [`candidates`](CandidateRegistry::candidates)
    /// instead of polling.
    ///
    /// # Errors
    /// A transport error or
    /// [`BackendError::WatchEnded`](super::BackendError::WatchEnded); the
    /// caller lists the registry again and calls this again after a backoff.
    async fn watch_candidates(&self) -> Result<()>;

    /// Whether the backend deletes a record once its TTL passes (etcd: the
    /// record is bound to a lease). Such a record is renewed while its
    /// candidate leads too, or the leader's record would vanish from the
    /// registry 12 lease durations into its term. The default: records
    /// lapse but stay listed, so a leader does not renew its own.
    fn deletes_lapsed(&self) -> bool {
        false
    }
}

/// The operator controls of one election (a pause, a switchover request),
/// kept beside its key.
#[async_trait]
pub trait ControlStore: Send + Sync {
    /// Read the election's operator controls.
    ///
    /// # Errors
    /// Any [`BackendError`](super::BackendError).
    async fn controls(&self) -> Result<Controls>;

    /// Resolve with the controls once they differ from `seen`.
    ///
    /// # Errors
    /// A transport error or
    /// [`BackendError::WatchEnded`](super::BackendError::WatchEnded); the
    /// caller reads [`controls`](ControlStore::controls) again.
    async fn watch_controls(&self, seen: &Controls) -> Result<Controls>;

    /// Pause (`true`) or resume (`false`) the election (see
    /// [`controls`](super::controls) for what a pause guarantees).
    ///
    /// # Errors
    /// Any [`BackendError`](super::BackendError).
    async fn set_paused(&self, paused: bool) -> Result<()>;

    /// Ask the leader to hand over to `to` (`Some`), or clear the request
    /// (`None`).
    ///
    /// # Errors
    /// As [`set_paused`](ControlStore::set_paused).
    async fn request_switchover(&self, to: Option<&str>) -> Result<()>;
}
