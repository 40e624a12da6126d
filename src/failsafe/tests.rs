//! The protocol's pieces, each with a test per counterexample the model
//! found, on a paused clock; the peer router without a socket.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tokio::time::Instant;
use tower::ServiceExt;

use super::peer::{HEARTBEAT_PATH, PeerState, Secret, router};
use super::{Confirmations, Heartbeat, Hold, Member, Promises, Refusal, Roster};

const P: Duration = Duration::from_secs(3);
const MARGIN: Duration = Duration::from_millis(100);

fn member(id: &str) -> Member {
    Member {
        identity: id.into(),
        peer_addr: format!("{id}:4042"),
    }
}

fn roster(ids: &[&str]) -> Roster {
    Roster::new(ids.iter().map(|i| member(i)))
}

fn hb(token: u64) -> Heartbeat {
    Heartbeat {
        election: "e".into(),
        leader: "a".into(),
        fencing_token: token,
        promise_ms: P.as_millis() as u64,
    }
}

#[test]
fn roster_sorted_deduplicated_and_round_trips() {
    let r = Roster::new([member("b"), member("a"), member("b")]);
    assert_eq!(r.members.len(), 2);
    assert_eq!(r.members[0].identity, "a");
    assert_eq!(Roster::from_json(&r.to_json()).unwrap(), r);
    assert!(r.may_campaign("a") && !r.may_campaign("c"));
    assert!(Roster::default().may_campaign("c"), "no roster: anyone");
}

#[tokio::test(start_paused = true)]
async fn a_leader_claims_until_the_earliest_promise_all_members_gave() {
    let t0 = Instant::now();
    let mut c = Confirmations::new("a", &roster(&["a", "b", "c"]));
    assert_eq!(c.valid_until(MARGIN), None, "not active");
    assert!(!c.start());
    c.confirmed("b", t0, P);
    assert_eq!(c.valid_until(MARGIN), None, "c has not confirmed");
    c.confirmed("c", t0 + Duration::from_secs(1), P);
    assert_eq!(
        c.valid_until(MARGIN),
        Some(t0 + P - MARGIN),
        "b's is earliest"
    );
    assert_eq!(c.confirmed_at(t0), 2);
    c.confirmed("x", t0 + P, P); // not required: ignored
    assert_eq!(c.valid_until(MARGIN), Some(t0 + P - MARGIN));
}

#[tokio::test(start_paused = true)]
async fn a_member_admitted_by_a_write_whose_answer_was_lost_is_required() {
    // The model's second counterexample: the renewal admitting c was
    // applied, its answer lost; c must confirm before the leader counts.
    let t0 = Instant::now();
    let mut c = Confirmations::new("a", &roster(&["a", "b"]));
    c.sending("a", &roster(&["a", "b", "c"]));
    c.start();
    c.confirmed("b", t0, P);
    assert_eq!(c.valid_until(MARGIN), None);
    c.confirmed("c", t0, P);
    assert!(c.valid_until(MARGIN).is_some());
    // An acknowledged roster without c drops it.
    c.acknowledged("a", &roster(&["a", "b"]));
    c.start();
    assert_eq!(c.required().collect::<Vec<_>>(), ["b"]);
}

#[tokio::test(start_paused = true)]
async fn a_bound_that_passed_is_never_resumed_by_a_late_ack() {
    let t0 = Instant::now();
    let mut c = Confirmations::new("a", &roster(&["a", "b"]));
    c.start();
    c.confirmed("b", t0, P);
    assert!(!c.expire(t0 + Duration::from_secs(1), MARGIN));
    assert!(c.expire(t0 + P, MARGIN));
    c.confirmed("b", t0 + P, P);
    assert_eq!(c.valid_until(MARGIN), None);
}

#[tokio::test(start_paused = true)]
async fn a_leader_alone_has_nobody_to_confirm_it() {
    let mut c = Confirmations::new("a", &roster(&["a"]));
    c.start();
    assert_eq!(c.valid_until(MARGIN), None);
}

