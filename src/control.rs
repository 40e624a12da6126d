//! The control listener (`--control-addr`, loopback only): the endpoints that
//! change state. `POST /resign` gives leadership up and stays out of
//! campaigns for a while (`freeze=`, formerly `cooldown=`), even when no
//! other candidate runs; `POST /switchover?to=ID` hands leadership to a
//! named candidate (served by the leader); `POST /release` tells a draining
//! sidecar that the app finished its leader work.
//!
//! Invariant: requests from non-loopback peers are refused (403) even if the
//! listener was bound to another address by mistake; so are requests whose
//! `Host` is not a loopback name or address (DNS rebinding) and requests with
//! an `Origin` that is not loopback (a web page posting cross-site, CSRF).
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::elector::{ElectorHandle, LeaderState, SwitchoverRefusal};
use crate::http::{error_response, json_response};
use crate::query::{NoParams, Strict};

/// What the control handlers need.
#[derive(Clone)]
pub struct ControlState {
    /// To resign or release.
    pub handle: ElectorHandle,
    /// To answer whether we were draining.
    pub state: watch::Receiver<LeaderState>,
    /// Default freeze of `POST /resign` (`--resign-cooldown`).
    pub resign_cooldown: Duration,
    /// The coordination API (locks, semaphores, job claims), when served.
    pub coord: Option<crate::coord::http::CoordState>,
}

/// Longest accepted `freeze` (or `cooldown`) of `POST /resign`.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(24 * 3600);

/// The control router. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()` so the loopback
/// check can see the peer.
pub fn control_router(cs: ControlState) -> Router {
    let coord = cs.coord.clone();
    let mut router: Router = Router::new()
        .route("/resign", post(resign))
        .route("/switchover", post(switchover))
        .route("/release", post(release))
        .with_state(cs);
    if let Some(coord) = coord {
        router = router.merge(crate::coord::http::routes(coord));
    }
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(loopback_only))
        .layer(middleware::from_fn(crate::http::json_errors))
}

/// Whether `host` (a `Host` header value or a URL's host, with or without a
/// port) names the loopback interface: `localhost`, `*.localhost`, or a
/// loopback IP address.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, tail)) if tail.is_empty() || tail.starts_with(':') => ip,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
            _ => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Why a request's `Host` or `Origin` is refused, if it is.
fn browser_check(req: &Request) -> Option<String> {
    let headers = req.headers();
    if let Some(host) = headers.get(axum::http::header::HOST) {
        let text = host.to_str().unwrap_or("");
        if !is_loopback_host(text) {
            return Some(format!(
                "the control API answers requests for a loopback host only, not Host {}; call it as http://127.0.0.1:PORT or http://localhost:PORT",
                String::from_utf8_lossy(host.as_bytes())
            ));
        }
    }
    if let Some(origin) = headers.get(axum::http::header::ORIGIN) {
        let text = origin.to_str().unwrap_or("");
        let ok = text
            .parse::<axum::http::Uri>()
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http") | Some("https")))
            .and_then(|u| u.host().map(is_loopback_host))
            .unwrap_or(false);
        if !ok {
            return Some(format!(
                "the control API refuses cross-origin requests from browsers (Origin {}); only loopback origins may call it",
                String::from_utf8_lossy(origin.as_bytes())
            ));
        }
    }
    None
}

async fn loopback_only(req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    match peer {
        Some(ip) if ip.is_loopback() => match browser_check(&req) {
            None => next.run(req).await,
            Some(why) => error_response(StatusCode::FORBIDDEN, why),
        },
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

/// The query of `POST /resign`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResignParams {
    /// How long to stay out of campaigns (humantime).
    pub freeze: Option<String>,
    /// The old name of `freeze`, kept for old callers.
    pub cooldown: Option<String>,
}

impl ResignParams {
    /// The freeze asked for; `default` when none is.
    ///
    /// # Errors
    /// A message naming the parameter: both given, not a duration, or
    /// longer than [`MAX_COOLDOWN`].
    pub fn freeze(&self, default: Duration) -> Result<Duration, String> {
        let (name, value) = match (&self.freeze, &self.cooldown) {
            (Some(_), Some(_)) => {
                return Err("parameters 'freeze' and 'cooldown' are one setting (cooldown is its old name): give one".into());
            }
            (Some(f), None) => ("freeze", f),
            (None, Some(c)) => ("cooldown", c),
            (None, None) => return Ok(default),
        };
        let d = crate::flags::parse_duration(value)
            .map_err(|e| format!("parameter '{name}' ({value}): {e}"))?;
        if d > MAX_COOLDOWN {
            return Err(format!(
                "parameter '{name}' ({value}) must be at most {}",
                crate::flags::format_duration(MAX_COOLDOWN)
            ));
        }
        Ok(d)
    }
}

async fn resign(State(cs): State<ControlState>, Strict(p): Strict<ResignParams>) -> Response {
    match p.freeze(cs.resign_cooldown) {
        Ok(d) => resigned(&cs, d).await,
        Err(msg) => error_response(StatusCode::BAD_REQUEST, msg),
    }
}

/// Resign and stay out of campaigns for `freeze`; the answer names its end.
async fn resigned(cs: &ControlState, freeze: Duration) -> Response {
    let was_leader = cs.handle.resign(freeze).await;
    let until = std::time::SystemTime::now() + freeze;
    let ms = freeze.as_millis() as u64;
    json_response(
        StatusCode::OK,
        json!({
            "resigned": was_leader,
            "freeze_ms": ms,
            "frozen_until": humantime::format_rfc3339_millis(until).to_string(),
            "cooldown_ms": ms,
        }),
    )
}

/// `POST /switchover?to=ID`: the leader hands over to `ID` and answers
/// once the release is sent; 409 with the reason otherwise.
/// The query of `POST /switchover`. A new parameter is a new field here:
/// the strict parser lists it among the known ones by itself.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchoverParams {
    /// The identity of the candidate to hand over to (required).
    pub to: Option<String>,
    /// `true`: hand over even to a lower priority or an older revision,
    /// and pin the target (it is not preempted) until it leaves.
    pub force: Option<String>,
}

