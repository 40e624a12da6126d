//! The Lease backend's connection, error classification and its record of
//! what it last observed of the Lease (the silence clock of client-go's
//! `observedTime`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::*;

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
            api: Api::namespaced(client.clone(), &namespace),
            client,
            namespace: namespace.clone(),
            server: "(client)".into(),
            credentials: "the client's credentials".into(),
        };
        std::sync::Arc::new(KubeLeaseBackend {
            name: name.into(),
            options: KubeOptions {
                namespace: Some(namespace),
                ..KubeOptions::default()
            },
            conn: OnceCell::new_with(Some(conn)),
            inner: Mutex::new(Inner::default()),
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
                };
                debug!(namespace = %conn.namespace, server = %conn.server, lease = %self.name, "kubernetes client ready");
                self.check_permissions(&conn).await?;
                Ok(conn)
            })
            .await
    }

    /// Ask the API server (SelfSubjectAccessReview) whether these
    /// credentials may use each verb the election uses on leases in the
    /// election namespace. `get`, `create` and `update` are required: a
    /// missing one is an [`BackendError::Auth`] naming it, and nothing is
    /// campaigned. `list` and `watch` can be done without: one warning, and
    /// a fallback (`list`: a created Lease is claimed only after a whole
    /// duration; `watch`: polling at the renew interval). A review that
    /// cannot be made (an old or restricted API server) checks nothing.
    async fn check_permissions(&self, conn: &Conn) -> Result<()> {
        let mut missing = Vec::new();
        for verb in ["get", "create", "update", "list", "watch"] {
            match may(
                &conn.client,
                &conn.namespace,
                "coordination.k8s.io",
                "leases",
                verb,
            )
            .await
            {
                Ok(true) => {}
                Ok(false) => missing.push(verb),
                Err(e) => {
                    warn!(error = %e, "cannot review this sidecar's permissions (SelfSubjectAccessReview); going on without");
                    return Ok(());
                }
            }
        }
        if let Some(verb) = missing
            .iter()
            .find(|v| matches!(**v, "get" | "create" | "update"))
        {
            return Err(BackendError::Auth {
                backend: ABOUT,
                source: Box::new(KubeLeaseError::Forbidden {
                    verb,
                    credentials: conn.credentials.clone(),
                    namespace: conn.namespace.clone(),
                    message: format!(
                        "SelfSubjectAccessReview: not allowed; the election needs get, create and update (missing: {})",
                        missing.join(", ")
                    ),
                }),
            });
        }
        let mut inner = self.inner.lock().expect("lease state poisoned");
        for verb in missing {
            warn!(
                verb,
                namespace = %conn.namespace,
                credentials = %conn.credentials,
                "{} may not {verb} leases.coordination.k8s.io; {}",
                conn.credentials,
                if verb == "watch" {
                    "following the Lease by polling at the renew interval instead of a watch"
                } else {
                    "a Lease this sidecar creates is claimed only after one whole lease duration"
                }
            );
            match verb {
                "watch" => inner.no_watch = true,
                _ => inner.no_list = true,
            }
        }
        Ok(())
    }

    /// Classify a kube-rs error once (team rule: 403 names verb, resource and
    /// the Role; 404 on create names the namespace; 429 and 5xx retryable).
    /// The error of a write that lost its compare-and-swap [`CAS_TRIES`]
    /// times in a row while the Lease still named this term.
    pub(super) fn contended(&self, conn: &Conn) -> BackendError {
        BackendError::Server {
            backend: ABOUT,
            source: Box::new(KubeLeaseError::Contended {
                namespace: conn.namespace.clone(),
                name: self.name.clone(),
                tries: CAS_TRIES,
            }),
        }
    }

    pub(super) fn classify(
        &self,
        conn: &Conn,
        verb: &'static str,
        err: kube::Error,
    ) -> BackendError {
        match err {
            kube::Error::Api(status) => {
                let namespace = conn.namespace.clone();
                match status.code {
                    401 => BackendError::Auth {
                        backend: ABOUT,
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
                        backend: ABOUT,
                        source: Box::new(KubeLeaseError::Forbidden {
                            verb,
                            credentials: conn.credentials.clone(),
                            namespace,
                            message: status.message.clone(),
                        }),
                    },
                    404 if verb == "create" => BackendError::Rejected {
                        backend: ABOUT,
                        code: "namespace_not_found",
                        source: Box::new(KubeLeaseError::NamespaceNotFound {
                            namespace,
                            message: status.message.clone(),
                        }),
                    },
                    410 => BackendError::WatchEnded {
                        backend: ABOUT,
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
                                backend: ABOUT,
                                code: "throttled",
                                source,
                            },
                            400 | 422 => BackendError::Rejected {
                                backend: ABOUT,
                                code: "invalid",
                                source,
                            },
                            _ => BackendError::Server {
                                backend: ABOUT,
                                source,
                            },
                        }
                    }
                }
            }
            other => BackendError::Unreachable {
                backend: ABOUT,
                endpoints: conn.server.clone(),
                source: Box::new(other),
            },
        }
    }

    pub(super) fn is_conflict(err: &kube::Error) -> bool {
        matches!(err, kube::Error::Api(s) if s.code == 409)
    }

    /// Record a Lease read or written now; a new `resourceVersion` restarts
    /// the silence clock.
    pub(super) fn observe(&self, lease: &Lease) {
        let mut inner = self.inner.lock().expect("lease state poisoned");
        Self::observe_locked(&mut inner, lease);
    }

    pub(super) fn observe_locked(inner: &mut Inner, lease: &Lease) {
        let rv = rv_of(lease);
        let changed = inner
            .seen
            .as_ref()
            .is_none_or(|s| s.deleted || rv_of(&s.lease) != rv);
        let changed_at = match &inner.seen {
            Some(s) if !changed => s.changed_at,
            _ => Instant::now(),
        };
        let fallback = inner.ttl.unwrap_or(Duration::from_secs(15));
        let carry = match &inner.seen {
            Some(s) if !changed => s.carry,
            Some(s) if released_by_holder(lease, holder_of(&s.lease)) => None,
            Some(s) => Self::silence_deadline(s, fallback),
            None => None,
        };
        inner.max_token = inner.max_token.max(token_of(lease));
        inner.resume_rv = Some(rv.to_owned());
        inner.absent_rv = None;
        if inner
            .pending
            .as_ref()
            .is_some_and(|p| p.holder != holder_of(lease))
        {
            // Someone else wrote the Lease: our pending create is gone.
            inner.pending = None;
        }
        inner.seen = Some(Seen {
            lease: lease.clone(),
            changed_at,
            deleted: false,
            absent_since: None,
            carry,
        });
    }

    /// Record that the Lease is gone: deleted at version `at` (a watch's
    /// DELETED event, a LIST's version), else after the last version we had
    /// a complete view of. The first absence point of a run of absent reads
    /// is kept: a replay from it misses no term created since.
    pub(super) fn observe_deleted(&self, at: Option<&str>) {
        let mut inner = self.inner.lock().expect("lease state poisoned");
        if let Some(s) = &mut inner.seen {
            s.deleted = true;
            s.absent_since.get_or_insert_with(Instant::now);
        }
        let resume = inner.resume_rv.take();
        if inner.absent_rv.is_none() {
            inner.absent_rv = at.map(str::to_owned).or(resume);
        }
    }

    /// The Lease's own duration (never our local setting); `fallback` when
    /// the field is missing or not positive.
    pub(super) fn duration_of(lease: &Lease, fallback: Duration) -> Duration {
        match lease.spec.as_ref().and_then(|s| s.lease_duration_seconds) {
            Some(s) if s > 0 => Duration::from_secs(s as u64),
            _ => fallback,
        }
    }

    /// When the observed holder's term ends by silence (`None`: no holder
    /// and no earlier promise). For a deleted Lease the silence counts from
    /// when we found it gone. Never before an earlier version's promise
    /// ([`Seen::carry`]).
    pub(super) fn silence_deadline(seen: &Seen, fallback: Duration) -> Option<Instant> {
        if holder_of(&seen.lease).is_empty() {
            return seen.carry;
        }
        let since = seen.absent_since.unwrap_or(seen.changed_at);
        let own = since + Self::duration_of(&seen.lease, fallback);
        Some(seen.carry.map_or(own, |c| c.max(own)))
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

    pub(super) fn elected(&self, lease: &Lease, holder: String, ttl: Duration) -> Campaign {
        self.observe(lease);
        let mut inner = self.inner.lock().expect("lease state poisoned");
        inner.own = Some(holder);
        inner.own_ttl = Some(Duration::from_secs(lease_duration_secs(ttl) as u64));
        inner.own_token = token_of(lease);
        inner.pending = None;
        drop(inner);
        Campaign::Elected(Term {
            holder: holder_view(lease),
            ttl: Duration::from_secs(lease_duration_secs(ttl) as u64),
            servers: None,
        })
    }

    /// Read the Lease; `None` when it does not exist. A GET; when it finds
    /// nothing and this process has no version of the Lease yet (a fresh
    /// process), a LIST of that one name follows: its version is the first
    /// point from which this process has seen every change, where a replay
    /// may start ([`Self::after_create`]).
    pub(super) async fn get(&self, conn: &Conn) -> Result<Option<Lease>> {
        match conn.api.get_opt(&self.name).await {
            Ok(Some(l)) => {
                self.observe(&l);
                Ok(Some(l))
            }
            Ok(None) => {
                let known = {
                    let inner = self.inner.lock().expect("lease state poisoned");
                    inner.resume_rv.is_some() || inner.absent_rv.is_some()
                };
                if known {
                    self.observe_deleted(None);
                    return Ok(None);
                }
                self.list(conn).await
            }
            Err(e) => Err(self.classify(conn, "get", e)),
        }
    }

    /// LIST the Lease by name (`fieldSelector=metadata.name=…`); a watch
    /// resumes from the list's version (current, never compacted). Without
    /// `list` (RBAC): a GET, and no absence point (one warning).
    pub(super) async fn list(&self, conn: &Conn) -> Result<Option<Lease>> {
        if self.inner.lock().expect("lease state poisoned").no_list {
            return self.get_only(conn).await;
        }
        let params = ListParams::default().fields(&format!("metadata.name={}", self.name));
        let list = match conn.api.list(&params).await {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(namespace = %conn.namespace, credentials = %conn.credentials, message = %s.message,
                    "{} may not list leases.coordination.k8s.io; a Lease this sidecar creates is claimed only after one whole lease duration", conn.credentials);
                self.inner.lock().expect("lease state poisoned").no_list = true;
                return self.get_only(conn).await;
            }
            Err(e) => return Err(self.classify(conn, "list", e)),
        };
        let version = list.metadata.resource_version.clone();
        Ok(match list.items.into_iter().next() {
            Some(l) => {
                self.observe(&l);
                if version.is_some() {
                    self.inner.lock().expect("lease state poisoned").resume_rv = version;
                }
                Some(l)
            }
            None => {
                self.observe_deleted(version.as_deref());
                None
            }
        })
    }

    /// A GET that records what it finds (a 404: absent, no absence point).
    async fn get_only(&self, conn: &Conn) -> Result<Option<Lease>> {
        match conn.api.get_opt(&self.name).await {
            Ok(Some(l)) => {
                self.observe(&l);
                Ok(Some(l))
            }
            Ok(None) => {
                self.observe_deleted(None);
                Ok(None)
            }
            Err(e) => Err(self.classify(conn, "get", e)),
        }
    }

    /// Read the Lease afresh for a watch to resume from: a LIST by name
    /// (its version is current), else a GET.
    pub(super) async fn list_or_get(&self, conn: &Conn) -> Result<Option<Lease>> {
        self.list(conn).await
    }
}

