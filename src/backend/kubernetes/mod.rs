//! The Kubernetes Lease backend: the election is a `coordination.k8s.io/v1`
//! Lease named after the election, written only by compare-and-swap on its
//! `resourceVersion`.
//!
//! Rules kept here (client-go `tools/leaderelection/leaderelection.go`,
//! `resourcelock/leaselock.go`, and DESIGN.md "Kubernetes Lease backend"):
//! - Acquire, renew and release are `PUT`s carrying the `resourceVersion`
//!   read (or `POST` when the Lease is absent). A 409 means someone else
//!   wrote: re-read, never overwrite. No patch without a precondition.
//! - Ownership is by a per-term id: `holderIdentity` is `<identity>_<term id>`
//!   (what kube-controller-manager writes), so a Pod restarted under the same
//!   name is a stranger to its predecessor's term and waits like any follower.
//! - There is no server-side expiry. A follower judges the Lease expired only
//!   after it has seen no change of the Lease (no new `resourceVersion`) for
//!   the Lease's own `leaseDurationSeconds`, measured on the monotonic clock
//!   from the moment it observed the last change (client-go's
//!   `observedTime`). `renewTime` is written for humans and tools and never
//!   compared with the local clock, except by the opt-in cold-start rule
//!   (`--max-clock-skew`, see `view`) on the first sight of the Lease. The
//!   leader's side of the rule (claim only until send instant + duration −
//!   drift margin) is the Elector's.
//! - Because the API server never ends a term by itself, [`LeaseBackend::watch`]
//!   of a follower also resolves when that silence has lasted the Lease's
//!   duration: it is this backend's analogue of etcd deleting an expired key.
//!   This is the only timer in any backend; the Elector still owns retries.
//! - Release (client-go `release()`): an update by CAS with an empty holder
//!   and `leaseDurationSeconds: 1` (0 is rejected by validation), so a
//!   follower's watch sees the release and takes the Lease at once.
//! - `leaseTransitions` grows by one on every acquisition by a new holder, as
//!   client-go does (it is kept across renewals and releases).
//! - Fencing tokens live in the annotation [`TOKEN_ANNOTATION`]. Every
//!   acquisition by update writes `max(annotation, highest token this
//!   process has seen) + 1`, serialized by the CAS, so tokens strictly grow
//!   while the Lease exists. When the Lease is absent (first use, or deleted
//!   by hand) the creator seeds `max(highest token seen + 1, Unix time in
//!   milliseconds)`: tokens still grow across a deletion when the creator had
//!   followed the election (candidates wait out the deleted holder's term, so
//!   they saw its token), or when its wall clock is ahead of the last token —
//!   true unless more than one acquisition per millisecond happened since the
//!   previous seed, or a clock stepped back by more than that.
//! - A create is claimed only if no term we never saw ran since we found the
//!   Lease absent: after the create answers at version C, the watch replays
//!   the Lease's changes from the absence point (the deletion's version, our
//!   last complete view, or a LIST's version) up to C. A term named there
//!   (created and deleted by hand while we waited, its holder's watch not yet
//!   told) may still run until its last write + its duration, so our Lease is
//!   left unclaimed ([`Campaign::Waiting`]) until the create's answer + that
//!   duration; a replay that cannot be had (410, an error, no absence point)
//!   waits a whole duration. Found by the 30-minute fault soak
//!   (tests/suite/kubernetes_fault.rs, seed 1904014402476089950).
//!
//! - Operator controls are annotations of the election Lease itself
//!   ([`PAUSED_ANNOTATION`], [`SWITCHOVER_ANNOTATION`]), set by a
//!   compare-and-swap that touches nothing else (`controls`). A campaign
//!   never takes a free Lease whose version it writes against is paused
//!   (`view::controls`), so a pause written before that write makes it
//!   answer 409; every write of ours keeps annotations and spec fields it
//!   does not own.
//!
//! The follower's and the leader's rules are one pure state, `view`: every
//! read, watch event and write answer is applied to it as an event, and the
//! verbs act on what it classifies the Lease as at an instant they pass in.
//! It is the only state, behind the only lock, so the rules can be tested
//! by event sequences without an API server; the verbs are the I/O around
//! it, and every write of an existing Lease is one compare-and-swap
//! (`KubeLeaseBackend::cas`).

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::Api;
use rand::Rng;
use tokio::sync::OnceCell;

use super::{BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term};

/// Backend name in logs, metrics and `/leader`.
pub const NAME: &str = "kubernetes";

