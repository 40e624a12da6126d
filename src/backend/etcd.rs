//! The etcd backend: one key `<prefix><election>` bound to a lease.
//!
//! - **Campaign**: grant a lease, then one transaction: if the key's
//!   `create_revision == 0` put our identity with the lease, else read the key.
//!   The fencing token is the key's `create_revision` (strictly larger for every
//!   new key). Before campaigning on a key whose holder we saw, check with
//!   `LeaseTimeToLive` that the holder's lease is gone: a key deleted by hand
//!   does not end the holder's term (DESIGN.md, "A follower takes over only when
//!   the previous term is over").
//! - **Renew**: one keep-alive on a stream we own (etcd-client leaves the
//!   cadence to the caller; an answer with `ttl <= 0` means the lease is gone),
//!   and in the same round trip a read of the key to prove it is still bound to
//!   our lease. Ownership is decided by lease id, never by identity.
//! - **Resign**: revoke the lease, which deletes the key.
//! - **Watch**: a watch on the key from the revision after the last read.
//!
//! Errors are classified by gRPC status code and by the type of the transport
//! error (rustls), never by message text.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, Identity, TlsOptions, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::Mutex;
use tracing::debug;

use super::{
    BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term, is_tls_error,
};

const BACKEND: &str = "etcd";

/// How to reach etcd. Secrets are held in memory only and never logged.
#[derive(Clone, Default)]
pub struct EtcdOptions {
    /// Client URLs, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// PEM of the CA that signed the servers' certificates (TLS).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key (mutual TLS).
    pub client_cert_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// User name and password (etcd auth).
    pub credentials: Option<(String, String)>,
    /// Deadline for establishing a connection.
    pub connect_timeout: Duration,
    /// Interval of HTTP/2 keep-alive pings, so a connection that silently stops
    /// answering fails its streams (watches) instead of hanging.
    pub keepalive_interval: Duration,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .finish()
    }
}

struct KeepAlive {
    lease: i64,
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
    /// Set while a keep-alive is outstanding. If the caller's timeout dropped
    /// that call, its late answer could be mistaken for the next one's, so a
    /// stream found in flight is replaced.
    in_flight: bool,
}

/// The etcd [`LeaseBackend`] for one election key.
pub struct EtcdBackend {
    key: Vec<u8>,
    options: EtcdOptions,
    endpoints_text: String,
    client: Mutex<Option<Client>>,
    keep_alive: Mutex<Option<KeepAlive>>,
}

impl EtcdBackend {
    /// The election key, e.g. `/leader-elector/billing`.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// A backend for the key `key` (`<prefix><election>`). Does not connect:
    /// the first call does, so an etcd that is down at start-up is not fatal.
    pub fn new(key: impl Into<Vec<u8>>, options: EtcdOptions) -> Arc<Self> {
        let endpoints_text = options.endpoints.join(",");
        Arc::new(EtcdBackend {
            key: key.into(),
            options,
            endpoints_text,
            client: Mutex::new(None),
            keep_alive: Mutex::new(None),
        })
    }

