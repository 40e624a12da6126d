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

    /// A backend for the Lease `name` in `namespace` over your own client,
    /// used as is (no configuration is read).
    ///
    /// The Elector owns retries and deadlines (each call gets two thirds
    /// of the renew interval, then the Elector's backoff), so the client
    /// must not retry by itself: build it with
    /// [`build_client`] from your `kube::Config` (no
    /// retry layer, `TCP_NODELAY`, this crate's `User-Agent`), or set
    /// `config.default_retry = false` before `kube::Client::try_from`.
    /// kube-rs's default client retries 429, 503 and 504 answers itself,
    /// which spends the call's deadline and hides the refusals from the
    /// Elector's backoff and from `/leader`'s error.
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
                info!(namespace = %conn.namespace, server = %conn.server, credentials = %conn.credentials, lease = %self.name, "electing through a Lease on this API server");
                self.check_permissions(&conn).await?;
                Ok(conn)
            })
            .await
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

    /// When the observed holder's term ends by silence (`None`: free, no
    /// earlier promise). For a deleted Lease the silence counts from when we
    /// found it gone. The duration counted is the Lease's, but never less
    /// than our own `ttl` (a follower may not have seen the version its
    /// holder wrote, only a hand edit of it: candidates of one election run
    /// with one configuration), and never before an earlier version's
    /// promise ([`Seen::carry`]). An empty holder is free only when its
    /// holder released it ([`RELEASED_ANNOTATION`]); cleared by anyone else
    /// (a hand edit, client-go's release) it counts as held.
    pub(super) fn silence_deadline(seen: &Seen, ttl: Duration) -> Option<Instant> {
        let since = seen.absent_since.unwrap_or(seen.changed_at);
        let own = since + Self::duration_of(&seen.lease, ttl).max(ttl);
        if holder_of(&seen.lease).is_empty() && has_release_mark(&seen.lease) {
            return seen.carry;
        }
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
        let found = self.get_once(conn).await?;
        let list = found.is_none() && {
            let inner = self.inner.lock().expect("lease state poisoned");
            inner.resume_rv.is_none() && inner.absent_rv.is_none() && !inner.no_list
        };
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
        match conn.api.get_opt(&self.name).await {
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
        if self.inner.lock().expect("lease state poisoned").no_list {
            return self.get_without_list(conn).await;
        }
        let params = ListParams::default().fields(&format!("metadata.name={}", self.name));
        let list = match conn.api.list(&params).await {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(namespace = %conn.namespace, credentials = %conn.credentials, message = %s.message,
                    "{} may not list leases.coordination.k8s.io; a Lease this sidecar creates is claimed only after one whole lease duration", conn.credentials);
                self.inner.lock().expect("lease state poisoned").no_list = true;
                return self.get_without_list(conn).await;
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
}

/// Whether `lease` carries a release mark (its holder released it; every
/// acquisition removes the mark).
fn has_release_mark(lease: &Lease) -> bool {
    lease
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(RELEASED_ANNOTATION).is_some_and(|v| !v.is_empty()))
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
