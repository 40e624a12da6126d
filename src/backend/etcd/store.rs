//! One etcd store under the election ([`super::EtcdBackend`]) and the
//! coordination API ([`crate::backend::etcd::coord::EtcdCoord`]): the shared client,
//! the error classification, the deadline wrapper, and the lease life cycle
//! every key of ours follows (etcd docs, "Lease"): grant a lease, bind a key
//! to it in one compare-and-put transaction, revoke the lease when the key is
//! not needed (which deletes the key with it).
//!
//! Errors are classified by gRPC status code and by the type of the transport
//! error (rustls), never by message text.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, Identity, ResponseHeader, TlsOptions, Txn, TxnResponse,
};
use tokio::sync::Mutex;

use super::EtcdOptions;
use crate::backend::{About, BackendError, Result, is_tls_error};

/// The backend's name in errors and metrics.
pub const BACKEND: &About = &About {
    name: "etcd",
    tls_hint: "check --etcd-ca-file (the CA that signed the server certificate), the server name in the endpoint URL, and --etcd-cert-file/--etcd-key-file if the server requires client certificates",
    auth_hint: "check --etcd-username and the password in --etcd-password-file, and that the user has read-write permission on the election prefix",
    rejected: &[],
    expiry: "its lease has less than a second left by etcd's count (TimeToLive rounds down): its holder did not keep it alive, or is about to",
    open_cause: Some(open_cause),
};

/// One cause's own text and the next cause. etcd-client's error does not
/// expose its cause through `source()`, and a `tonic::Status` prints its
/// source's `Debug` form: both are opened here (by type, not by text).
fn open_cause<'a>(
    cause: &'a (dyn std::error::Error + 'static),
) -> Option<(String, Option<&'a (dyn std::error::Error + 'static)>)> {
    let status = match cause.downcast_ref::<etcd_client::Error>() {
        Some(etcd_client::Error::GRpcStatus(s)) => Some(s),
        Some(etcd_client::Error::TransportError(t)) => return Some((String::new(), Some(t))),
        _ => cause.downcast_ref::<tonic::Status>(),
    };
    match status {
        Some(s) => Some((s.message().to_owned(), std::error::Error::source(s))),
        // Says only "transport error": its cause says which.
        None if cause.is::<tonic::transport::Error>() => Some((String::new(), cause.source())),
        None => None,
    }
}

/// A lease granted by etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The lease id.
    pub id: i64,
    /// The TTL etcd granted: whole seconds, at least 1 s (etcd may raise a
    /// shorter request to its minimum TTL).
    pub ttl: Duration,
}

/// A compare-and-put transaction run under a fresh lease.
pub struct Created {
    /// The lease the put binds the key to. When the transaction's compare
    /// failed it is revoked already.
    pub lease: Lease,
    /// etcd's answer: `succeeded()` tells whether the key was put.
    pub resp: TxnResponse,
}

/// The shared etcd client and its error classification.
pub struct EtcdStore {
    options: EtcdOptions,
    endpoints_text: String,
    client: Mutex<Option<Client>>,
}

/// A lease id as the hex text of term ids and tokens.
pub fn lease_hex(lease: i64) -> String {
    format!("{lease:x}")
}

/// The store revision an answer was served at (0 when etcd sent no header).
pub fn revision_of(header: Option<&ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

/// The TTL to ask etcd for: whole seconds, rounded up, at least 1.
pub fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_secs_f64().ceil().max(1.0) as i64
}

impl EtcdStore {
    /// A store for `options`. Does not connect: the first call does, so an
    /// etcd that is down at start-up is not fatal.
    pub fn new(options: EtcdOptions) -> Self {
        let endpoints_text = options.endpoints.join(",");
        EtcdStore {
            options,
            endpoints_text,
            client: Mutex::new(None),
        }
    }

    /// The shared etcd client, connecting on first use.
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

    /// The shared client, connecting within `limit` when one is given.
    ///
    /// # Errors
    /// As [`EtcdStore::client`]; [`BackendError::Timeout`] (`connect`) when
    /// `limit` passes first.
    pub async fn client_within(&self, limit: Option<Duration>) -> Result<Client> {
        let Some(limit) = limit else {
            return self.client().await;
        };
        tokio::time::timeout(limit, self.client())
            .await
            .unwrap_or_else(|_| Err(self.timeout("connect", limit)))
    }

    /// Classify an etcd-client error (by gRPC code and error type).
    /// `authenticating`: the error answers the connection's Authenticate
    /// call, where etcd says "wrong user or password" with InvalidArgument.
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
            Some(Code::Unavailable) | None => self.unreachable(Box::new(err)),
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

    /// [`BackendError::Unreachable`] for these endpoints.
    pub fn unreachable(
        &self,
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    ) -> BackendError {
        BackendError::Unreachable {
            backend: BACKEND,
            endpoints: self.endpoints_text.clone(),
            source,
        }
    }

