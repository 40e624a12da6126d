//! The protocol's pieces, each with a test per counterexample the model
//! found, on a paused clock; the peer router without a socket.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tokio::time::Instant;
use tower::ServiceExt;

use super::peer::{Counters, HEARTBEAT_PATH, PeerState, Secret, Sender, router, send};
use super::sign::{Keys, Nonces};
use super::{Confirmations, Heartbeat, Hold, Member, Promises, Refusal, Roster};

const P: Duration = Duration::from_secs(3);
const OUTAGE: Duration = Duration::from_secs(10);
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
    let mut p = Promises::new("e", "b", (P, OUTAGE), start);
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
    let mut p = Promises::new("e", "b", (P, OUTAGE), start);
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
    let mut p = Promises::new("e", "b", (P, OUTAGE), now);
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

#[tokio::test(start_paused = true)]
async fn a_member_that_reads_the_backend_promises_only_the_term_it_sees_there() {
    let now = Instant::now();
    let mut p = Promises::new("e", "b", (P, OUTAGE), now - P);
    p.saw(None, now);
    let r = p.heartbeat(&hb(7), now, false);
    assert!(
        matches!(r, Err(Refusal::NotInBackend { got: 7, .. })),
        "{r:?}"
    );
    p.saw(Some(6), now);
    assert!(matches!(
        p.heartbeat(&hb(7), now, false),
        Err(Refusal::NotInBackend { .. })
    ));
    assert!(p.may_campaign(now), "a refusal promises nothing");
    p.saw(Some(7), now);
    assert!(p.heartbeat(&hb(7), now, false).is_ok());
    // Blind (the backend does not answer): any term, within its budget.
    p.blind();
    assert!(p.heartbeat(&hb(8), now, false).is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_promises_to_one_term_add_up_to_the_max_outage_without_a_sight() {
    let start = Instant::now();
    let mut p = Promises::new("e", "b", (P, OUTAGE), start - P);
    // A forger (or a real outage): a heartbeat every second, blind member.
    let mut last = start;
    while p.heartbeat(&hb(7), Instant::now(), false).is_ok() {
        last = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(last - start, OUTAGE - Duration::from_secs(1));
    assert_eq!(p.until(), start + OUTAGE, "the last promise was cut short");
    let r = p.heartbeat(&hb(7), Instant::now(), false);
    assert!(matches!(r, Err(Refusal::Spent { token: 7, .. })), "{r:?}");
    assert!(
        p.may_campaign(Instant::now()),
        "it campaigns like any member"
    );
    // Seen live while no promise holds: a new budget for that term.
    p.saw(Some(7), Instant::now());
    p.blind();
    assert!(p.heartbeat(&hb(7), Instant::now(), false).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_sight_while_a_promise_holds_does_not_renew_the_budget() {
    let start = Instant::now();
    let mut p = Promises::new("e", "b", (P, OUTAGE), start - P);
    for _ in 0..9 {
        p.heartbeat(&hb(7), Instant::now(), false).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    // Seen live (a forger's dead leader whose key has not expired yet, or
    // a Lease nobody took): the budget runs on.
    p.saw(Some(7), Instant::now());
    p.heartbeat(&hb(7), Instant::now(), false).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(
        p.heartbeat(&hb(7), Instant::now(), false),
        Err(Refusal::Spent { .. })
    ));
}

const KEY_A: &[u8] = b"0123456789abcdef";
const KEY_B: &[u8] = b"fedcba9876543210";

fn keys(sign: &[u8], also: Option<&[u8]>) -> Keys {
    let also = also.map(|k| Secret::new(k).unwrap());
    Keys::new(Secret::new(sign).unwrap(), also)
}

fn peer(keys: Keys) -> (axum::Router, Arc<Mutex<Promises>>, Counters) {
    let start = Instant::now() - P;
    let promises = Promises::new("e", "b", (P, OUTAGE), start);
    let promises = Arc::new(Mutex::new(promises));
    let counters = Counters::new("e");
    let state = PeerState {
        keys,
        nonces: Arc::new(Nonces::new(P)),
        counters: counters.clone(),
        promises: promises.clone(),
        campaigning: Arc::new(|| false),
    };
    (router(state), promises, counters)
}

fn signed(keys: &Keys, body: &str) -> Request<Body> {
    let stamp = keys.sign(["request", "POST", HEARTBEAT_PATH], body.as_bytes());
    let mut r = Request::post(HEARTBEAT_PATH).header("content-type", "application/json");
    for (name, value) in stamp.headers() {
        r = r.header(name, value);
    }
    r.body(Body::from(body.to_owned())).unwrap()
}

fn copy(r: &Request<Body>, body: &str) -> Request<Body> {
    let mut c = Request::post(HEARTBEAT_PATH);
    for (name, value) in r.headers() {
        c = c.header(name, value);
    }
    c.body(Body::from(body.to_owned())).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_unsigned_signed_wrong_or_replayed_is_401_counted_and_changes_nothing() {
    let (app, promises, counters) = peer(keys(KEY_A, None));
    let body = serde_json::to_string(&hb(1)).unwrap();
    let bearer = Request::post(HEARTBEAT_PATH)
        .header("authorization", "Bearer 0123456789abcdef")
        .body(Body::from(body.clone()))
        .unwrap();
    let resp = app.clone().oneshot(bearer).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "the old bearer");
    let resp = app.clone().oneshot(signed(&keys(KEY_B, None), &body)).await;
    assert_eq!(resp.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert!(promises.lock().unwrap().may_campaign(Instant::now()));
    assert_eq!(counters.refused("heartbeat", "unsigned"), 1);
    assert_eq!(counters.refused("heartbeat", "wrong_key"), 1);
    // A captured heartbeat: accepted once, its replay (same bytes) refused.
    let good = signed(&keys(KEY_A, None), &body);
    let replay = copy(&good, &body);
    let resp = app.clone().oneshot(good).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers().contains_key(super::sign::SIGNATURE),
        "signed answer"
    );
    let resp = app.clone().oneshot(replay).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(counters.refused("heartbeat", "replayed"), 1);
    let bad = signed(&keys(KEY_A, None), "{}");
    let resp = app.oneshot(bad).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(start_paused = true)]
async fn a_probe_is_answered_without_a_promise() {
    let (app, promises, _) = peer(keys(KEY_A, None));
    let mut probe = hb(0);
    probe.promise_ms = 0;
    let body = serde_json::to_string(&probe).unwrap();
    let resp = app
        .oneshot(signed(&keys(KEY_A, None), &body))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let p = promises.lock().unwrap();
    assert!(p.may_campaign(Instant::now()) && !p.promised());
}

#[test]
fn a_short_secret_is_refused() {
    assert_eq!(Secret::new(b"short").err(), Some(5));
}

#[tokio::test]
async fn the_client_counts_an_ack_only_when_both_sides_are_signed_with_a_shared_key() {
    let (app, promises, _) = peer(keys(KEY_B, Some(KEY_A)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let (client, nonces, counters) = (reqwest::Client::new(), Nonces::new(P), Counters::new("e"));
    let wait = Duration::from_secs(5);
    let by = |keys| Sender {
        client: &client,
        keys,
        nonces: &nonces,
        counters: &counters,
    };
    let wrong = keys(b"another-key-of-16", None);
    let why = send(by(&wrong), &addr, &hb(1), wait).await.unwrap_err();
    assert!(
        why.contains("401") && why.contains("--failsafe-secret-file"),
        "{why}"
    );
    // The member accepts A but answers signed with B: not counted.
    let only_a = keys(KEY_A, None);
    let why = send(by(&only_a), &addr, &hb(1), wait).await.unwrap_err();
    assert!(why.contains("another key"), "{why}");
    assert_eq!(counters.refused("answer", "wrong_key"), 1);
    // Mid-rotation: signs A, accepts B.
    let rotating = keys(KEY_A, Some(KEY_B));
    let ack = send(by(&rotating), &addr, &hb(1), wait).await;
    assert_eq!(ack.map(|a| a.promise_ms), Ok(3000));
    assert!(!promises.lock().unwrap().may_campaign(Instant::now()));
    server.abort();
}