#[tokio::test(start_paused = true)]
async fn a_member_keeps_its_promise_and_a_restart_waits_one_promise() {
    // The model's third counterexample: a fresh process has forgotten
    // what it promised, so it waits one maximum promise from its start.
    let start = Instant::now();
    let mut p = Promises::new("e", "b", P, start);
    assert!(!p.may_campaign(start + P - Duration::from_millis(1)));
    assert!(p.may_campaign(start + P));
    tokio::time::advance(Duration::from_secs(5)).await;
    let now = Instant::now();
    let ack = p.heartbeat(&hb(7), now, false).unwrap();
    assert_eq!((ack.member.as_str(), ack.promise_ms), ("b", 3000));
    assert!(!p.may_campaign(now + Duration::from_millis(2999)));
    assert!(p.may_campaign(now + P));
}

#[tokio::test(start_paused = true)]
async fn the_start_up_wait_and_a_promise_are_told_apart() {
    let start = Instant::now();
    let mut p = Promises::new("e", "b", P, start);
    // Before any heartbeat: the start-up wait, ending one promise after start.
    assert_eq!(super::node::hold_of(&p), Some(Hold::StartWait(start + P)));
    p.heartbeat(&hb(7), start, false).unwrap();
    assert_eq!(super::node::hold_of(&p), Some(Hold::Promised(start + P)));
    tokio::time::advance(P).await;
    assert_eq!(super::node::hold_of(&p), None);
}

#[tokio::test(start_paused = true)]
async fn a_member_refuses_while_campaigning_for_another_election_or_a_stale_term() {
    let now = Instant::now();
    let mut p = Promises::new("e", "b", P, now);
    assert_eq!(p.heartbeat(&hb(1), now, true), Err(Refusal::Campaigning));
    let mut other = hb(1);
    other.election = "f".into();
    assert!(matches!(
        p.heartbeat(&other, now, false),
        Err(Refusal::OtherElection(_))
    ));
    p.saw_token(5);
    assert!(matches!(
        p.heartbeat(&hb(4), now, false),
        Err(Refusal::Stale { .. })
    ));
    let mut long = hb(5);
    long.promise_ms = 60_000;
    assert_eq!(
        p.heartbeat(&long, now, false).unwrap().promise_ms,
        3000,
        "capped"
    );
}

fn peer() -> (axum::Router, Arc<Mutex<Promises>>) {
    let start = Instant::now() - P;
    let promises = Arc::new(Mutex::new(Promises::new("e", "b", P, start)));
    let state = PeerState {
        secret: Secret::new(b"0123456789abcdef").unwrap(),
        promises: promises.clone(),
        campaigning: Arc::new(|| false),
    };
    (router(state), promises)
}

fn post(auth: Option<&str>, body: &str) -> Request<Body> {
    let mut r = Request::post(HEARTBEAT_PATH).header("content-type", "application/json");
    if let Some(a) = auth {
        r = r.header("authorization", a);
    }
    r.body(Body::from(body.to_owned())).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_with_a_wrong_secret_is_401_and_changes_nothing() {
    let (app, promises) = peer();
    let body = serde_json::to_string(&hb(1)).unwrap();
    for auth in [
        None,
        Some("Bearer wrong-secret-wrong!"),
        Some("0123456789abcdef"),
    ] {
        let resp = app.clone().oneshot(post(auth, &body)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        assert!(promises.lock().unwrap().may_campaign(Instant::now()));
    }
    let ok = post(Some("Bearer 0123456789abcdef"), &body);
    let resp = app.clone().oneshot(ok).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(!promises.lock().unwrap().may_campaign(Instant::now()));
    let bad = post(Some("Bearer 0123456789abcdef"), "{}");
    let resp = app.oneshot(bad).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn a_short_secret_is_refused() {
    assert_eq!(Secret::new(b"short").err(), Some(5));
}

#[tokio::test]
async fn the_client_counts_an_ack_only_with_the_right_secret_over_a_socket() {
    let (app, promises) = peer();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let wait = Duration::from_secs(5);
    let wrong = Secret::new(b"fedcba9876543210").unwrap();
    let refused = super::peer::send(&client, &addr, &wrong, &hb(1), wait).await;
    let why = refused.expect_err("a wrong secret is not counted");
    assert!(
        why.contains("401") && why.contains("--failsafe-secret-file"),
        "{why}"
    );
    assert!(promises.lock().unwrap().may_campaign(Instant::now()));
    let right = Secret::new(b"0123456789abcdef").unwrap();
    let ack = super::peer::send(&client, &addr, &right, &hb(1), wait).await;
    assert_eq!(ack.map(|a| a.promise_ms), Ok(3000));
    assert!(!promises.lock().unwrap().may_campaign(Instant::now()));
    server.abort();
}