    /// The shared etcd client (connecting on first use), for the coordination API.
    ///
    /// # Errors
    /// A classified [`BackendError`] when etcd cannot be reached or rejects us.
    pub async fn client(&self) -> Result<Client> {
        let mut guard = self.client.lock().await;
        if let Some(client) = guard.as_ref() {
            return Ok(client.clone());
        }
        let o = &self.options;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(o.connect_timeout)
            .with_keep_alive(o.keepalive_interval, o.keepalive_interval / 2)
            .with_keep_alive_while_idle(true)
            .with_auto_token_refresh(true);
        if let Some(ca) = &o.ca_pem {
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
            if let Some((cert, key)) = &o.client_cert_pem {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(tls);
        }
        if let Some((user, password)) = &o.credentials {
            opts = opts.with_user(user.clone(), password.clone());
        }
        let client = Client::connect(&o.endpoints, Some(opts))
            .await
            .map_err(|e| self.classify(e, true))?;
        *guard = Some(client.clone());
        Ok(client)
    }

    /// Forget the connection after an authentication failure, so the next call
    /// authenticates again (the password file may have been fixed).
    async fn reset_on_auth(&self, err: &BackendError) {
        if matches!(err, BackendError::Auth { .. }) {
            *self.client.lock().await = None;
        }
    }

    /// Classify an etcd-client error (by gRPC code and error type).
    pub fn classify(&self, err: etcd_client::Error, authenticating: bool) -> BackendError {
        use tonic::Code;
        // etcd_client::Error does not expose its cause through `source()`;
        // start the walk at the wrapped status or transport error.
        let tls = match &err {
            etcd_client::Error::GRpcStatus(status) => is_tls_error(status),
            etcd_client::Error::TransportError(t) => is_tls_error(t),
            etcd_client::Error::IoError(io) => is_tls_error(io),
            other => is_tls_error(other),
        };
        if tls {
            return BackendError::Tls {
                backend: BACKEND,
                endpoints: self.endpoints_text.clone(),
                source: Box::new(err),
            };
        }
        let code = match &err {
            etcd_client::Error::GRpcStatus(status) => Some(status.code()),
            _ => None,
        };
        match code {
            Some(Code::Unauthenticated | Code::PermissionDenied) => BackendError::Auth {
                backend: BACKEND,
                source: Box::new(err),
            },
            // etcd answers a wrong user or password with InvalidArgument
            // (ErrGRPCAuthFailed); only Authenticate can produce it here.
            Some(Code::InvalidArgument) if authenticating => BackendError::Auth {
                backend: BACKEND,
                source: Box::new(err),
            },
            Some(Code::Unavailable) | None => BackendError::Unreachable {
                backend: BACKEND,
                endpoints: self.endpoints_text.clone(),
                source: Box::new(err),
            },
            Some(Code::DeadlineExceeded) => BackendError::Timeout {
                backend: BACKEND,
                call: "request",
                timeout_ms: self.options.connect_timeout.as_millis() as u64,
            },
            Some(_) => BackendError::Server {
                backend: BACKEND,
                source: Box::new(err),
            },
        }
    }

    async fn call_failed(&self, err: etcd_client::Error) -> BackendError {
        let err = self.classify(err, false);
        self.reset_on_auth(&err).await;
        err
    }

    fn holder_from(&self, kv: &etcd_client::KeyValue, revision: i64) -> Holder {
        Holder {
            identity: String::from_utf8_lossy(kv.value()).into_owned(),
            fencing_token: kv.create_revision().max(0) as u64,
            term_id: format!("{:x}", kv.lease()),
            revision,
            expires_in: None,
        }
    }
}

fn lease_of(term_id: &str) -> i64 {
    i64::from_str_radix(term_id, 16).unwrap_or(0)
}

#[async_trait]
impl LeaseBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign> {
        let mut client = self.client().await?;
        // Check that the previous term is over and grant our lease in the same
        // round trip (handover latency: two round trips, not three).
        let ttl_secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let prev_lease = previous.map_or(0, |p| lease_of(&p.term_id));
        let mut lease_client = client.lease_client();
        let mut ttl_client = client.lease_client();
        let (left, grant) = tokio::join!(
            async {
                if prev_lease == 0 {
                    Ok(0)
                } else {
                    ttl_client
                        .time_to_live(prev_lease, None)
                        .await
                        .map(|r| r.ttl())
                }
            },
            lease_client.grant(ttl_secs, None)
        );
        let grant = grant.map_err(|e| self.classify(e, false))?;
        let left = match left {
            Ok(l) => l,
            Err(e) => {
                let _ = client.lease_revoke(grant.id()).await;
                return Err(self.classify(e, false));
            }
        };
        if left > 0
            && let Some(prev) = previous
        {
            // The previous term is alive. If its key still stands we simply
            // follow it; if the key was deleted by hand we wait for the lease
            // to end.
            let _ = client.lease_revoke(grant.id()).await;
            let resp = client
                .get(self.key.clone(), None)
                .await
                .map_err(|e| self.classify(e, false))?;
            let revision = resp.header().map_or(0, |h| h.revision());
            if let Some(kv) = resp.kvs().first() {
                return Ok(Campaign::Following(self.holder_from(kv, revision)));
            }
            return Ok(Campaign::Waiting {
                previous: prev.clone(),
                retry_after: Duration::from_secs(left as u64),
            });
        }
        let lease = grant.id();
        let granted = Duration::from_secs(grant.ttl().max(1) as u64);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                identity.as_bytes().to_vec(),
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        let resp = match client.txn(txn).await {
            Ok(resp) => resp,
            Err(e) => {
                // Best effort: an unused lease would expire on its own anyway.
                let _ = client.lease_revoke(lease).await;
                return Err(self.call_failed(e).await);
            }
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        if resp.succeeded() {
            return Ok(Campaign::Elected(Term {
                holder: Holder {
                    identity: identity.to_owned(),
                    fencing_token: revision.max(0) as u64,
                    term_id: format!("{lease:x}"),
                    revision,
                    expires_in: None,
                },
                ttl: granted,
                servers: None,
            }));
        }
        // Not elected: the lease we granted is not needed.
        let _ = client.lease_revoke(lease).await;
        for op in resp.op_responses() {
            if let TxnOpResponse::Get(get) = op
                && let Some(kv) = get.kvs().first()
            {
                return Ok(Campaign::Following(self.holder_from(kv, revision)));
            }
        }
        // The key vanished between the compare and the read: nobody holds it
        // and its previous term is over (it was created under a lease that
        // the txn saw); try again at once.
        Ok(Campaign::Waiting {
            previous: Holder {
                identity: String::new(),
                fencing_token: 0,
                term_id: String::new(),
                revision,
                expires_in: None,
            },
            retry_after: Duration::ZERO,
        })
    }

    async fn read(&self) -> Result<Option<Holder>> {
        let mut client = self.client().await?;
        let resp = client
            .get(self.key.clone(), None)
            .await
            .map_err(|e| self.classify(e, false))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok(resp.kvs().first().map(|kv| self.holder_from(kv, revision)))
    }

