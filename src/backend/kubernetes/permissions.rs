//! What the election's credentials may do on leases, checked before the
//! first campaign (SelfSubjectAccessReviews through the shared client's
//! [`Reviews`], so a missing verb is reviewed again at most once a minute
//! however often the Elector retries).

use std::sync::LazyLock;
use std::time::Duration;

use tracing::warn;

use super::*;
use crate::kube_client::review::Reviews;

/// The answers of this process's lease reviews (one set of credentials per
/// process: the in-cluster or kubeconfig ones; a backend over the caller's
/// own client never reviews).
static REVIEWS: LazyLock<Reviews> = LazyLock::new(Reviews::default);

/// How long one review may take before nothing is checked.
const REVIEW_LIMIT: Duration = Duration::from_secs(5);

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
        let asks: Vec<_> = ["get", "create", "update", "list", "watch"]
            .into_iter()
            .map(|verb| ("coordination.k8s.io", "leases", verb))
            .collect();
        let missing: Vec<&'static str> = match REVIEWS
            .missing(&conn.client, &conn.namespace, &asks, REVIEW_LIMIT)
            .await
        {
            Ok(missing) => missing.into_iter().map(|(_, _, verb)| verb).collect(),
            Err(e) => {
                warn!(error = %e, "cannot review this sidecar's permissions (SelfSubjectAccessReview); going on without");
                return Ok(());
            }
        };
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
