//! Handler tests without a socket: `tower::ServiceExt::oneshot` on [`router`].

use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt;

use super::*;
use crate::backend::WaitReason;
use crate::elector::{LeaderState, OwnTerm};

fn follower() -> LeaderState {
    LeaderState {
        election: "e".into(),
        identity: "me".into(),
        backend: "memory",
        leader: Some("other".into()),
        fencing_token: Some(7),
        term_observed_at: Some(SystemTime::UNIX_EPOCH),
        own_term: None,
        lease_duration: Duration::from_secs(15),
        backend_healthy: true,
        error: None,
        stopping: false,
        transitions: 3,
        servers: None,
        heard_until: None,
        waiting: None,
        paused: false,
        priority: 1,
        pinned: None,
        failsafe: None,
    }
}

fn leading(valid_for: Duration) -> LeaderState {
    LeaderState {
        leader: Some("me".into()),
        fencing_token: Some(9),
        own_term: Some(OwnTerm {
            suspended_at_send: crate::elector::suspend::suspended(),
            valid_until: Instant::now() + valid_for,
            fencing_token: 9,
        }),
        ..follower()
    }
}

async fn get(
    state: watch::Receiver<LeaderState>,
    uri: &str,
) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
    request(state, "GET", uri).await
}

async fn request(
    state: watch::Receiver<LeaderState>,
    method: &str,
    uri: &str,
) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
    let app = router(AppState {
        state,
        metrics: None,
    });
    let resp = app
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, headers, json)
}

#[tokio::test]
async fn leader_answers_200_with_the_full_body_and_headers() {
    let (_tx, rx) = watch::channel(leading(Duration::from_secs(5)));
    let (status, headers, body) = get(rx, "/leader").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["is_leader"], true);
    assert_eq!(body["leader"], "me");
    assert_eq!(body["fencing_token"], 9);
    assert_eq!(body["transitions"], 3);
    assert_eq!(body["lease_duration_seconds"], 15.0);
    assert!(body["valid_for_ms"].as_u64().unwrap() > 4000);
    assert_eq!(body["term_observed_at"], "1970-01-01T00:00:00.000Z");
    assert!(body.get("error").is_none());
    for field in ["election", "identity", "backend", "backend_healthy"] {
        assert!(body.get(field).is_some(), "{field} missing");
    }
    assert_eq!(headers[INDEX_HEADER], "3");
    assert_eq!(headers[FENCING_TOKEN_HEADER], "9");
    assert_eq!(headers["cache-control"], "no-store");
}

#[tokio::test]
async fn follower_answers_503_naming_the_leader() {
    let (_tx, rx) = watch::channel(follower());
    let (status, _, body) = get(rx, "/leader").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["is_leader"], false);
    assert_eq!(body["leader"], "other");
    assert_eq!(body["valid_for_ms"], 0);
    assert_eq!(body["paused"], false);
}

#[tokio::test]
async fn every_answer_says_when_the_election_is_paused() {
    for mut state in [follower(), leading(Duration::from_secs(5))] {
        state.paused = true;
        let (_tx, rx) = watch::channel(state);
        let (_, _, body) = get(rx, "/leader").await;
        assert_eq!(body["paused"], true, "{body}");
    }
}

#[tokio::test]
async fn priority_0_answers_503_saying_it_never_leads() {
    let (_tx, rx) = watch::channel(LeaderState {
        priority: 0,
        ..follower()
    });
    let (status, _, body) = get(rx, "/leader").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["leader"], "other");
    assert!(
        body["waiting"]["what"]
            .as_str()
            .unwrap()
            .contains("priority 0"),
        "{body}"
    );
    assert!(body["waiting"].get("until").is_none(), "{body}");
}

#[tokio::test(start_paused = true)]
async fn is_leader_is_computed_when_answering_not_cached() {
    let (_tx, rx) = watch::channel(leading(Duration::from_millis(100)));
    assert_eq!(get(rx.clone(), "/leader").await.0, StatusCode::OK);
    tokio::time::advance(Duration::from_millis(100)).await;
    // Nobody wrote the state, yet the validity has passed.
    let (status, _, body) = get(rx.clone(), "/leader").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["leader"], serde_json::Value::Null);
    assert!(body["error"].as_str().unwrap().contains("validity expired"));
    assert_eq!(get(rx.clone(), "/isLeader").await.2["isLeader"], false);
    assert_eq!(get(rx, "/").await.2["name"], "");
}

#[tokio::test]
async fn compatibility_endpoints_always_answer_200() {
    let (_tx, rx) = watch::channel(follower());
    let (s, _, b) = get(rx.clone(), "/").await;
    assert_eq!((s, b["name"].as_str()), (StatusCode::OK, Some("other")));
    let (s, _, b) = get(rx, "/isLeader").await;
    assert_eq!((s, b["isLeader"].as_bool()), (StatusCode::OK, Some(false)));
    let (_tx, rx) = watch::channel(leading(Duration::from_secs(1)));
    assert_eq!(get(rx, "/isLeader").await.2["isLeader"], true);
}

