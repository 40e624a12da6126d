//! The backend seam: the [`LeaseBackend`] trait with the four verbs every
//! coordination backend offers (campaign, renew, release, watch), the values
//! they exchange ([`Term`], [`Holder`], [`Campaign`], [`Renewal`]) and the
//! shared [`BackendError`]. The capabilities a backend may keep beside the
//! term, the candidate registry and the operator controls, are traits of
//! their own ([`CandidateRegistry`], [`ControlStore`]), delivered as
//! `Option`s of [`registry::Connected`].
//!
//! Invariant: backends never sleep, never spawn tasks and never decide when to
//! call themselves. The [`crate::elector::Elector`] owns all timing, wraps
//! every call in a timeout and applies the safety rule.
//!
//! What an embedding program needs is re-exported at the crate root; the
//! rest of this module serves the sidecar binary and its tests and is not a
//! stable API.

pub mod both;
pub mod candidates;
mod capabilities;
pub mod controls;
pub mod coordination;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod registry;
pub mod roster;
pub mod shards;
mod waits;

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

pub use capabilities::{CandidateRegistry, ControlStore};
pub use error::BackendError;
pub(crate) use error::is_tls_error;
pub use waits::WaitReason;

/// A backend's id of one term (etcd: its lease; Redis: the random token in
/// the key; a Lease: its `holderIdentity`). Opaque to all but the backend
/// that made it: others compare it and show it (`Display`, its text), and a
/// backend whose id is a number keeps the number ([`TermId::number`]) rather
/// than parsing its own text back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TermId {
    text: String,
    number: Option<i64>,
}

impl TermId {
    /// An id that is its text.
    pub fn new(text: impl Into<String>) -> TermId {
        TermId {
            text: text.into(),
            number: None,
        }
    }

    /// An id that is a number (etcd: a lease id), shown as `text`.
    pub fn numbered(number: i64, text: impl Into<String>) -> TermId {
        TermId {
            text: text.into(),
            number: Some(number),
        }
    }

    /// The id as text, for the wire, logs and `status`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The number, for a backend whose ids are numbers.
    pub fn number(&self) -> Option<i64> {
        self.number
    }
}

impl std::fmt::Display for TermId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq<str> for TermId {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for TermId {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

impl serde::Serialize for TermId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// The candidate that holds an election's key, as a backend last observed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The holder identity stored in the key (a Pod name, usually).
    pub identity: String,
    /// The fencing token of the holder's term (etcd: the key's `mod_revision`, the revision of the write that began the term).
    pub fencing_token: u64,
    /// The backend's id of the term, used to decide ownership and to follow
    /// the term. Never compared with an identity.
    pub term_id: TermId,
    /// Backend position of this observation, where the backend has one that
    /// counts: a watch reports changes after it (etcd: the header revision
    /// of the read). `None` where it has none (Redis) or it is opaque (a
    /// Kubernetes `resourceVersion` is never a number to compare).
    pub revision: Option<i64>,
    /// How long the backend will keep the key without a renewal, when the
    /// backend knows it cheaply (Redis `PTTL`); `None` when a watch reports the
    /// end of the term exactly (etcd).
    pub expires_in: Option<Duration>,
}

/// One term held by this candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// This candidate as the holder of the key; `holder.term_id` proves ownership.
    pub holder: Holder,
    /// How long the term is valid, counted from when the campaign request was
    /// sent: the TTL the backend granted ([`Term::granted`]) less what the
    /// backend's own rule takes off (Redis: the Redlock clock drift allowance,
    /// [`redis::drift`]); at most `granted`. The Elector keeps its safety
    /// margin within this, and reports it as the lease duration.
    pub ttl: Duration,
    /// The TTL the backend set on the key, which each renewal asks for again
    /// (etcd raises small TTLs to its minimum and counts in whole seconds;
    /// Redis: the TTL asked for).
    pub granted: Duration,
    /// Redlock: servers that granted the term, and servers in all. `None` for
    /// a single server.
    pub servers: Option<(usize, usize)>,
}

/// What one campaign attempt found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    /// The key was free and the previous term over: this candidate now leads.
    Elected(Term),
    /// Another term (possibly an earlier process of this same identity) holds the key.
    Following(Holder),
    /// The key is gone but the previous holder's term has not ended yet (its
    /// lease is still alive, e.g. the key was deleted by hand). Campaign again
    /// after `retry_after`.
    Waiting {
        /// The previous holder whose term is still running; `None` when the
        /// backend saw none (the key vanished, or a race was lost before
        /// anything was read).
        previous: Option<Holder>,
        /// Remaining lifetime of the previous term, as the backend reports it.
        retry_after: Duration,
        /// What is being waited for (rendered to words only at the edges:
        /// `/leader`, the log, `status`).
        why: WaitReason,
    },
}