/// The Lease backend's name and advice (see [`About`](crate::backend::About)).
pub const ABOUT: &crate::backend::About = &crate::backend::About {
    name: NAME,
    tls_hint: "check the API server's CA: the ServiceAccount's ca.crt in a Pod, or certificate-authority(-data) in the kubeconfig, and the server address",
    auth_hint: "bind the Pod's ServiceAccount to a Role with get, list, watch, create, update, delete on leases (apiGroup coordination.k8s.io) in the election namespace: the chart's Role <release>-leader-elector, or manifests/role.yaml, has them",
    rejected: &[
        (
            "namespace_not_found",
            "create the namespace, or fix --election-namespace (default: $POD_NAMESPACE, else the kubeconfig's namespace)",
        ),
        (
            "invalid",
            "the API server rejected the Lease: the election name must be a lowercase DNS subdomain name (letters, digits, '-', '.')",
        ),
        (
            "contended",
            "the Lease kept changing under our writes (three 409 Conflicts in a row): another writer edits it; look for a controller or script that updates it",
        ),
        (
            "conflict",
            "someone else wrote the Lease first (409 Conflict); re-reading it",
        ),
        (
            "not_found",
            "the Lease (or its namespace) was deleted while we used it; re-reading it",
        ),
        (
            "refused",
            "the API server refused the request (an unexpected 4xx); see the message",
        ),
        (
            "no_kubeconfig",
            "run in a Pod with a ServiceAccount token mounted (automountServiceAccountToken), or set KUBECONFIG",
        ),
    ],
    expiry: "the Lease's renewTime + leaseDurationSeconds is past by this machine's clock (an estimate: clocks may differ)",
    open_cause: None,
};

/// Annotation holding the fencing token of the current (or last) term.
pub const TOKEN_ANNOTATION: &str = "leader-elector/fencing-token";

/// Annotation a releasing holder writes with the empty holder: the holder
/// identity of the term it released. It proves the release came from the
/// holder itself; a hand edit that clears the holder does not end the
/// previous holder's promise for our followers (README "Writes by others").
pub const RELEASED_ANNOTATION: &str = "leader-elector/released-term";

/// Annotation a releasing holder writes beside the release: the identity
/// of the candidate it names as successor (a hint; see `view::successor`).
/// An annotation because an API server without the
/// CoordinatedLeaderElection feature gate drops `spec.preferredHolder`.
pub const SUCCESSOR_ANNOTATION: &str = "leader-elector.io/successor";

/// Annotation of the election Lease that pauses the election while it
/// is `"true"`: no candidate takes a released or expired term; the holder
/// keeps renewing (`backend::controls`). Written by `leader-elector pause`
/// (removed by `resume`) or by hand.
pub const PAUSED_ANNOTATION: &str = "leader-elector.io/paused";

/// Annotation of the election Lease naming the identity an operator asked
/// the leader to hand over to (`leader-elector switchover`); absent or
/// empty: no request.
pub const SWITCHOVER_ANNOTATION: &str = "leader-elector.io/switchover";

/// Server-side timeout of one watch request, in seconds; the watch is then
/// reopened from the last `resourceVersion` seen (kube-runtime uses 290 s).
pub const WATCH_TIMEOUT_SECS: u32 = 290;

/// How many times a renew or release re-reads after a 409 that left the Lease
/// ours (someone edited another field) before giving up for this attempt.
const CAS_TRIES: usize = 3;

