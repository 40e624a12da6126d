//! The hostile-input table against both routers in process: a leading
//! Elector on the in-memory backend, and a coordination API whose every
//! call would answer a marker, so a request that reached a backend shows.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::{ControlState, control_router};
use crate::coord::http::CoordState;
use crate::elector::{Elector, ElectorConfig, until_leading};
use crate::http::{AppState, router};
use crate::query::hostile::{Hostile, ROUTES, requests};

/// What the coordination backend answers if any request reaches it.
const ACTED: &str = "REACHED THE COORDINATION BACKEND";

/// A leading in-memory Elector with its control and read-only routers.
struct Routers {
    control: axum::Router,
    read: axum::Router,
    state: tokio::sync::watch::Receiver<crate::elector::LeaderState>,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
}

async fn routers() -> Routers {
    let cfg = ElectorConfig::new("e", "me", Duration::from_secs(3));
    let backend = crate::backend::memory::MemoryBackend::new().connected();
    let (elector, mut state) = Elector::connected(cfg, &backend, None);
    let handle = elector.handle();
    let stop = CancellationToken::new();
    let run = tokio::spawn(elector.run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), until_leading(&mut state))
        .await
        .expect("the in-memory Elector did not lead within 10 s");
    let unserved = crate::coord::Unserved::new("memory", ACTED.into());
    let coord = CoordState {
        service: Arc::new(crate::coord::Service::new(
            Box::new(unserved),
            None,
            "me".into(),
        )),
        completed_retention: Duration::from_secs(60),
    };
    let control = control_router(ControlState {
        handle,
        state: state.clone(),
        resign_cooldown: Duration::from_secs(60),
        coord: Some(coord),
    });
    let read = router(AppState {
        state: state.clone(),
        metrics: None,
    });
    Routers {
        control,
        read,
        state,
        stop,
        run,
    }
}

#[tokio::test]
async fn every_route_refuses_hostile_input_naming_the_field_and_acts_on_nothing() {
    let Routers {
        control,
        read,
        state,
        stop,
        run,
    } = routers().await;
    let token = state.borrow().own_term.map(|t| t.fencing_token);
    let transitions = state.borrow().transitions;
    let cases = requests();
    assert_eq!(cases.len(), 6 * ROUTES.len());
    for h in cases {
        let app = if h.route.control { &control } else { &read };
        check(app.clone(), &h).await;
    }
    // No resign, no switchover, no freeze: the same term, still leading.
    let s = state.borrow().clone();
    assert!(s.is_leader_now(), "the leader resigned");
    assert_eq!(s.transitions, transitions, "a transition happened");
    assert_eq!(s.own_term.map(|t| t.fencing_token), token);
    assert!(s.waiting.is_none(), "frozen: {:?}", s.waiting);
    stop.cancel();
    run.await.unwrap();
}

/// A string that cannot be a token is 400 "malformed" (it answered 410 "no
/// longer yours" once the backend had looked for it), and a body that gives
/// its token twice is refused like a repeated parameter: on every route
/// that takes a token, before any backend call.
#[tokio::test]
async fn a_string_that_cannot_be_a_token_and_a_repeated_body_key_are_400() {
    let r = routers().await;
    let good =
        crate::backend::coordination::Token::new(crate::backend::coordination::TokenKind::Lock, 0)
            .to_string();
    let twice = format!(r#"{{"token": "{good}", "token": "{good}"}}"#);
    for route in ROUTES.iter().filter(|r| r.token) {
        let at = |q: &str| match (route.query, q) {
            ("", q) => format!("{}?{q}", route.path),
            (base, "") => format!("{}?{base}", route.path),
            (base, q) => format!("{}?{base}&{q}", route.path),
        };
        let cases = [
            (at("token=abc"), None, "token is malformed"),
            (
                at(""),
                Some(r#"{"token": "abc"}"#.to_owned()),
                "token is malformed",
            ),
            (at(""), Some(twice.clone()), "repeated body field 'token'"),
        ];
        for (uri, body, field) in cases {
            let h = Hostile {
                route: *route,
                case: "not a token",
                uri,
                body,
                field,
            };
            let status = check(r.control.clone(), &h).await;
            assert_eq!(status, axum::http::StatusCode::BAD_REQUEST, "{h:?}");
        }
    }
    r.stop.cancel();
    r.run.await.unwrap();
}

/// The control API's 404 names every route it serves: each control route
/// of the hostile table by its first segment, and the period claims.
#[tokio::test]
async fn the_404_lists_every_control_route() {
    let r = routers().await;
    let mut req = Request::post("/nowhere").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo("127.0.0.1:5555".parse::<SocketAddr>().unwrap()));
    let resp = r.control.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), axum::http::StatusCode::NOT_FOUND);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let error = body["error"].as_str().unwrap_or_default();
    for route in ROUTES.iter().filter(|r| r.control) {
        let first = route.path.split('/').nth(1).unwrap_or_default();
        assert!(error.contains(&format!("/{first}")), "{first}: {error}");
        assert!(error.contains(route.method), "{}: {error}", route.method);
    }
    assert!(error.contains("/periods/{start}/claim"), "{error}");
    // It names the request it did not find, as sent (not percent-decoded),
    // escaped as JSON: a quote and non-ASCII arrive whole.
    for (method, path) in [
        ("POST", "/lokcs/x"),
        ("DELETE", "/lokcs/\"q\"/é"),
        ("POST", "/lokcs/%22q%22/%C3%A9"),
    ] {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(ConnectInfo("127.0.0.1:5555".parse::<SocketAddr>().unwrap()));
        let resp = r.control.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), axum::http::StatusCode::NOT_FOUND, "{path}");
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["path"], path, "{body}");
        assert_eq!(body["method"], method, "{body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(&format!("{method} {path}")), "{error}");
    }
    r.stop.cancel();
    r.run.await.unwrap();
}

/// Send `h` to `app`: a 4xx JSON answer naming the field, from no backend.
async fn check(app: axum::Router, h: &Hostile) -> axum::http::StatusCode {
    let mut req = Request::builder()
        .method(h.route.method)
        .uri(&h.uri)
        .body(h.body.clone().map(Body::from).unwrap_or_else(Body::empty))
        .unwrap();
    let peer: SocketAddr = "127.0.0.1:5555".parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .unwrap();
    let what = format!("{} {} ({}) {:?}", h.route.method, h.uri, h.case, h.body);
    let body: serde_json::Value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{what}: not JSON: {bytes:?}"));
    let error = body["error"].as_str().unwrap_or_default();
    assert!(status.is_client_error(), "{what}: {status} {body}");
    assert!(
        error.contains(h.field),
        "{what}: names no {}: {body}",
        h.field
    );
    assert!(!error.contains(ACTED), "{what}: acted on: {body}");
    status
}