/// Why a term ended without this candidate resigning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The backend reports the lease as gone (etcd keep-alive TTL <= 0).
    LeaseExpired,
    /// The key no longer exists.
    KeyDeleted,
    /// The key now belongs to another term.
    KeyOverwritten,
}

impl LostReason {
    /// A short label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::LeaseExpired => "lease_expired",
            LostReason::KeyDeleted => "key_deleted",
            LostReason::KeyOverwritten => "key_overwritten",
        }
    }
}

/// The answer to a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended; the backend keeps the key for `ttl` from when it
    /// received the request.
    Renewed {
        /// The TTL the backend reports after the renewal.
        ttl: Duration,
        /// Redlock: servers that renewed, and servers in all. `None` for a single server.
        servers: Option<(usize, usize)>,
    },
    /// The term is over; it must not be re-created.
    Lost(LostReason),
}

/// What a backend says about itself, so that nothing else matches it by
/// name: its name (logs, metrics, `/leader`, error messages) and what an
/// operator should do when it refuses the TLS handshake, the credentials or
/// a command. Each backend module defines one; every [`BackendError`]
/// carries its backend's.
#[derive(Debug)]
pub struct About {
    /// The backend's name (`etcd`, `redis`, `kubernetes`, `memory`).
    pub name: &'static str,
    /// Advice for [`BackendError::Tls`].
    pub tls_hint: &'static str,
    /// Advice for [`BackendError::Auth`].
    pub auth_hint: &'static str,
    /// Advice for [`BackendError::Rejected`], by code; a code not listed
    /// gets "retrying with backoff". Advice on a code the sidecar waits out
    /// ends with "; retrying" or ", retrying", which answers nobody retries
    /// leave out ([`BackendError::advice`]).
    pub rejected: &'static [(&'static str, &'static str)],
    /// What a holder whose time left reads 0 ([`Holder::expires_in`])
    /// means on this backend, in `status`'s warning (exit 4).
    pub expiry: &'static str,
    /// How to open a cause of this backend's client library whose text or
    /// `source()` hides what failed: its own text and the next cause, or
    /// `None` for a cause it does not know. `None`: nothing to open.
    pub open_cause: Option<OpenCause>,
}

/// See [`About::open_cause`].
pub type OpenCause = for<'a> fn(
    &'a (dyn std::error::Error + 'static),
) -> Option<(String, Option<&'a (dyn std::error::Error + 'static)>)>;

impl std::fmt::Display for About {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Shorthand for backend results.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// A coordination backend for one election key.
///
/// Implementations are cheap to call concurrently through `&self` but the
/// Elector calls `campaign`, `renew` and `release` one at a time; `watch` may
/// run concurrently with them.
#[async_trait]
pub trait LeaseBackend: Send + Sync {
    /// What the backend says about itself: its name and its advice for
    /// errors ([`About`]).
    fn about(&self) -> &'static About;

    /// The backend's name for logs, metrics and `/leader` (`etcd`, `redis`, `kubernetes`, `memory`).
    fn name(&self) -> &'static str {
        self.about().name
    }

    /// Try once to take the election key for a new term of `identity` with a
    /// lease of `ttl` (the backend may grant a longer TTL; the granted one is in
    /// the returned [`Term`]). `previous` is the holder this candidate last saw;
    /// the backend does not start a new term while that holder's term is still
    /// alive, even if its key is gone.
    ///
    /// # Errors
    /// Any [`BackendError`]; nothing is held when an error is returned.
    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign>;

    /// Extend the lease of `term` once. Never re-creates a key that is gone.
    ///
    /// # Errors
    /// Any [`BackendError`]; the term's state is then unknown.
    async fn renew(&self, term: &Term) -> Result<Renewal>;

    /// End `term` now (etcd: revoke the lease, which deletes the key), so a
    /// follower can take over at once, naming `successor` (an identity the
    /// Elector chose from the registry) so that the other candidates leave
    /// it a head start of [`candidates::successor_wait`] before they
    /// campaign. `None` names nobody (a lost or abandoned term, or no
    /// registry). A backend never chooses a successor itself and never
    /// lists its registry here. Ending a term that is already over is not
    /// an error.
    ///
    /// # Errors
    /// Any [`BackendError`]; the term then ends by TTL.
    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()>;

    /// Read the current holder without campaigning (used while this candidate
    /// stays out of campaigns: resign cooldown, unhealthy app). `None` when
    /// the key is free.
    ///
    /// # Errors
    /// Any [`BackendError`].
    async fn read(&self) -> Result<Option<Holder>>;

    /// Read the current holder for an operator (`leader-elector status`):
    /// like [`LeaseBackend::read`], with `expires_in` filled in where the
    /// backend can tell it (etcd: the lease's remaining TTL, one more call).
    /// Never used by the Elector.
    ///
    /// # Errors
    /// Any [`BackendError`].
    async fn inspect(&self) -> Result<Option<Holder>> {
        self.read().await
    }