    async fn inspect(&self) -> Result<Option<Holder>> {
        let Some(mut holder) = self.read().await? else {
            return Ok(None);
        };
        let lease = lease_of(&holder.term_id);
        if lease != 0 {
            let client = self.client().await?;
            let left = client
                .lease_client()
                .time_to_live(lease, None)
                .await
                .map_err(|e| self.classify(e, false))?
                .ttl();
            // etcd counts whole seconds; <= 0: the lease is gone, the key with it.
            holder.expires_in = Some(Duration::from_secs(left.max(0) as u64));
        }
        Ok(Some(holder))
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let client = self.client().await?;
        let lease = lease_of(&term.holder.term_id);
        let mut guard = self.keep_alive.lock().await;
        let reuse = matches!(guard.as_ref(), Some(k) if k.lease == lease && !k.in_flight);
        if !reuse {
            *guard = None;
            let (keeper, stream) = client
                .lease_client()
                .keep_alive(lease)
                .await
                .map_err(|e| self.classify(e, false))?;
            *guard = Some(KeepAlive {
                lease,
                keeper,
                stream,
                in_flight: false,
            });
        }
        let ka = guard.as_mut().expect("keep-alive stream was just set");
        ka.in_flight = true;
        let keep_alive = async {
            ka.keeper.keep_alive().await?;
            ka.stream.message().await
        };
        let mut kv = client.kv_client();
        let read = kv.get(self.key.clone(), None);
        let (answer, read) = tokio::join!(keep_alive, read);
        let answer = match answer {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                *guard = None;
                return Err(BackendError::Unreachable {
                    backend: BACKEND,
                    endpoints: self.endpoints_text.clone(),
                    source: "keep-alive stream closed by the server".into(),
                });
            }
            Err(e) => {
                *guard = None;
                return Err(self.call_failed(e).await);
            }
        };
        ka.in_flight = false;
        if answer.ttl() <= 0 {
            *guard = None;
            return Ok(Renewal::Lost(LostReason::LeaseExpired));
        }
        let read = read.map_err(|e| self.classify(e, false))?;
        match read.kvs().first() {
            None => Ok(Renewal::Lost(LostReason::KeyDeleted)),
            Some(kv) if kv.lease() != lease => Ok(Renewal::Lost(LostReason::KeyOverwritten)),
            Some(_) => Ok(Renewal::Renewed {
                ttl: Duration::from_secs(answer.ttl() as u64),
                servers: None,
            }),
        }
    }

    async fn resign(&self, term: &Term) -> Result<()> {
        let mut client = self.client().await?;
        let lease = lease_of(&term.holder.term_id);
        {
            let mut guard = self.keep_alive.lock().await;
            if matches!(guard.as_ref(), Some(k) if k.lease == lease) {
                *guard = None;
            }
        }
        match client.lease_revoke(lease).await {
            Ok(_) => Ok(()),
            Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(e) => Err(self.call_failed(e).await),
        }
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        let mut client = self.client().await?;
        let seen_lease = lease_of(&seen.term_id);
        let mut from = seen.revision + 1;
        loop {
            let opts = WatchOptions::new().with_start_revision(from);
            let mut stream = client
                .watch(self.key.clone(), Some(opts))
                .await
                .map_err(|e| self.classify(e, false))?;
            let compacted = loop {
                let msg = stream
                    .message()
                    .await
                    .map_err(|e| self.classify(e, false))?;
                let Some(msg) = msg else {
                    return Err(BackendError::WatchEnded {
                        backend: BACKEND,
                        reason: "stream closed".into(),
                    });
                };
                if msg.canceled() {
                    if msg.compact_revision() > 0 {
                        break msg.compact_revision();
                    }
                    return Err(BackendError::WatchEnded {
                        backend: BACKEND,
                        reason: format!("cancelled: {}", msg.cancel_reason()),
                    });
                }
                for event in msg.events() {
                    match event.event_type() {
                        EventType::Delete => return Ok(()),
                        EventType::Put => {
                            let lease = event.kv().map_or(0, |kv| kv.lease());
                            if lease != seen_lease || seen_lease == 0 {
                                return Ok(());
                            }
                        }
                    }
                }
            };
            // etcd compacted the history we asked for (a long term outlives
            // the compaction window). The events we missed no longer exist;
            // what matters is whether the key still belongs to the same term.
            // Read it, and watch again from the revision of that read, which
            // etcd still has.
            let resp = client
                .get(self.key.clone(), None)
                .await
                .map_err(|e| self.classify(e, false))?;
            let revision = resp.header().map_or(0, |h| h.revision());
            match resp.kvs().first() {
                Some(kv) if seen_lease != 0 && kv.lease() == seen_lease => {
                    debug!(
                        compacted,
                        revision,
                        "watch history compacted; watching again from the current revision"
                    );
                    from = revision + 1;
                }
                _ => return Ok(()),
            }
        }
    }
}