/// The `User-Agent` of every request: `leader-elector/<version>` (the API
/// server's audit log shows it).
pub const USER_AGENT: &str = concat!("leader-elector/", env!("CARGO_PKG_VERSION"));

/// The field manager named on every write (`managedFields` shows it).
pub const FIELD_MANAGER: &str = "leader-elector";

/// A client and what it talks to.
pub struct Connected {
    /// The client (no retry layer: the Elector owns retries).
    pub client: Client,
    /// The namespace: the given one, else the configuration's default.
    pub namespace: String,
    /// The API server's URL.
    pub server: String,
    /// Whose credentials these are, for messages: "the Pod's
    /// ServiceAccount (in-cluster)" or "kubeconfig user U (context C)".
    pub credentials: String,
}

/// Connect with the in-cluster configuration or `KUBECONFIG` (kube-rs's
/// `Config::infer`), for the Lease backend and the Pod labeler alike.
///
/// # Errors
/// [`KubeLeaseError::NoConfig`] when there is no configuration,
/// [`KubeLeaseError::Client`] when the client cannot be built from it.
pub async fn connect(namespace: Option<String>) -> Result<Connected, KubeLeaseError> {
    let config = kube::Config::infer()
        .await
        .map_err(KubeLeaseError::NoConfig)?;
    let credentials = credentials_of(&config);
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string();
    let client = build_client(config).map_err(KubeLeaseError::Client)?;
    Ok(Connected {
        client,
        namespace,
        server,
        credentials,
    })
}

