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

#[tokio::test]
async fn every_route_refuses_hostile_input_naming_the_field_and_acts_on_nothing() {
    let cfg = ElectorConfig::new("e", "me", Duration::from_secs(3));
    let backend = crate::backend::memory::MemoryBackend::new().connected();
    let (elector, mut state) = Elector::connected(cfg, &backend, None);
    let handle = elector.handle();
    let stop = CancellationToken::new();
    let run = tokio::spawn(elector.run(stop.clone()));
    let token = tokio::time::timeout(Duration::from_secs(10), until_leading(&mut state))
        .await
        .expect("the in-memory Elector did not lead within 10 s");
    let transitions = state.borrow().transitions;
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

/// Send `h` to `app`: a 4xx JSON answer naming the field, from no backend.
async fn check(app: axum::Router, h: &Hostile) {
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
}