async fn switchover(
    State(cs): State<ControlState>,
    Strict(params): Strict<SwitchoverParams>,
) -> Response {
    let Some(to) = params.to.as_deref() else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "parameter 'to' is missing: POST /switchover?to=IDENTITY names the candidate to hand over to",
        );
    };
    let force = match params.force.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("query parameter force ({v}) must be true or false"),
            );
        }
    };
    match cs.handle.switchover(to, force).await {
        Ok(h) => json_response(
            StatusCode::OK,
            json!({ "switched_over": true, "from": h.from, "to": h.to, "fencing_token": h.fencing_token }),
        ),
        Err(SwitchoverRefusal::Backend(why)) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "cannot check the switchover's target: {why}; nothing was handed over: retry the switchover"
            ),
        ),
        Err(refusal) => {
            let leader = match &refusal {
                SwitchoverRefusal::NotLeader { leader } => leader.clone(),
                _ => Some(cs.state.borrow().identity.clone()),
            };
            json_response(
                StatusCode::CONFLICT,
                json!({ "error": refusal.to_string(), "leader": leader }),
            )
        }
    }
}

async fn release(State(cs): State<ControlState>, _: Strict<NoParams>) -> Response {
    // A draining Elector has already recorded the end of its claim
    // (`own_term` is gone); `stopping` is what tells a drain apart.
    let draining = cs.state.borrow().stopping;
    cs.handle.release().await;
    json_response(StatusCode::OK, json!({ "released": draining }))
}

/// The 404: the request it did not find (`method`, and `path` as sent, not
/// percent-decoded) and every route there is.
async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    json_response(
        StatusCode::NOT_FOUND,
        json!({
            "error": format!("no such path: {method} {path}; the control API has POST /resign, POST /switchover, POST /release; POST and DELETE /locks/{{name}}, /semaphores/{{name}} and /rwlocks/{{name}}, each with POST …/renew; POST and DELETE /jobs/{{queue}}/{{job}}/claim, POST /jobs/{{queue}}/{{job}}/renew and /complete; POST /jobs/{{name}}/periods/{{start}}/claim and /complete"),
            "method": method.as_str(),
            "path": path,
        }),
    )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: use POST",
    )
}