    fn timeout(&self, call: &'static str, limit: Duration) -> BackendError {
        BackendError::Timeout {
            backend: BACKEND,
            call,
            timeout_ms: limit.as_millis() as u64,
        }
    }

    /// Classify a failed call; after an authentication failure forget the
    /// connection, so the next call authenticates again (the password file
    /// may have been fixed).
    pub async fn failed(&self, err: etcd_client::Error) -> BackendError {
        let err = self.classify(err, false);
        if matches!(err, BackendError::Auth { .. }) {
            *self.client.lock().await = None;
        }
        err
    }

    /// Run one etcd call `what`, within `limit` when one is given, and
    /// classify its error.
    ///
    /// # Errors
    /// The call's classified error; [`BackendError::Timeout`] naming `what`
    /// when `limit` passes first.
    pub async fn call<T>(
        &self,
        limit: Option<Duration>,
        what: &'static str,
        f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        let answer = match limit {
            Some(limit) => match tokio::time::timeout(limit, f).await {
                Ok(answer) => answer,
                Err(_) => return Err(self.timeout(what, limit)),
            },
            None => f.await,
        };
        match answer {
            Ok(v) => Ok(v),
            Err(e) => Err(self.failed(e).await),
        }
    }

    /// Grant a lease of `ttl` (rounded up to whole seconds).
    ///
    /// # Errors
    /// As [`EtcdStore::call`].
    pub async fn grant(
        &self,
        client: &mut Client,
        ttl: Duration,
        limit: Option<Duration>,
    ) -> Result<Lease> {
        let g = self
            .call(
                limit,
                "lease grant",
                client.lease_grant(ttl_secs(ttl), None),
            )
            .await?;
        Ok(Lease {
            id: g.id(),
            ttl: Duration::from_secs(g.ttl().max(1) as u64),
        })
    }

    /// Revoke `lease`, deleting the keys bound to it. A lease that is gone
    /// already (NotFound) is not an error.
    ///
    /// # Errors
    /// As [`EtcdStore::call`].
    pub async fn revoke(
        &self,
        client: &mut Client,
        lease: i64,
        limit: Option<Duration>,
    ) -> Result<()> {
        let revoke = async {
            match client.lease_revoke(lease).await {
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => {
                    Ok(())
                }
                other => other.map(|_| ()),
            }
        };
        self.call(limit, "lease revoke", revoke).await
    }

    /// Give up a lease we no longer need after `error`: revoke it, unless
    /// etcd did not answer (then the revoke would only add another wait; the
    /// lease expires with its TTL anyway). Best effort.
    pub async fn abandon(
        &self,
        client: &mut Client,
        lease: i64,
        limit: Option<Duration>,
        error: &BackendError,
    ) {
        if !matches!(
            error,
            BackendError::Timeout { .. } | BackendError::Unreachable { .. }
        ) {
            let _ = self.revoke(client, lease, limit).await;
        }
    }

    /// Run `txn`, a compare-and-put binding a key to `lease`. When the
    /// compare fails the lease is revoked (its key was not put); when the
    /// call fails it is abandoned ([`EtcdStore::abandon`]).
    ///
    /// # Errors
    /// As [`EtcdStore::call`].
    pub async fn put_under(
        &self,
        client: &mut Client,
        lease: Lease,
        txn: Txn,
        limit: Option<Duration>,
    ) -> Result<Created> {
        let resp = match self.call(limit, "txn", client.txn(txn)).await {
            Ok(resp) => resp,
            Err(e) => {
                self.abandon(client, lease.id, limit, &e).await;
                return Err(e);
            }
        };
        if !resp.succeeded() {
            let _ = self.revoke(client, lease.id, limit).await;
        }
        Ok(Created { lease, resp })
    }

    /// Grant a lease of `ttl`, then run the compare-and-put `txn(lease id)`
    /// under it ([`EtcdStore::put_under`]): the grant → transaction → revoke
    /// sequence of every key bound to its own lease.
    ///
    /// # Errors
    /// As [`EtcdStore::call`].
    pub async fn create(
        &self,
        client: &mut Client,
        ttl: Duration,
        limit: Option<Duration>,
        txn: impl FnOnce(i64) -> Txn,
    ) -> Result<Created> {
        let lease = self.grant(client, ttl, limit).await?;
        self.put_under(client, lease, txn(lease.id), limit).await
    }

    /// The seconds left of `lease` (`LeaseTimeToLive`); <= 0 when it is gone.
    ///
    /// # Errors
    /// As [`EtcdStore::call`].
    pub async fn time_to_live(
        &self,
        client: &Client,
        lease: i64,
        limit: Option<Duration>,
    ) -> Result<i64> {
        let mut leases = client.lease_client();
        let left = self
            .call(
                limit,
                "lease time-to-live",
                leases.time_to_live(lease, None),
            )
            .await?;
        Ok(left.ttl())
    }
}
