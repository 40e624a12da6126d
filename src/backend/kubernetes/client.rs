//! The Lease backend's connection, error classification and its record of
//! what it last observed of the Lease (the silence clock of client-go's
//! `observedTime`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::time::Instant;
use tracing::{info, warn};

use super::*;
use crate::kube_client::throttle::{DEFAULT_MAX_WAIT, DEFAULT_RETRY_AFTER};

impl KubeLeaseBackend {
    /// A backend for Lease `name` that connects on first use (in-cluster
    /// config or `KUBECONFIG`), so an unreachable API at start is retried by
    /// the Elector rather than failing the process.
    pub fn new(name: impl Into<String>, options: KubeOptions) -> std::sync::Arc<Self> {
        std::sync::Arc::new(KubeLeaseBackend {
            name: name.into(),
            view: Mutex::new(LeaseView::with_max_clock_skew(options.max_clock_skew)),
            options,
            conn: OnceCell::new(),
            registry_rv: Mutex::default(),
            registry_born: std::sync::OnceLock::new(),
            marks: Mutex::default(),
            registry_watch: tokio::sync::Mutex::default(),
            sightings: tokio::sync::watch::Sender::new(0),
            election_watches: tokio::sync::watch::Sender::new(0),
            roster: Mutex::default(),
        })
    }

