//! The Kubernetes API client every Kubernetes-facing part shares: the Lease
//! backend, the Pod labeler and the EndpointSlice writer. It is a leaf: it
//! knows the API server and nothing of elections, so readers of the API
//! never import a backend.
//!
//! What lives here, once:
//! - the client stack ([`connect`], [`build_client`]): `TCP_NODELAY`, our
//!   [`USER_AGENT`], no retry or trace layer (the Elector and the writers own
//!   retries), and a [`throttle::Throttle`] that keeps a 429's `Retry-After`;
//! - the [`FIELD_MANAGER`] named on every write;
//! - the permission review ([`review`]): SelfSubjectAccessReviews, remembered
//!   per verb so that a verb that is missing is reviewed again at most once
//!   a minute (a sidecar missing one verb used to send 1–2.5 reviews a
//!   second, forever);
//! - the words for a failed call ([`explain`]): the same kinds and sentences
//!   for every caller, which adds only its own fix.

use kube::Client;

pub mod explain;
#[cfg(test)]
pub(crate) mod mock;
pub mod review;
pub mod throttle;

use throttle::Throttle;

/// Why no client could be had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No client configuration (no in-cluster service account, no KUBECONFIG).
    #[error("no Kubernetes client configuration (in-cluster or KUBECONFIG)")]
    NoConfig(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("cannot build the Kubernetes client")]
    Client(#[source] kube::Error),
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
    /// When the client may send again after a 429 (its `Retry-After`).
    pub throttle: Throttle,
}

/// Connect with the in-cluster configuration or `KUBECONFIG` (kube-rs's
/// `Config::infer`), for the Lease backend and the Pod labeler alike.
///
/// # Errors
/// [`ConnectError::NoConfig`] when there is no configuration,
/// [`ConnectError::Client`] when the client cannot be built from it.
pub async fn connect(namespace: Option<String>) -> Result<Connected, ConnectError> {
    let config = kube::Config::infer()
        .await
        .map_err(ConnectError::NoConfig)?;
    let credentials = credentials_of(&config);
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string();
    let throttle = Throttle::default();
    let client = throttled_client(config, &throttle).map_err(ConnectError::Client)?;
    Ok(Connected {
        client,
        namespace,
        server,
        credentials,
        throttle,
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
/// own ERROR line for every failed connect beside ours). A 429's
/// `Retry-After` is honoured by the client itself (see [`Throttle`]): until
/// it has passed, requests are answered 429 without being sent.
///
/// # Errors
/// The TLS or authentication configuration cannot be used.
pub fn build_client(config: kube::Config) -> Result<Client, kube::Error> {
    throttled_client(config, &Throttle::default())
}

/// [`build_client`] behind `throttle`.
fn throttled_client(mut config: kube::Config, throttle: &Throttle) -> Result<Client, kube::Error> {
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
        .layer(throttle.layer())
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}
