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
//!   compared with the local clock. The leader's side of the rule (claim only
//!   until send instant + duration − drift margin) is the Elector's.
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
//!   (tests/kubernetes_fault.rs, seed 1904014402476089950).

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::Api;
use rand::Rng;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term};

/// Backend name in logs, metrics and `/leader`.
pub const NAME: &str = "kubernetes";

/// The Lease backend's name and advice (see [`About`](crate::backend::About)).
pub const ABOUT: &crate::backend::About = &crate::backend::About {
    name: NAME,
    tls_hint: "check the API server's CA: the ServiceAccount's ca.crt in a Pod, or certificate-authority(-data) in the kubeconfig, and the server address",
    auth_hint: "bind the Pod's ServiceAccount to a Role with get, list, watch, create, update on leases (apiGroup coordination.k8s.io) in the election namespace: the chart's Role <release>-leader-elector, or manifests/role.yaml, has them",
    rejected: &[
        (
            "namespace_not_found",
            "create the namespace, or fix --election-namespace (default: $POD_NAMESPACE, else the kubeconfig's namespace)",
        ),
        (
            "throttled",
            "the API server is throttling (429, API Priority and Fairness); retrying with backoff",
        ),
        (
            "invalid",
            "the API server rejected the Lease: the election name must be a lowercase DNS subdomain name (letters, digits, '-', '.')",
        ),
        (
            "no_kubeconfig",
            "run in a Pod with a ServiceAccount token mounted (automountServiceAccountToken), or set KUBECONFIG",
        ),
    ],
};

/// Annotation holding the fencing token of the current (or last) term.
pub const TOKEN_ANNOTATION: &str = "leader-elector/fencing-token";

/// Annotation a releasing holder writes with the empty holder: the holder
/// identity of the term it released. It proves the release came from the
/// holder itself; a hand edit that clears the holder does not end the
/// previous holder's promise for our followers (see `Seen::carry`).
pub const RELEASED_ANNOTATION: &str = "leader-elector/released-term";

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
        /// Whose credentials were refused (see [`Connected::credentials`]).
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
    /// No client configuration (no in-cluster service account, no KUBECONFIG).
    #[error("no Kubernetes client configuration (in-cluster or KUBECONFIG)")]
    NoConfig(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("cannot build the Kubernetes client")]
    Client(#[source] kube::Error),
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
}

/// What this process last observed of the Lease.
#[derive(Clone, Debug)]
struct Seen {
    /// The Lease as read or written (its `resourceVersion` is the CAS version).
    lease: Lease,
    /// Monotonic instant at which this process first saw this version.
    changed_at: Instant,
    /// The Lease no longer exists (deleted after this version).
    deleted: bool,
    /// Monotonic instant at which this process first found the Lease gone.
    /// The deleted holder's last renewal happened before the deletion, so
    /// its term ends at most its duration after this instant, even when our
    /// view of its renewals was stale (a broken watch).
    absent_since: Option<Instant>,
    /// The latest end of a term promised by an earlier version we saw
    /// (its sight + its duration), unless that term's holder released it
    /// itself ([`RELEASED_ANNOTATION`]). A write by someone else (a shorter
    /// duration, another holder, a cleared holder) can lengthen a
    /// follower's wait but never shorten it below what the holder was
    /// promised, even when the holder's watch is down and it has not seen
    /// the write.
    carry: Option<Instant>,
}

#[derive(Debug, Default)]
struct Inner {
    seen: Option<Seen>,
    /// Highest fencing token this process has observed or written.
    max_token: u64,
    /// Our holder identity (`<identity>_<term id>`) while we hold a term.
    own: Option<String>,
    /// Where a reopened watch resumes (a bookmark may move it past `seen`).
    resume_rv: Option<String>,
    /// Our configured TTL (from the last campaign): the silence to wait for
    /// a Lease that carries no usable `leaseDurationSeconds`.
    ttl: Option<Duration>,
    /// Where a replay of the Lease's changes since this process last found
    /// it absent starts: the deletion's `resourceVersion` (watch), the
    /// version of our last complete view before a read found it gone, or
    /// the version of a LIST that found it absent. `None` while it exists.
    absent_rv: Option<String>,
    /// A Lease we created but may not claim yet (see [`Pending`]).
    pending: Option<Pending>,
    /// Holder identities of acquisitions we sent whose answers never came
    /// back to us (the Elector's deadline dropped the call). If the server
    /// applied one, that term was granted but never claimed by anybody, so
    /// it may be replaced at once (by CAS) instead of waiting out its
    /// silence. The last few only.
    unanswered: Vec<String>,
    /// RBAC denies `watch` on leases: follow by polling.
    no_watch: bool,
    /// The duration of the term we hold, as we wrote it (whole seconds).
    own_ttl: Option<Duration>,
    /// The fencing token of the term we hold, as we wrote it.
    own_token: u64,
    /// RBAC denies `list` on leases: no absence point for a fresh process.
    no_list: bool,
}

/// A Lease this process created whose term it may not claim before
/// `not_before`: between the absence we observed and our create, another
/// term was created (and deleted) that we never saw while it ran, and its
/// holder claims until its last write plus its duration. Its last write was
/// sent before our create was answered, so our create's answer plus that
/// duration is safe. Nobody claims the pending Lease; at `not_before` the
/// next campaign takes it by CAS like any unclaimed Lease.
#[derive(Clone, Debug)]
struct Pending {
    /// Our holder identity written into the Lease.
    holder: String,
    /// The earliest instant at which we may claim it.
    not_before: Instant,
    /// The unseen term that may still run (reported as `Waiting.previous`).
    previous: Holder,
}

/// How many unanswered acquisitions to remember.
const UNANSWERED_KEPT: usize = 8;

impl Inner {
    fn send_acquisition(&mut self, holder: &str) {
        if self.unanswered.len() >= UNANSWERED_KEPT {
            self.unanswered.remove(0);
        }
        self.unanswered.push(holder.to_owned());
    }
    fn answered(&mut self, holder: &str) {
        self.unanswered.retain(|h| h != holder);
    }
    /// An acquisition of ours that nobody claims: never answered, or
    /// created and pending (whatever held it up still holds until
    /// `pending.not_before`).
    fn is_unclaimed_own(&self, holder: &str) -> bool {
        !holder.is_empty()
            && (self.unanswered.iter().any(|h| h == holder)
                || self.pending.as_ref().is_some_and(|p| p.holder == holder))
    }
}

struct Conn {
    api: Api<Lease>,
    client: kube::Client,
    namespace: String,
    server: String,
    /// Whose credentials, for messages.
    credentials: String,
}

/// The Lease backend for one election. Cheap to share behind an `Arc`.
pub struct KubeLeaseBackend {
    name: String,
    options: KubeOptions,
    conn: OnceCell<Conn>,
    inner: Mutex<Inner>,
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
        term_id: full.to_owned(),
        revision: rv_of(lease).parse().unwrap_or(0),
        expires_in: None,
    }
}

mod client;
mod connect;
pub use connect::{Connected, FIELD_MANAGER, USER_AGENT, build_client, connect, may};
#[cfg(test)]
pub(crate) mod mock;
mod replay;
mod verbs;
mod watch;

#[cfg(test)]
#[path = "kubernetes_tests.rs"]
mod tests;