    /// Resolve when the key changes after `seen` (deleted, or taken by a term
    /// other than `seen`'s). Pending forever while nothing changes.
    ///
    /// # Errors
    /// [`BackendError::WatchEnded`] when the server cancels the watch, or a
    /// transport error; the caller reads the key again.
    async fn watch(&self, seen: &Holder) -> Result<()>;

    /// The instant (monotonic, tokio's clock) at which this backend's own
    /// watch last delivered a version of `holder`'s term that it had not
    /// seen before: evidence that the holder wrote its key since the
    /// previous version. A version seen again (a re-read, a reopened
    /// watch, a relist) never counts, nor does a version first seen by a
    /// read. `None` when the watch delivered none, when the key now names
    /// another term, or when the backend's watch does not see renewals
    /// (the default: an etcd keep-alive and a Redis `PEXPIRE` write no new
    /// version). A follower reads the key in its place; a backend whose
    /// renewals are writes (a Kubernetes Lease) spares that read while
    /// its watch keeps delivering them.
    fn heard_at(&self, holder: &Holder) -> Option<Instant> {
        let _ = holder;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(backend: &'static About) -> BackendError {
        BackendError::Tls {
            backend,
            endpoints: "x".into(),
            source: "handshake".into(),
        }
    }

    fn auth(backend: &'static About) -> BackendError {
        BackendError::Auth {
            backend,
            source: "denied".into(),
        }
    }

    fn rejected(backend: &'static About, code: &'static str) -> BackendError {
        BackendError::Rejected {
            backend,
            code,
            source: "no".into(),
        }
    }

    #[test]
    fn each_backend_gives_its_own_advice() {
        let etcd = etcd::store::BACKEND;
        let redis = redis::BACKEND;
        let kube = kubernetes::ABOUT;
        assert!(tls(etcd).hint().contains("--etcd-ca-file"));
        assert!(tls(redis).hint().contains("--redis-ca-file"));
        assert!(tls(kube).hint().contains("ca.crt"), "not etcd's advice");
        assert!(auth(etcd).hint().contains("--etcd-username"));
        assert!(auth(redis).hint().contains("ACL"));
        assert!(auth(kube).hint().contains("ServiceAccount"));
        assert!(
            rejected(redis, "wrongtype")
                .hint()
                .contains("--redis-prefix")
        );
        let throttled = BackendError::Throttled {
            backend: kube,
            retry_after: Duration::from_secs(1),
            source: "429".into(),
        };
        assert!(throttled.hint().contains("throttling"));
        assert_eq!(throttled.reason(), "throttled");
        assert_eq!(throttled.retry_after(), Some(Duration::from_secs(1)));
        // A code is advised on only by the backend that knows it.
        assert_eq!(rejected(etcd, "wrongtype").hint(), "retrying with backoff");
        assert_eq!(rejected(kube, "oom").hint(), "retrying with backoff");
        assert_eq!(rejected(kube, "throttled").hint(), "retrying with backoff");
        // The name is what the message says.
        assert!(auth(kube).to_string().starts_with("kubernetes rejected"));
        assert!(
            tls(redis)
                .report()
                .contains("TLS handshake with redis at x failed")
        );
    }

    /// A command that tries once (`status`, `pause`) never says it retries.
    #[test]
    fn a_one_shot_report_does_not_promise_a_retry() {
        let etcd = etcd::store::BACKEND;
        let down = BackendError::Unreachable {
            backend: etcd,
            endpoints: "http://127.0.0.1:1".into(),
            source: "refused".into(),
        };
        assert!(down.report().contains("retrying with backoff"));
        let once = down.report_once();
        assert!(!once.contains("retrying"), "{once}");
        assert!(once.ends_with("endpoints are right)"), "{once}");
        let once = rejected(etcd, "wrongtype").report_once();
        assert!(
            !once.contains("retrying") && !once.contains("(hint"),
            "{once}"
        );
        // Nor what the running sidecar does about the error: a backend's
        // own advice keeps its fix and drops its "retrying".
        for code in ["loading", "oom", redis::UNREPLICATED] {
            let once = rejected(redis::BACKEND, code).report_once();
            assert!(!once.contains("retrying"), "{once}");
            assert!(rejected(redis::BACKEND, code).report().contains("retrying"));
        }
        let once = rejected(redis::BACKEND, "oom").report_once();
        assert!(once.ends_with("raise maxmemory)"), "{once}");
        let ended = BackendError::WatchEnded {
            backend: etcd,
            reason: "compacted".into(),
        };
        assert!(
            !ended.report_once().contains("(hint"),
            "{}",
            ended.report_once()
        );
        let throttled = BackendError::Throttled {
            backend: kubernetes::ABOUT,
            retry_after: Duration::from_secs(1),
            source: "429".into(),
        };
        let once = throttled.report_once();
        assert!(once.contains("throttling this client (HTTP 429"), "{once}");
        assert!(!once.contains("the next request waits"), "{once}");
        assert!(throttled.hint().ends_with("at most one renew interval"));
    }
}
