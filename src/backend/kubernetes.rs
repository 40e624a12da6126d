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

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use rand::Rng;
use tokio::sync::OnceCell;
use tokio::time::{Instant, sleep_until};
use tracing::debug;

use super::{BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term};
use crate::coord::{Claim, CoordError, Coordinator, Kind, Outcome, Try};

/// Backend name in logs, metrics and `/leader`.
pub const NAME: &str = "kubernetes";

/// Annotation holding the fencing token of the current (or last) term.
pub const TOKEN_ANNOTATION: &str = "leader-elector/fencing-token";

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
        "forbidden: the ServiceAccount may not {verb} leases.coordination.k8s.io in namespace {namespace} ({message})"
    )]
    Forbidden {
        /// The verb that was denied (`get`, `create`, `update`, `watch`).
        verb: &'static str,
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
    /// Holder identities of acquisitions we sent whose answers never came
    /// back to us (the Elector's deadline dropped the call). If the server
    /// applied one, that term was granted but never claimed by anybody, so
    /// it may be replaced at once (by CAS) instead of waiting out its
    /// silence. The last few only.
    unanswered: Vec<String>,
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
    fn is_unclaimed_own(&self, holder: &str) -> bool {
        !holder.is_empty() && self.unanswered.iter().any(|h| h == holder)
    }
}