#[tokio::test]
async fn healthz_stays_up_and_readyz_follows_the_backend() {
    let mut s = follower();
    s.backend_healthy = false;
    s.error = Some(std::sync::Arc::new(
        crate::backend::BackendError::Unreachable {
            backend: crate::backend::memory::ABOUT,
            endpoints: "memory".into(),
            source: "connection refused".into(),
        },
    ));
    let report = s.error.as_ref().unwrap().report();
    assert!(report.starts_with("cannot reach memory at memory: connection refused (hint: "));
    let (_tx, rx) = watch::channel(s);
    assert_eq!(get(rx.clone(), "/healthz").await.0, StatusCode::OK);
    let (status, _, body) = get(rx.clone(), "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"], report.as_str());
    let (status, _, body) = get(rx, "/leader").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"], report.as_str());
    let (_tx, rx) = watch::channel(follower());
    assert_eq!(get(rx, "/readyz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn unknown_paths_and_methods_get_json_errors() {
    let (_tx, rx) = watch::channel(follower());
    let (s, _, b) = get(rx.clone(), "/nope").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(b["error"].as_str().unwrap().contains("/nope"));
    let (s, _, b) = request(rx, "POST", "/leader").await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert!(b["error"].as_str().unwrap().contains("GET"));
}

#[tokio::test]
async fn bad_long_poll_parameters_get_400_naming_the_parameter() {
    let (_tx, rx) = watch::channel(follower());
    for (uri, word) in [
        ("/leader?index=x", "index"),
        ("/leader?index=1&wait=soon", "wait"),
        ("/leader?index=1&wait=11m", "at most"),
        ("/leader?wait=1s", "needs 'index'"),
        // The range first: a wait too long says so even without index.
        ("/leader?wait=11m", "must be at most 10m"),
        ("/leader?wait=soon", "not a duration"),
        (
            "/leader?indx=1",
            "unknown parameter 'indx' (known: index, wait)",
        ),
        ("/leader?index=1&index=2", "repeated parameter 'index'"),
        ("/healthz?verbose=1", "unknown parameter 'verbose'"),
    ] {
        let (s, _, b) = get(rx.clone(), uri).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}");
        assert!(b["error"].as_str().unwrap().contains(word), "{uri}: {b}");
    }
}

#[tokio::test(start_paused = true)]
async fn long_poll_returns_on_a_transition_or_after_wait() {
    let (tx, rx) = watch::channel(follower());
    // Index differs: answers at once.
    let (_, _, b) = get(rx.clone(), "/leader?index=1&wait=10s").await;
    assert_eq!(b["transitions"], 3);
    // Same index: waits until the state's transitions change.
    let poll = tokio::spawn(get(rx.clone(), "/leader?index=3&wait=10s"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!poll.is_finished());
    tx.send_modify(|s| s.backend_healthy = true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !poll.is_finished(),
        "a write without a transition does not end the poll"
    );
    tx.send_modify(|s| {
        s.transitions = 4;
        s.leader = Some("third".into());
    });
    let (_, headers, b) = poll.await.unwrap();
    assert_eq!(b["leader"], "third");
    assert_eq!(headers[INDEX_HEADER], "4");
    // No change: answers after wait.
    let start = Instant::now();
    let (_, _, b) = get(rx, "/leader?index=4&wait=2s").await;
    assert_eq!(b["transitions"], 4);
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

#[tokio::test]
async fn metrics_render_with_client_go_names() {
    let (_tx, rx) = watch::channel(leading(Duration::from_secs(5)));
    let m = crate::metrics::Metrics::new(prometheus::Registry::new(), "e", "memory").unwrap();
    let app = router(AppState {
        state: rx,
        metrics: Some(m),
    });
    let resp = app
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(
        text.contains("leader_election_master_status{name=\"e\"} 1"),
        "{text}"
    );
    assert!(text.contains("leader_election_slowpath_total{name=\"e\"} 0"));
    assert!(text.contains("leader_election_backend_up{backend=\"memory\",name=\"e\"}"));
    assert!(text.contains("leader_election_valid_for_seconds{name=\"e\"} 4.9"));
}

#[tokio::test]
async fn undecodable_paths_and_queries_get_json_400() {
    let (_tx, rx) = watch::channel(follower());
    // Not UTF-8 after percent-decoding: axum's own rejection is plain text.
    let (s, h, b) = get(rx.clone(), "/leader?index=%FF%FE").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(h[header::CONTENT_TYPE], "application/json");
    assert!(b["error"].as_str().is_some_and(|e| !e.is_empty()), "{b}");
    let (s, _, b) = get(rx, "/%FF%FE").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(b["error"].is_string(), "{b}");
}

#[tokio::test]
async fn a_long_poll_returns_when_the_sidecar_stops_claiming() {
    let (tx, rx) = watch::channel(leading(Duration::from_secs(60)));
    let uri = format!("/leader?index={}&wait=60s", rx.borrow().transitions);
    let poll = tokio::spawn(async move { get(rx, &uri).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!poll.is_finished());
    // Drain begins: the Elector stops claiming but still holds the key.
    tx.send_modify(|s| s.stopping = true);
    let (s, _, b) = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long-poll did not return when the sidecar stopped claiming")
        .unwrap();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert_eq!(b["is_leader"], false);
}

#[tokio::test]
async fn a_pause_waits_until_resume_and_the_pin_and_priority_are_shown() {
    let (_tx, rx) = watch::channel(LeaderState {
        paused: true,
        priority: 5,
        pinned: Some("other".into()),
        waiting: Some(crate::elector::Waiting {
            what: WaitReason::Paused,
            until: SystemTime::now() + Duration::from_millis(300),
        }),
        ..follower()
    });
    let (_, _, body) = get(rx, "/leader").await;
    assert_eq!(body["waiting"]["until"], "resume", "{body}");
    assert_eq!(
        (&body["pinned"], &body["priority"]),
        (&serde_json::json!("other"), &serde_json::json!(5)),
        "{body}"
    );
}