/// Errors of Kubernetes API calls, as causes of a [`BackendError`].
#[derive(Debug, thiserror::Error)]
pub enum KubeLeaseError {
    /// RBAC denied a verb (403).
    #[error(
        "forbidden: {credentials} may not {verb} leases.coordination.k8s.io in namespace {namespace} ({message})"
    )]
    Forbidden {
        /// The verb that was denied (`get`, `create`, `update`, `watch`).
        verb: &'static str,
        /// Whose credentials were refused (see [`Connected::credentials`](crate::kube_client::Connected::credentials)).
        credentials: String,
        /// The election namespace.
        namespace: String,
        /// The API server's message.
        message: String,
    },
    /// The election namespace does not exist (404 on create).
    #[error("namespace {namespace} not found ({message})")]
    NamespaceNotFound {
        /// The election namespace.
        namespace: String,
        /// The API server's message.
        message: String,
    },
    /// Any other API status.
    #[error("{verb} lease {namespace}/{name}: the API server answered {code} {reason} ({message})")]
    Status {
        /// The verb.
        verb: &'static str,
        /// Namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// HTTP status code.
        code: u16,
        /// Kubernetes `reason` (`TooManyRequests`, `InternalError`, …).
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// Writes kept conflicting while the Lease stayed ours.
    #[error("lease {namespace}/{name}: {tries} updates in a row answered 409 Conflict")]
    Contended {
        /// Namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// Attempts made.
        tries: usize,
    },
    /// No client could be had (no configuration, or one that cannot be
    /// used).
    #[error(transparent)]
    Connect(#[from] crate::kube_client::ConnectError),
}

/// Where the election Lease lives.
#[derive(Clone, Debug, Default)]
pub struct KubeOptions {
    /// `--election-namespace`, else `POD_NAMESPACE`; `None`: the kubeconfig's
    /// namespace (in-cluster: the service account's).
    pub namespace: Option<String>,
    /// How often to read the Lease when this sidecar may not watch it (the
    /// renew interval); `None`: a third of the lease duration.
    pub poll_every: Option<Duration>,
    /// `--max-clock-skew`: the most any two candidates' wall clocks (and
    /// the API server's) may differ. With it, a Lease whose `renewTime` +
    /// duration + this skew has already passed when this process first
    /// reads it is taken at once instead of after a duration of silence;
    /// `None` (the default): never.
    pub max_clock_skew: Option<Duration>,
}

struct Conn {
    api: Api<Lease>,
    client: kube::Client,
    namespace: String,
    server: String,
    /// Whose credentials, for messages.
    credentials: String,
    /// The client's memory of the last 429 (never fed for a client of
    /// [`KubeLeaseBackend::with_client`]'s, which has no such layer).
    throttle: Throttle,
}

/// The Lease backend for one election. Cheap to share behind an `Arc`.
pub struct KubeLeaseBackend {
    name: String,
    options: KubeOptions,
    conn: OnceCell<Conn>,
    /// Everything known of the Lease; the one lock of this backend, never
    /// held across an await.
    view: Mutex<LeaseView>,
    /// The `resourceVersion` of the candidate record this process last
    /// wrote (`candidates`), the precondition of its next renewal.
    registry_rv: Mutex<Option<String>>,
    /// When this process first wrote its candidate record, in ms since the
    /// Unix epoch by its wall clock ([`candidates::CREATED_MS_ANNOTATION`]):
    /// kept across renewals and re-creations.
    registry_born: std::sync::OnceLock<u64>,
    /// Where the watches of the registry and of the controls resume
    /// between calls (`marks`).
    marks: Mutex<Marks>,
    /// The registry watch left open between follow calls
    /// (`registry_watch`).
    registry_watch: tokio::sync::Mutex<Option<registry_watch::Events>>,
    /// The view's count of versions seen, sent at each change: the
    /// controls follow wakes on it instead of a watch of its own.
    sightings: tokio::sync::watch::Sender<u64>,
    /// How many watches of the election Lease are open now (`watch`): while
    /// one is, it delivers every version to the view, and the controls
    /// follow opens no watch of its own.
    election_watches: tokio::sync::watch::Sender<usize>,
    /// The failsafe roster staged for our next write, and what this
    /// process saw of the current term's roster (`roster`).
    roster: Mutex<roster::RosterState>,
}

impl std::fmt::Debug for KubeLeaseBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseBackend")
            .field("name", &self.name)
            .field("namespace", &self.options.namespace)
            .finish()
    }
}

fn lease_duration_secs(ttl: Duration) -> i32 {
    // Whole seconds, rounded up: followers wait at least what we claim.
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    s.clamp(1, i32::MAX as u64) as i32
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn term_id() -> String {
    format!("{:016x}", rand::rng().random::<u64>())
}

fn holder_of(lease: &Lease) -> &str {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("")
}

fn token_of(lease: &Lease) -> u64 {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOKEN_ANNOTATION))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn rv_of(lease: &Lease) -> &str {
    lease.metadata.resource_version.as_deref().unwrap_or("")
}

/// The Pod name in a holder identity `<pod>_<term id>` (the whole string when
/// another tool wrote it without a term id).
pub fn identity_of(holder: &str) -> &str {
    match holder.rsplit_once('_') {
        Some((pod, id)) if !pod.is_empty() && !id.is_empty() => pod,
        _ => holder,
    }
}

fn holder_view(lease: &Lease) -> Holder {
    let full = holder_of(lease);
    Holder {
        identity: identity_of(full).to_owned(),
        fencing_token: token_of(lease),
        term_id: crate::backend::TermId::new(full),
        revision: None,
        expires_in: None,
    }
}

mod candidates;
pub use candidates::{
    ELECTION_LABEL, PRIORITY_ANNOTATION, READY_ANNOTATION, REVISION_ANNOTATION, ROLE_LABEL,
    candidate_lease_name, candidate_selector,
};
mod client;
mod controls;
pub mod coord;
pub mod endpoints_lock;
mod endpoints_record;
pub mod flags;
mod permissions;
use crate::kube_client::{FIELD_MANAGER, connect};
mod registry_watch;
mod release;
mod replay;
mod roster;
pub use roster::{PEER_ADDR_ANNOTATION, ROSTER_ANNOTATION};
mod verbs;
mod view;
mod watch;

use crate::kube_client::throttle::Throttle;
use controls::Marks;
use view::{Hold, LeaseView, Standing, duration_of};

#[cfg(test)]
#[path = "kubernetes_tests.rs"]
pub(super) mod tests;

#[cfg(test)]
#[path = "outage_tests.rs"]
mod outage_tests;