#[cfg(test)]
#[path = "control_hostile_tests.rs"]
mod hostile_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn router() -> Router {
        let cfg = crate::elector::ElectorConfig::new("e", "me", Duration::from_secs(3));
        let (elector, state) = crate::elector::Elector::connected(
            cfg,
            &crate::backend::memory::MemoryBackend::new().connected(),
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

    fn with_header(mut req: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
        req.headers_mut().insert(name, value.parse().unwrap());
        req
    }

    async fn status_and_body(req: Request<Body>) -> (StatusCode, serde_json::Value) {
        let resp = router().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).expect("a JSON body"))
    }

    #[tokio::test]
    async fn foreign_host_and_origin_are_refused_with_json_403() {
        let base = || request("127.0.0.1:5555", "/resign?cooldown=1s");
        // DNS rebinding: the page's own name reaches 127.0.0.1.
        let (s, body) = status_and_body(with_header(base(), "host", "evil.example:4041")).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("Host evil.example"),
            "{body}"
        );
        // CSRF: a page elsewhere posts to localhost.
        let req = with_header(
            with_header(base(), "host", "127.0.0.1:4041"),
            "origin",
            "https://evil.example",
        );
        let (s, body) = status_and_body(req).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
        assert!(body["error"].as_str().unwrap().contains("Origin"), "{body}");
        let (s, _) = status_and_body(with_header(base(), "origin", "null")).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        // Loopback names and origins pass.
        for host in [
            "127.0.0.1:4041",
            "localhost:4041",
            "[::1]:4041",
            "localhost",
            "LOCALHOST.",
        ] {
            let (s, body) = status_and_body(with_header(base(), "host", host)).await;
            assert_eq!(s, StatusCode::OK, "{host}: {body}");
        }
        let req = with_header(
            with_header(base(), "host", "localhost:4041"),
            "origin",
            "http://localhost:3000",
        );
        assert_eq!(status_and_body(req).await.0, StatusCode::OK);
    }

    /// A path that is not UTF-8 after percent-decoding gets a JSON 400, not
    /// axum's plain-text one: every error of the control port is JSON.
    #[tokio::test]
    async fn an_undecodable_path_gets_a_json_400() {
        let backend = crate::backend::etcd::EtcdBackend::new(
            "/k",
            crate::backend::etcd::EtcdOptions {
                endpoints: vec!["http://127.0.0.1:9".into()],
                ..Default::default()
            },
        );
        let coord = crate::coord::http::CoordState {
            service: std::sync::Arc::new(crate::coord::Service::new(
                Box::new(crate::backend::etcd::coord::EtcdCoord::new(backend, "/p/")),
                None,
                "me".into(),
            )),
            completed_retention: Duration::from_secs(60),
        };
        let cfg = crate::elector::ElectorConfig::new("e", "me", Duration::from_secs(3));
        let (elector, state) = crate::elector::Elector::connected(
            cfg,
            &crate::backend::memory::MemoryBackend::new().connected(),
            None,
        );
        let app = control_router(ControlState {
            handle: elector.handle(),
            state,
            resign_cooldown: Duration::from_secs(1),
            coord: Some(coord),
        });
        let resp = app
            .oneshot(request("127.0.0.1:5555", "/locks/%FF%FE"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("a JSON body");
        assert!(body["error"].is_string(), "{body}");
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:4041",
            "localhost",
            "a.localhost:1",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "10.0.0.1",
            "evil.example",
            "localhost.evil.example",
            "[::2]:1",
            "127.0.0.1.nip.io",
            "",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[tokio::test]
    async fn bad_cooldown_is_a_400() {
        let resp = router()
            .oneshot(request("127.0.0.1:5555", "/resign?cooldown=48h"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn freeze_is_accepted_and_checked_like_cooldown() {
        let (s, body) = status_and_body(request("127.0.0.1:5555", "/resign?freeze=60s")).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(body["freeze_ms"], 60_000);
        assert!(body["frozen_until"].is_string(), "{body}");
        let (s, body) = status_and_body(request("127.0.0.1:5555", "/resign?freeze=2d")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(body["error"].as_str().unwrap().contains("freeze"), "{body}");
        let (s, body) = status_and_body(request("127.0.0.1:5555", "/resign?cooldown=5s")).await;
        assert_eq!((s, &body["cooldown_ms"]), (StatusCode::OK, &json!(5000)));
    }

    #[tokio::test]
    async fn a_switchover_needs_a_target_and_a_follower_answers_409() {
        let (s, body) = status_and_body(request("127.0.0.1:5555", "/switchover")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["error"].as_str().unwrap().contains("to"), "{body}");
        let (s, body) = status_and_body(request("127.0.0.1:5555", "/switchover?to=b")).await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("does not lead"),
            "{body}"
        );
        assert!(body.get("leader").is_some(), "{body}");
    }

    /// A switchover whose target cannot be checked (the registry does not
    /// answer) is a 503 that says nothing was handed over and to retry,
    /// never that the sidecar retries it.
    #[tokio::test]
    async fn a_switchover_that_cannot_check_its_target_says_to_retry_it() {
        let b = crate::backend::memory::MemoryBackend::new();
        let cfg = crate::elector::ElectorConfig::new("e", "me", Duration::from_secs(3));
        let (elector, mut state) = crate::elector::Elector::connected(cfg, &b.connected(), None);
        let handle = elector.handle();
        let stop = tokio_util::sync::CancellationToken::new();
        let run = tokio::spawn(elector.run(stop.clone()));
        tokio::time::timeout(
            Duration::from_secs(10),
            crate::elector::until_leading(&mut state),
        )
        .await
        .expect("leads");
        b.set_unreachable(true);
        let app = control_router(ControlState {
            handle,
            state,
            resign_cooldown: Duration::from_secs(1),
            coord: None,
        });
        let resp = app
            .oneshot(request("127.0.0.1:5555", "/switchover?to=b"))
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let error = body["error"].as_str().unwrap_or_default();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(error.contains("cannot reach memory"), "{error}");
        assert!(!error.contains("retrying"), "{error}");
        assert!(error.contains("retry the switchover"), "{error}");
        stop.cancel();
        run.await.unwrap();
    }
}