    /// A backend for the Lease `name` in `namespace` over your own client,
    /// used as is (no configuration is read).
    ///
    /// The Elector owns retries and deadlines (each call gets two thirds
    /// of the renew interval, then the Elector's backoff), so the client
    /// must not retry by itself: build it with
    /// [`build_client`](crate::kube_client::build_client) from your `kube::Config` (no
    /// retry layer, `TCP_NODELAY`, this crate's `User-Agent`), or set
    /// `config.default_retry = false` before `kube::Client::try_from`.
    /// kube-rs's default client retries 429, 503 and 504 answers itself,
    /// which spends the call's deadline and hides the refusals from the
    /// Elector's backoff and from `/leader`'s error. A client of
    /// [`build_client`](crate::kube_client::build_client)'s also holds requests back until a 429's
    /// `Retry-After` has passed; without it, a 429 waits its
    /// `details.retryAfterSeconds`, else 1 s, and may be sent again sooner
    /// from another path (a watch beside a renewal).
    pub fn with_client(
        client: Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> std::sync::Arc<Self> {
        let namespace = namespace.into();
        let conn = Conn {
            api: Api::namespaced(client.clone(), &namespace),
            client,
            namespace: namespace.clone(),
            server: "(client)".into(),
            credentials: "the client's credentials".into(),
            throttle: Throttle::default(),
        };
        std::sync::Arc::new(KubeLeaseBackend {
            name: name.into(),
            options: KubeOptions {
                namespace: Some(namespace),
                ..KubeOptions::default()
            },
            conn: OnceCell::new_with(Some(conn)),
            view: Mutex::new(LeaseView::default()),
            registry_rv: Mutex::default(),
            registry_born: std::sync::OnceLock::new(),
            marks: Mutex::default(),
            registry_watch: tokio::sync::Mutex::default(),
            sightings: tokio::sync::watch::Sender::new(0),
            election_watches: tokio::sync::watch::Sender::new(0),
            roster: Mutex::default(),
        })
    }

    /// The Lease name (the election name).
    pub fn lease_name(&self) -> &str {
        &self.name
    }

    pub(super) async fn conn(&self) -> Result<&Conn> {
        self.conn
            .get_or_try_init(|| async {
                let connected = connect(self.options.namespace.clone())
                    .await
                    .map_err(|e| BackendError::Rejected {
                        backend: ABOUT,
                        code: "no_kubeconfig",
                        source: Box::new(e),
                    })?;
                let conn = Conn {
                    api: Api::namespaced(connected.client.clone(), &connected.namespace),
                    client: connected.client,
                    namespace: connected.namespace,
                    server: connected.server,
                    credentials: connected.credentials,
                    throttle: connected.throttle,
                };
                // A throttled client waits at most one renew interval.
                conn.throttle
                    .set_max_wait(self.options.poll_every.unwrap_or(DEFAULT_MAX_WAIT));
                info!(namespace = %conn.namespace, server = %conn.server, credentials = %conn.credentials, lease = %self.name, "electing through a Lease on this API server");
                self.check_permissions(&conn).await?;
                Ok(conn)
            })
            .await
    }

    /// The error of a write that lost its compare-and-swap [`CAS_TRIES`]
    /// times in a row while the Lease still named this term: an answer of
    /// the API server (three 409s), not an outage, so it never starts
    /// failsafe.
    pub(super) fn contended(&self, conn: &Conn) -> BackendError {
        BackendError::Rejected {
            backend: ABOUT,
            code: "contended",
            source: Box::new(KubeLeaseError::Contended {
                namespace: conn.namespace.clone(),
                name: self.name.clone(),
                tries: CAS_TRIES,
            }),
        }
    }

    /// Classify a kube-rs error once (team rule: 403 names verb, resource and
    /// the Role; 404 on create names the namespace; 429 throttled, to retry
    /// after its `Retry-After`; 5xx retryable).
    ///
    /// Only a transport error (unreachable), a 5xx (server) and a 429
    /// (throttled) say the API server cannot be used now; every other
    /// status is its answer to this request (a refusal: 401, 403, 404,
    /// 409, 400/422, any other 4xx) and is classified so, because failsafe
    /// starts only on the former (`elector::failsafe::is_outage`).
    pub(super) fn classify(
        &self,
        conn: &Conn,
        verb: &'static str,
        err: kube::Error,
    ) -> BackendError {
        match err {
            kube::Error::Api(status) => self.classify_status(conn, verb, &status),
            other => BackendError::Unreachable {
                backend: ABOUT,
                endpoints: conn.server.clone(),
                source: Box::new(other),
            },
        }
    }

    /// [`Self::classify`] of an API status.
    fn classify_status(
        &self,
        conn: &Conn,
        verb: &'static str,
        status: &kube::core::Status,
    ) -> BackendError {
        let answered = || {
            Box::new(KubeLeaseError::Status {
                verb,
                namespace: conn.namespace.clone(),
                name: self.name.clone(),
                code: status.code,
                reason: reason_of(status),
                message: status.message.clone(),
            })
        };
        let (backend, message) = (ABOUT, status.message.clone());
        match status.code {
            401 => BackendError::Auth {
                backend,
                source: answered(),
            },
            403 => BackendError::Auth {
                backend,
                source: Box::new(KubeLeaseError::Forbidden {
                    verb,
                    credentials: conn.credentials.clone(),
                    namespace: conn.namespace.clone(),
                    message,
                }),
            },
            404 if verb == "create" => BackendError::Rejected {
                backend,
                code: "namespace_not_found",
                source: Box::new(KubeLeaseError::NamespaceNotFound {
                    namespace: conn.namespace.clone(),
                    message,
                }),
            },
            410 => BackendError::WatchEnded {
                backend,
                reason: format!("410 Gone: {message}"),
            },
            429 => BackendError::Throttled {
                backend,
                retry_after: Self::retry_after(conn, status),
                source: answered(),
            },
            code => answer_or_outage(code, answered()),
        }
    }

    /// How long a 429 asks to wait: what is left of the client's
    /// `Retry-After` ([`Throttle`]), else the answer's
    /// `details.retryAfterSeconds` (a client without the layer), else 1 s.
    fn retry_after(conn: &Conn, status: &kube::core::Status) -> Duration {
        let details = status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(s.into()));
        conn.throttle
            .left()
            .or(details)
            .unwrap_or(DEFAULT_RETRY_AFTER)
    }

    pub(super) fn is_conflict(err: &kube::Error) -> bool {
        matches!(err, kube::Error::Api(s) if s.code == 409)
    }

    /// Apply one event (or ask one question) to the view of the Lease, at
    /// the one lock of this backend.
    pub(super) fn view<R>(&self, f: impl FnOnce(&mut LeaseView) -> R) -> R {
        let (out, seen) = {
            let mut v = self.view.lock().expect("lease view poisoned");
            let before = v.sightings();
            let out = f(&mut v);
            (out, (v.sightings() != before).then(|| v.sightings()))
        };
        if let Some(n) = seen {
            self.sightings.send_replace(n);
        }
        out
    }

    /// Record a Lease read or written now (with the wall clock, for the
    /// cold-start rule of `--max-clock-skew`).
    pub(super) fn observe(&self, lease: &Lease) {
        self.roster_saw(lease);
        let wall = k8s_openapi::jiff::Timestamp::now();
        if let Some(ago) = self.view(|v| v.observed_with_wall(lease, Instant::now(), wall)) {
            info!(
                lease = %self.name,
                holder = holder_of(lease),
                renewed_ago = %crate::flags::format_duration(Duration::from_secs(ago.as_secs())),
                "the Lease was last renewed longer ago than its duration + --max-clock-skew: its holder's term has ended, so it may be taken without waiting"
            );
        }
    }

