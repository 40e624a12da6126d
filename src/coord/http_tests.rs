//! The coordination routes in process over a backend that fails every
//! call: what a 503 tells the client.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use super::{CoordState, routes};
use crate::backend::BackendError;
use crate::coord::{Acquire, CoordError, Coordinator, Object, Outcome, Result, Service, Try};

/// Every call times out (a transient error), or is refused for its
/// credentials (`refused`: no retry mends it).
struct Down {
    refused: bool,
}

impl Down {
    fn error(&self) -> CoordError {
        let backend = crate::backend::memory::ABOUT;
        CoordError::Backend(if self.refused {
            BackendError::Auth {
                backend,
                source: "permission denied".into(),
            }
        } else {
            BackendError::Timeout {
                backend,
                call: "txn",
                timeout_ms: 2000,
            }
        })
    }
}

#[async_trait]
impl Coordinator for Down {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn acquire(&self, _: Acquire<'_>, _: &str, _: Duration) -> Result<Try> {
        Err(self.error())
    }
    async fn renew(&self, _: Object<'_>, _: &str, _: Duration) -> Result<Outcome> {
        Err(self.error())
    }
    async fn release(&self, _: Object<'_>, _: &str) -> Result<Outcome> {
        Err(self.error())
    }
    async fn complete(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<Outcome> {
        Err(self.error())
    }
}

/// The status and `error` of `method uri` on the routes over [`Down`].
async fn answer(refused: bool, method: &str, uri: &str) -> (StatusCode, String) {
    let service = Service::new(Box::new(Down { refused }), None, "me".into());
    let app = routes(CoordState {
        service: Arc::new(service),
        completed_retention: Duration::from_secs(60),
    });
    let token = crate::coord::Token::new(crate::coord::TokenKind::Lock, 0).to_string();
    let body = if method == "DELETE" || uri.ends_with("/renew") {
        Body::from(format!("{{\"token\": \"{token}\"}}"))
    } else {
        Body::empty()
    };
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(body)
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    (
        status,
        body["error"].as_str().unwrap_or_default().to_owned(),
    )
}

/// A backend error answered as a 503 keeps the error and its advice, never
/// says "retrying" (the sidecar retries nothing once it answered), and
/// says what the client should do: a request tried once says so and to
/// retry it; one that waited says it was retried within its wait until its
/// budget ran out; an error no retry mends says to fix it first.
#[tokio::test(start_paused = true)]
async fn a_503_tells_the_client_what_to_do_and_never_that_the_sidecar_retries() {
    let cases = [
        (false, "POST", "/locks/a", "tried this request once"),
        (
            false,
            "POST",
            "/semaphores/s?permits=2",
            "tried this request once",
        ),
        (false, "POST", "/jobs/q/1/claim", "tried this request once"),
        (false, "POST", "/locks/a/renew", "tried this request once"),
        (false, "DELETE", "/rwlocks/d", "tried this request once"),
        (
            false,
            "POST",
            "/locks/a?wait=2s",
            "kept trying it within its wait (2s)",
        ),
        (
            false,
            "POST",
            "/rwlocks/d?mode=write&wait=2s",
            "kept trying it within its wait (2s)",
        ),
        (
            true,
            "POST",
            "/locks/a?wait=2s",
            "a retry does not mend this error",
        ),
    ];
    for (refused, method, uri, says) in cases {
        let (status, error) = answer(refused, method, uri).await;
        let what = format!("{method} {uri}: {error}");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{what}");
        assert!(!error.contains("retrying"), "{what}");
        assert!(error.contains(says), "{what}");
        assert!(error.contains("retry "), "names no retry: {what}");
        let cause = if refused {
            "rejected the credentials"
        } else {
            "timed out"
        };
        assert!(error.contains(cause), "{what}");
    }
}