/// Whose credentials `config` carries, in words.
fn credentials_of(config: &kube::Config) -> String {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        && std::env::var_os("KUBECONFIG").is_none()
    {
        return "the Pod's ServiceAccount (in-cluster token)".to_owned();
    }
    match kube::config::Kubeconfig::read() {
        Ok(kc) => {
            let context = kc.current_context.clone().unwrap_or_default();
            let user = kc
                .contexts
                .iter()
                .find(|c| c.name == context)
                .and_then(|c| c.context.as_ref())
                .and_then(|c| c.user.clone())
                .unwrap_or_default();
            format!("kubeconfig user {user:?} (context {context:?})")
        }
        Err(_) => format!("the credentials for {}", config.cluster_url),
    }
}

/// A kube-rs client over `config` with `TCP_NODELAY` on every connection
/// (without it the first request on a new TLS connection waits ~40 ms for a
/// delayed ACK), our [`USER_AGENT`], and neither kube-rs's retry layer (the
/// Elector owns retries and deadlines) nor its trace layer (which logs its
/// own ERROR line for every failed connect beside ours).
///
/// # Errors
/// The TLS or authentication configuration cannot be used.
pub fn build_client(mut config: kube::Config) -> Result<Client, kube::Error> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;
    config.headers.push((
        axum::http::header::USER_AGENT,
        axum::http::HeaderValue::from_static(USER_AGENT),
    ));
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

/// Whether these credentials may `verb` `resource` of `group` in
/// `namespace` (a SelfSubjectAccessReview).
///
/// # Errors
/// The review could not be made (the API answered an error).
pub async fn may(
    client: &Client,
    namespace: &str,
    group: &str,
    resource: &str,
    verb: &str,
) -> Result<bool, kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api
        .create(&kube::api::PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Whether `lease` is a release of `previous` written by its holder: the
/// holder cleared, with [`RELEASED_ANNOTATION`] naming `previous`.
fn released_by_holder(lease: &Lease, previous: &str) -> bool {
    !previous.is_empty()
        && holder_of(lease).is_empty()
        && lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RELEASED_ANNOTATION))
            .is_some_and(|v| v == previous)
}