struct Conn {
    api: Api<Lease>,
    namespace: String,
    server: String,
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

impl KubeLeaseBackend {
    /// A backend for Lease `name` that connects on first use (in-cluster
    /// config or `KUBECONFIG`), so an unreachable API at start is retried by
    /// the Elector rather than failing the process.
    pub fn new(name: impl Into<String>, options: KubeOptions) -> std::sync::Arc<Self> {
        std::sync::Arc::new(KubeLeaseBackend {
            name: name.into(),
            options,
            conn: OnceCell::new(),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// A backend over an existing client (tests: kube-rs's mock service).
    pub fn with_client(
        client: Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> std::sync::Arc<Self> {
        let namespace = namespace.into();
        let conn = Conn {
            api: Api::namespaced(client, &namespace),
            namespace: namespace.clone(),
            server: "(client)".into(),
        };
        std::sync::Arc::new(KubeLeaseBackend {
            name: name.into(),
            options: KubeOptions {
                namespace: Some(namespace),
            },
            conn: OnceCell::new_with(Some(conn)),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The Lease name (the election name).
    pub fn lease_name(&self) -> &str {
        &self.name
    }

    async fn conn(&self) -> Result<&Conn> {
        self.conn
            .get_or_try_init(|| async {
                let config = kube::Config::infer()
                    .await
                    .map_err(|e| BackendError::Rejected {
                        backend: NAME,
                        code: "no_kubeconfig",
                        source: Box::new(KubeLeaseError::NoConfig(e)),
                    })?;
                let mut config = config;
                // The Elector owns retries and backoff (and every call's
                // deadline); kube-rs's own retry of 429/503/504 would run
                // past them.
                config.default_retry = false;
                let namespace = self
                    .options
                    .namespace
                    .clone()
                    .unwrap_or_else(|| config.default_namespace.clone());
                let server = config.cluster_url.to_string();
                let client = Client::try_from(config).map_err(|e| BackendError::Rejected {
                    backend: NAME,
                    code: "no_kubeconfig",
                    source: Box::new(KubeLeaseError::Client(e)),
                })?;
                debug!(%namespace, %server, lease = %self.name, "kubernetes client ready");
                Ok(Conn {
                    api: Api::namespaced(client, &namespace),
                    namespace,
                    server,
                })
            })
            .await
    }

    /// Classify a kube-rs error once (team rule: 403 names verb, resource and
    /// the Role; 404 on create names the namespace; 429 and 5xx retryable).
    /// The error of a write that lost its compare-and-swap [`CAS_TRIES`]
    /// times in a row while the Lease still named this term.
    fn contended(&self, conn: &Conn) -> BackendError {
        BackendError::Server {
            backend: NAME,
            source: Box::new(KubeLeaseError::Contended {
                namespace: conn.namespace.clone(),
                name: self.name.clone(),
                tries: CAS_TRIES,
            }),
        }
    }

    fn classify(&self, conn: &Conn, verb: &'static str, err: kube::Error) -> BackendError {
        match err {
            kube::Error::Api(status) => {
                let namespace = conn.namespace.clone();
                match status.code {
                    401 => BackendError::Auth {
                        backend: NAME,
                        source: Box::new(KubeLeaseError::Status {
                            verb,
                            namespace,
                            name: self.name.clone(),
                            code: status.code,
                            reason: status.reason.clone(),
                            message: status.message.clone(),
                        }),
                    },
                    403 => BackendError::Auth {
                        backend: NAME,
                        source: Box::new(KubeLeaseError::Forbidden {
                            verb,
                            namespace,
                            message: status.message.clone(),
                        }),
                    },
                    404 if verb == "create" => BackendError::Rejected {
                        backend: NAME,
                        code: "namespace_not_found",
                        source: Box::new(KubeLeaseError::NamespaceNotFound {
                            namespace,
                            message: status.message.clone(),
                        }),
                    },
                    410 => BackendError::WatchEnded {
                        backend: NAME,
                        reason: format!("410 Gone: {}", status.message),
                    },
                    code => {
                        let source = Box::new(KubeLeaseError::Status {
                            verb,
                            namespace,
                            name: self.name.clone(),
                            code,
                            reason: status.reason.clone(),
                            message: status.message.clone(),
                        });
                        match code {
                            429 => BackendError::Rejected {
                                backend: NAME,
                                code: "throttled",
                                source,
                            },
                            400 | 422 => BackendError::Rejected {
                                backend: NAME,
                                code: "invalid",
                                source,
                            },
                            _ => BackendError::Server {
                                backend: NAME,
                                source,
                            },
                        }
                    }
                }
            }
            other => BackendError::Unreachable {
                backend: NAME,
                endpoints: conn.server.clone(),
                source: Box::new(other),
            },
        }
    }

    fn is_conflict(err: &kube::Error) -> bool {
        matches!(err, kube::Error::Api(s) if s.code == 409)
    }

    /// Record a Lease read or written now; a new `resourceVersion` restarts
    /// the silence clock.
    fn observe(&self, lease: &Lease) {
        let mut inner = self.inner.lock().expect("lease state poisoned");
        Self::observe_locked(&mut inner, lease);
    }

    fn observe_locked(inner: &mut Inner, lease: &Lease) {
        let rv = rv_of(lease);
        let changed = inner
            .seen
            .as_ref()
            .is_none_or(|s| s.deleted || rv_of(&s.lease) != rv);
        let changed_at = match &inner.seen {
            Some(s) if !changed => s.changed_at,
            _ => Instant::now(),
        };
        inner.max_token = inner.max_token.max(token_of(lease));
        inner.resume_rv = Some(rv.to_owned());
        inner.seen = Some(Seen {
            lease: lease.clone(),
            changed_at,
            deleted: false,
            absent_since: None,
        });
    }

    fn observe_deleted(&self) {
        let mut inner = self.inner.lock().expect("lease state poisoned");
        if let Some(s) = &mut inner.seen {
            s.deleted = true;
            s.absent_since.get_or_insert_with(Instant::now);
        }
        inner.resume_rv = None;
    }

    /// The Lease's own duration (never our local setting); `fallback` when
    /// the field is missing or not positive.
    fn duration_of(lease: &Lease, fallback: Duration) -> Duration {
        match lease.spec.as_ref().and_then(|s| s.lease_duration_seconds) {
            Some(s) if s > 0 => Duration::from_secs(s as u64),
            _ => fallback,
        }
    }

    /// When the observed holder's term ends by silence (`None`: no holder).
    /// For a deleted Lease the silence counts from when we found it gone.
    fn silence_deadline(seen: &Seen, fallback: Duration) -> Option<Instant> {
        if holder_of(&seen.lease).is_empty() {
            return None;
        }
        let since = seen.absent_since.unwrap_or(seen.changed_at);
        Some(since + Self::duration_of(&seen.lease, fallback))
    }

    fn new_spec(holder: &str, ttl: Duration, transitions: i32) -> LeaseSpec {
        let now = now_micro();
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(lease_duration_secs(ttl)),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn elected(&self, lease: &Lease, holder: String, ttl: Duration) -> Campaign {
        self.observe(lease);
        self.inner.lock().expect("lease state poisoned").own = Some(holder);
        Campaign::Elected(Term {
            holder: holder_view(lease),
            ttl: Duration::from_secs(lease_duration_secs(ttl) as u64),
            servers: None,
        })
    }

    /// Read the Lease; `None` when it does not exist.
    async fn get(&self, conn: &Conn) -> Result<Option<Lease>> {
        match conn.api.get_opt(&self.name).await {
            Ok(Some(l)) => {
                self.observe(&l);
                Ok(Some(l))
            }
            Ok(None) => {
                self.observe_deleted();
                Ok(None)
            }
            Err(e) => Err(self.classify(conn, "get", e)),
        }
    }
}

#[async_trait]
impl LeaseBackend for KubeLeaseBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        _previous: Option<&Holder>,
    ) -> Result<Campaign> {
        let conn = self.conn().await?;
        self.inner.lock().expect("lease state poisoned").ttl = Some(ttl);
        // Two rounds: a lost race (409) is answered by one fresh read.
        for round in 0..2 {
            let current = self.get(conn).await?;
            let now = Instant::now();
            let mine = format!("{identity}_{}", term_id());
            let (max_token, seen) = {
                let inner = self.inner.lock().expect("lease state poisoned");
                (inner.max_token, inner.seen.clone())
            };
            match current {
                None => {
                    // Absent. If we saw a holder whose term may still run
                    // (the Lease was deleted by hand), wait its duration
                    // from when we found the Lease gone.
                    if let Some(s) = &seen
                        && let Some(end) = Self::silence_deadline(s, ttl)
                        && now < end
                        && !self
                            .inner
                            .lock()
                            .expect("lease state poisoned")
                            .is_unclaimed_own(holder_of(&s.lease))
                    {
                        return Ok(Campaign::Waiting {
                            previous: holder_view(&s.lease),
                            retry_after: end - now,
                        });
                    }
                    if round > 0 {
                        // Someone created it between our reads and we lost.
                        break;
                    }
                    let token = (max_token + 1).max(unix_millis());
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(conn.namespace.clone()),
                            annotations: Some(
                                [(TOKEN_ANNOTATION.to_owned(), token.to_string())].into(),
                            ),
                            ..ObjectMeta::default()
                        },
                        spec: Some(Self::new_spec(&mine, ttl, 0)),
                    };
                    self.inner
                        .lock()
                        .expect("lease state poisoned")
                        .send_acquisition(&mine);
                    let r = conn.api.create(&PostParams::default(), &lease).await;
                    self.inner
                        .lock()
                        .expect("lease state poisoned")
                        .answered(&mine);
                    match r {
                        Ok(created) => return Ok(self.elected(&created, mine, ttl)),
                        Err(e) if Self::is_conflict(&e) => continue,
                        Err(e) => return Err(self.classify(conn, "create", e)),
                    }
                }
                Some(lease) => {
                    let holder = holder_of(&lease);
                    let s = seen.expect("observed by get");
                    let unclaimed = self
                        .inner
                        .lock()
                        .expect("lease state poisoned")
                        .is_unclaimed_own(holder);
                    let expired =
                        unclaimed || Self::silence_deadline(&s, ttl).is_none_or(|end| now >= end);
                    if !expired {
                        return Ok(Campaign::Following(holder_view(&lease)));
                    }
                    if round > 0 {
                        break;
                    }
                    debug!(
                        previous = holder,
                        "lease free or silent for its duration; taking it"
                    );
                    let old = lease.spec.clone().unwrap_or_default();
                    let transitions = old.lease_transitions.unwrap_or(0).saturating_add(1);
                    let token = (token_of(&lease).max(max_token)) + 1;
                    let mut next = lease.clone();
                    next.spec = Some(Self::new_spec(&mine, ttl, transitions));
                    next.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(TOKEN_ANNOTATION.to_owned(), token.to_string());
                    self.inner
                        .lock()
                        .expect("lease state poisoned")
                        .send_acquisition(&mine);
                    let r = conn
                        .api
                        .replace(&self.name, &PostParams::default(), &next)
                        .await;
                    self.inner
                        .lock()
                        .expect("lease state poisoned")
                        .answered(&mine);
                    match r {
                        Ok(updated) => return Ok(self.elected(&updated, mine, ttl)),
                        Err(e) if Self::is_conflict(&e) => continue,
                        Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 404) => continue,
                        Err(e) => return Err(self.classify(conn, "update", e)),
                    }
                }
            }
        }
        // Lost a race: report what is there now.
        let inner = self.inner.lock().expect("lease state poisoned");
        match &inner.seen {
            Some(s) if !s.deleted && !holder_of(&s.lease).is_empty() => {
                Ok(Campaign::Following(holder_view(&s.lease)))
            }
            Some(s) => Ok(Campaign::Waiting {
                previous: holder_view(&s.lease),
                retry_after: Duration::from_millis(100),
            }),
            None => Ok(Campaign::Waiting {
                previous: Holder {
                    identity: String::new(),
                    fencing_token: 0,
                    term_id: String::new(),
                    revision: 0,
                    expires_in: None,
                },
                retry_after: Duration::from_millis(100),
            }),
        }
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let conn = self.conn().await?;
        let ours = &term.holder.term_id;
        for _ in 0..CAS_TRIES {
            let base = {
                let inner = self.inner.lock().expect("lease state poisoned");
                match &inner.seen {
                    Some(s) if s.deleted => return Ok(Renewal::Lost(LostReason::KeyDeleted)),
                    Some(s) if holder_of(&s.lease) != ours => {
                        return Ok(Renewal::Lost(LostReason::KeyOverwritten));
                    }
                    Some(s) => s.lease.clone(),
                    None => return Ok(Renewal::Lost(LostReason::KeyDeleted)),
                }
            };
            let mut next = base;
            let spec = next.spec.get_or_insert_with(Default::default);
            spec.renew_time = Some(now_micro());
            let ttl = Self::duration_of(&next, term.ttl);
            match conn
                .api
                .replace(&self.name, &PostParams::default(), &next)
                .await
            {
                Ok(updated) => {
                    self.observe(&updated);
                    return Ok(Renewal::Renewed { ttl, servers: None });
                }
                Err(e) if Self::is_conflict(&e) => {
                    // Someone else wrote: re-read and decide; never overwrite.
                    if self.get(conn).await?.is_none() {
                        return Ok(Renewal::Lost(LostReason::KeyDeleted));
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.observe_deleted();
                    return Ok(Renewal::Lost(LostReason::KeyDeleted));
                }
                Err(e) => return Err(self.classify(conn, "update", e)),
            }
        }
        Err(self.contended(conn))
    }

    async fn resign(&self, term: &Term) -> Result<()> {
        let conn = self.conn().await?;
        let ours = &term.holder.term_id;
        for _ in 0..CAS_TRIES {
            let base = {
                let inner = self.inner.lock().expect("lease state poisoned");
                match &inner.seen {
                    Some(s) if !s.deleted && holder_of(&s.lease) == ours => s.lease.clone(),
                    // Gone or someone else's: nothing of ours to release.
                    _ => {
                        drop(inner);
                        self.inner.lock().expect("poisoned").own = None;
                        return Ok(());
                    }
                }
            };
            let mut next = base;
            let spec = next.spec.get_or_insert_with(Default::default);
            let now = now_micro();
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            match conn
                .api
                .replace(&self.name, &PostParams::default(), &next)
                .await
            {
                Ok(updated) => {
                    self.observe(&updated);
                    self.inner.lock().expect("poisoned").own = None;
                    return Ok(());
                }
                Err(e) if Self::is_conflict(&e) => {
                    self.get(conn).await?;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.observe_deleted();
                    return Ok(());
                }
                Err(e) => return Err(self.classify(conn, "update", e)),
            }
        }
        Err(self.contended(conn))
    }

    async fn read(&self) -> Result<Option<Holder>> {
        let conn = self.conn().await?;
        Ok(self
            .get(conn)
            .await?
            .filter(|l| !holder_of(l).is_empty())
            .map(|l| holder_view(&l)))
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        let conn = self.conn().await?;
        loop {
            let (rv, deadline, leading, fallback) = {
                let inner = self.inner.lock().expect("lease state poisoned");
                let fallback = inner.ttl.unwrap_or(Duration::from_secs(15));
                let Some(s) = &inner.seen else {
                    return Ok(());
                };
                if s.deleted || holder_of(&s.lease) != seen.term_id {
                    return Ok(());
                }
                let leading = inner.own.as_deref() == Some(seen.term_id.as_str());
                let rv = inner
                    .resume_rv
                    .clone()
                    .unwrap_or_else(|| rv_of(&s.lease).to_owned());
                (rv, Self::silence_deadline(s, fallback), leading, fallback)
            };
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", self.name))
                .timeout(WATCH_TIMEOUT_SECS);
            // A hung API must not hold a follower past the silence deadline.
            let wake = if leading { None } else { deadline };
            let stream = tokio::select! {
                r = conn.api.watch(&params, &rv) => r.map_err(|e| self.classify(conn, "watch", e))?,
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    debug!(holder = %seen.term_id, "no change of the lease for its duration: expired");
                    return Ok(());
                }
            };
            futures_util::pin_mut!(stream);
            let mut deadline = deadline;
            loop {
                let wake = if leading { None } else { deadline };
                let ev = tokio::select! {
                    ev = stream.next() => ev,
                    _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                        debug!(holder = %seen.term_id, "no change of the lease for its duration: expired");
                        return Ok(());
                    }
                };
                match ev {
                    None => break, // server-side timeout: reopen from resume_rv
                    Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                        if holder_of(&l) != seen.term_id {
                            self.observe(&l);
                            return Ok(());
                        }
                        let mut inner = self.inner.lock().expect("lease state poisoned");
                        if leading {
                            // Our own renewals: the update answers are the
                            // CAS versions; only the resume point moves.
                            inner.resume_rv = Some(rv_of(&l).to_owned());
                        } else {
                            Self::observe_locked(&mut inner, &l);
                            deadline = inner
                                .seen
                                .as_ref()
                                .and_then(|s| Self::silence_deadline(s, fallback));
                        }
                    }
                    Some(Ok(WatchEvent::Deleted(_))) => {
                        self.observe_deleted();
                        return Ok(());
                    }
                    Some(Ok(WatchEvent::Bookmark(b))) => {
                        self.inner.lock().expect("lease state poisoned").resume_rv =
                            Some(b.metadata.resource_version);
                    }
                    Some(Ok(WatchEvent::Error(status))) => {
                        return Err(self.classify(conn, "watch", kube::Error::Api(status)));
                    }
                    Some(Err(e)) => return Err(self.classify(conn, "watch", e)),
                }
            }
        }
    }
}

/// The coordination API on this backend: not served. Named locks, semaphores
/// and job claims need etcd (all of them) or a single Redis (all but fair
/// locks); every call answers [`CoordError::Unsupported`], which the control
/// API turns into 400 with this message.
#[derive(Debug, Default, Clone, Copy)]
pub struct KubeCoord;

/// The message of every coordination call on the Lease backend.
pub const COORD_UNSUPPORTED: &str = "the coordination API (locks, semaphores, job claims) is not served by the kubernetes backend: use --backend etcd (locks, fair locks, semaphores, job claims) or --backend redis with one --redis-url (locks, semaphores, job claims); leadership works on all three";

fn unsupported<T>() -> std::result::Result<T, CoordError> {
    Err(CoordError::Unsupported(COORD_UNSUPPORTED.into()))
}

#[async_trait]
impl Coordinator for KubeCoord {
    fn backend(&self) -> &'static str {
        NAME
    }
    async fn lock(&self, _: &str, _: &str, _: Duration) -> std::result::Result<Try, CoordError> {
        unsupported()
    }
    async fn lock_fair(
        &self,
        _: &str,
        _: &str,
        _: Duration,
        _: Duration,
    ) -> std::result::Result<Try, CoordError> {
        unsupported()
    }
    async fn semaphore(
        &self,
        _: &str,
        _: &str,
        _: u32,
        _: Duration,
    ) -> std::result::Result<Try, CoordError> {
        unsupported()
    }
    async fn renew(
        &self,
        _: Kind,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        unsupported()
    }
    async fn release(&self, _: Kind, _: &str, _: &str) -> std::result::Result<Outcome, CoordError> {
        unsupported()
    }
    async fn claim(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Claim, CoordError> {
        unsupported()
    }
    async fn complete(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> std::result::Result<Outcome, CoordError> {
        unsupported()
    }
}

#[cfg(test)]
#[path = "kubernetes_tests.rs"]
mod tests;