    /// Record that the Lease is gone now, deleted at version `at` if known
    /// ([`LeaseView::deleted`]).
    pub(super) fn observe_deleted(&self, at: Option<&str>) {
        self.view(|v| v.deleted(at, Instant::now()));
    }

    pub(super) fn new_spec(holder: &str, ttl: Duration, transitions: i32) -> LeaseSpec {
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

    /// Our acquisition as `holder` was written as `lease`: the term is ours.
    pub(super) fn elected(&self, lease: &Lease, holder: String, ttl: Duration) -> Campaign {
        Campaign::Elected(self.view(|v| v.elected(lease, holder, ttl, Instant::now())))
    }

    /// Read the Lease; `None` when it does not exist. A GET; when it finds
    /// nothing and this process has no version of the Lease yet (a fresh
    /// process), a LIST of that one name follows: its version is the first
    /// point from which this process has seen every change, where a replay
    /// may start ([`Self::after_create`]).
    pub(super) async fn get(&self, conn: &Conn) -> Result<Option<Lease>> {
        let found = self.get_once(conn).await?;
        let list = found.is_none() && self.view(|v| v.wants_list());
        if list {
            return self.list(conn).await;
        }
        if found.is_none() {
            self.observe_deleted(None);
        }
        Ok(found)
    }

    /// One GET; what it finds is recorded, an absence is left to the caller.
    async fn get_once(&self, conn: &Conn) -> Result<Option<Lease>> {
        let sent = Instant::now();
        let got = conn.api.get_opt(&self.name).await;
        self.view(|v| v.request_took(sent.elapsed()));
        match got {
            Ok(Some(l)) => {
                self.observe(&l);
                Ok(Some(l))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.classify(conn, "get", e)),
        }
    }

    /// A GET that records an absence with no absence point (without `list`).
    async fn get_without_list(&self, conn: &Conn) -> Result<Option<Lease>> {
        let found = self.get_once(conn).await?;
        if found.is_none() {
            self.observe_deleted(None);
        }
        Ok(found)
    }

    /// LIST the Lease by name (`fieldSelector=metadata.name=…`); a watch
    /// resumes from the list's version (current, never compacted). Without
    /// `list` (RBAC): a GET, and no absence point (one warning).
    pub(super) async fn list(&self, conn: &Conn) -> Result<Option<Lease>> {
        if self.view(|v| v.may_not_list()) {
            return self.get_without_list(conn).await;
        }
        let params = ListParams::default().fields(&format!("metadata.name={}", self.name));
        let list = match conn.api.list(&params).await {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(namespace = %conn.namespace, credentials = %conn.credentials, message = %s.message,
                    "{} may not list leases.coordination.k8s.io; a Lease this sidecar creates is claimed only after one whole lease duration", conn.credentials);
                self.view(|v| v.list_denied());
                return self.get_without_list(conn).await;
            }
            Err(e) => return Err(self.classify(conn, "list", e)),
        };
        let version = list.metadata.resource_version.clone();
        Ok(match list.items.into_iter().next() {
            Some(l) => {
                self.observe(&l);
                if let Some(rv) = version {
                    self.view(|v| v.resume_from(rv));
                }
                Some(l)
            }
            None => {
                self.observe_deleted(version.as_deref());
                None
            }
        })
    }
}

/// The `reason` of an API status. API Priority and Fairness answers a 429
/// in plain text, which kube-rs reports as "Failed to parse error data":
/// that one is `TooManyRequests`.
fn reason_of(status: &kube::core::Status) -> String {
    if status.code == 429 {
        "TooManyRequests".to_owned()
    } else {
        status.reason.clone()
    }
}

/// A status none of the named rules covers: a 5xx says the API server
/// cannot serve now (an outage, [`BackendError::Server`]); any other code
/// is its answer to this request (a refusal, [`BackendError::Rejected`]).
fn answer_or_outage(code: u16, source: Box<KubeLeaseError>) -> BackendError {
    let code = match code {
        500..=599 => {
            return BackendError::Server {
                backend: ABOUT,
                source,
            };
        }
        400 | 422 => "invalid",
        404 => "not_found",
        409 => "conflict",
        _ => "refused",
    };
    BackendError::Rejected {
        backend: ABOUT,
        code,
        source,
    }
}
