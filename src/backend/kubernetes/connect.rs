//! Connecting to the API server: the client (TCP_NODELAY, our user agent,
//! no retry or trace layer), whose credentials they are, and what they may
//! do (SelfSubjectAccessReview), checked once before the first campaign.

use kube::Client;
use kube::api::Api;
use tracing::warn;

use super::throttle::Throttle;

use super::*;

impl KubeLeaseBackend {
    /// Ask the API server (SelfSubjectAccessReview) whether these
    /// credentials may use each verb the election uses on leases in the
    /// election namespace. `get`, `create` and `update` are required: a
    /// missing one is an [`BackendError::Auth`] naming it, and nothing is
    /// campaigned. `list` and `watch` can be done without: one warning, and
    /// a fallback (`list`: a created Lease is claimed only after a whole
    /// duration; `watch`: polling at the renew interval). A review that
    /// cannot be made (an old or restricted API server) checks nothing.
    pub(super) async fn check_permissions(&self, conn: &Conn) -> Result<()> {
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
            self.view(|v| match verb {
                "watch" => {
                    v.watch_denied();
                }
                _ => v.list_denied(),
            });
        }
        Ok(())
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
    /// When the client may send again after a 429 (its `Retry-After`).
    pub throttle: Throttle,
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
    let throttle = Throttle::default();
    let client = throttled_client(config, &throttle).map_err(KubeLeaseError::Client)?;
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
