//! The control listener (`--control-addr`, loopback only): the endpoints that
//! change state. `POST /resign` gives leadership up and stays out of
//! campaigns for a cooldown; `POST /release` tells a draining sidecar that
//! the app finished its leader work.
//!
//! Invariant: requests from non-loopback peers are refused (403) even if the
//! listener was bound to another address by mistake.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use serde_json::json;
use tokio::sync::watch;

use crate::elector::{ElectorHandle, LeaderState};
use crate::http::{error_response, json_response};

/// What the control handlers need.
#[derive(Clone)]
pub struct ControlState {
    /// To resign or release.
    pub handle: ElectorHandle,
    /// To answer whether we were draining.
    pub state: watch::Receiver<LeaderState>,
    /// Default cooldown of `POST /resign` (`--resign-cooldown`).
    pub resign_cooldown: Duration,
    /// The coordination API (locks, semaphores, job claims), when served.
    pub coord: Option<crate::coord::http::CoordState>,
}

/// Longest accepted `cooldown` of `POST /resign`.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(24 * 3600);

/// The control router. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()` so the loopback
/// check can see the peer.
pub fn control_router(cs: ControlState) -> Router {
    let coord = cs.coord.clone();
    let mut router: Router = Router::new()
        .route("/resign", post(resign))
        .route("/release", post(release))
        .with_state(cs);
    if let Some(coord) = coord {
        router = router.merge(crate::coord::http::routes(coord));
    }
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(loopback_only))
}

async fn loopback_only(req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    match peer {
        Some(ip) if ip.is_loopback() => next.run(req).await,
        Some(ip) => error_response(
            StatusCode::FORBIDDEN,
            format!("the control API answers loopback clients only, not {ip}"),
        ),
        None => error_response(
            StatusCode::FORBIDDEN,
            "the control API answers loopback clients only (peer unknown)",
        ),
    }
}

async fn resign(
    State(cs): State<ControlState>,
    Query(params): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let cooldown = match params.get("cooldown") {
        None => cs.resign_cooldown,
        Some(c) => match humantime::parse_duration(c) {
            Ok(d) if d <= MAX_COOLDOWN => d,
            Ok(_) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    format!("query parameter cooldown ({c}) must be at most 24h"),
                );
            }
            Err(e) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "query parameter cooldown ({c}) is not a duration: {e}; use e.g. cooldown=30s"
                    ),
                );
            }
        },
    };
    let was_leader = cs.handle.resign(cooldown).await;
    json_response(
        StatusCode::OK,
        json!({ "resigned": was_leader, "cooldown_ms": cooldown.as_millis() as u64 }),
    )
}

async fn release(State(cs): State<ControlState>) -> Response {
    let draining = {
        let s = cs.state.borrow();
        s.stopping && s.own_term.is_some()
    };
    cs.handle.release().await;
    json_response(StatusCode::OK, json!({ "released": draining }))
}

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "no such path; the control API has POST /resign, POST /release, /locks/{name}, /semaphores/{name}, /jobs/{queue}/{job}/claim and /complete",
    )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: use POST",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn router() -> Router {
        let cfg = crate::elector::ElectorConfig::new("e", "me", Duration::from_secs(3));
        let (elector, state) = crate::elector::Elector::new(
            cfg,
            std::sync::Arc::new(crate::backend::memory::MemoryBackend::new()),
            None,
        );
        control_router(ControlState {
            handle: elector.handle(),
            state,
            resign_cooldown: Duration::from_secs(1),
            coord: None,
        })
    }

    fn request(peer: &str, uri: &str) -> Request<Body> {
        let mut req = Request::post(uri).body(Body::empty()).unwrap();
        let addr: SocketAddr = peer.parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(addr));
        req
    }

    #[tokio::test]
    async fn non_loopback_peers_are_refused() {
        let resp = router()
            .oneshot(request("10.1.2.3:5555", "/resign"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let resp = router()
            .oneshot(request("[::1]:5555", "/nope"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn bad_cooldown_is_a_400() {
        let resp = router()
            .oneshot(request("127.0.0.1:5555", "/resign?cooldown=48h"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    }
}
