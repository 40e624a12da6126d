//! The Lease backend against kube-rs's mock service (`tower_test::mock`): the
//! exact requests it sends (method, path, query, body) and how it reads the
//! answers. No API server runs in our test environment; tests/suite/kubernetes.rs
//! drives real sidecars against the stand-in in tests/support/kube_api/.

use std::sync::{Arc, Mutex};

use kube::Client;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::*;
use crate::kube_client::mock::{Seen, mock, mock_or_hold};

type Responder = crate::kube_client::mock::Responder<String>;

const BASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

fn lease(holder: &str, rv: u64, token: u64, transitions: i32, secs: i32) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "el", "namespace": "ns", "resourceVersion": rv.to_string(),
                     "annotations": {TOKEN_ANNOTATION: token.to_string()}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": secs,
                 "leaseTransitions": transitions,
                 "renewTime": "2026-01-01T00:00:00.000000Z"}
    })
}

/// A Lease released by its holder `was` (empty holder, our release mark).
fn released(was: &str, rv: u64, token: u64, transitions: i32) -> Value {
    let mut l = lease("", rv, token, transitions, 1);
    l["metadata"]["annotations"][RELEASED_ANNOTATION] = json!(was);
    l
}

pub(super) fn status(code: u16, reason: &str, message: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
           "reason": reason, "message": message})
    .to_string()
}

/// A tiny in-memory Lease store: answers GET, LIST, POST, PUT and a watch
/// from a version like the API server (resourceVersion bumps on every write;
/// stale PUT → 409; a watch replays the writes after its version, then ends).
/// `id`'s campaign on `b` for `ttl`, which must elect it: its term.
pub(super) async fn elected(b: &KubeLeaseBackend, id: &str, ttl: Duration) -> Term {
    let Campaign::Elected(term) = b.campaign(id, ttl, None).await.unwrap() else {
        panic!("elected expected")
    };
    term
}

pub(super) fn store(initial: Option<Value>) -> (Responder, Arc<Mutex<Option<Value>>>) {
    let state = Arc::new(Mutex::new(initial));
    let st = state.clone();
    let rv = Arc::new(Mutex::new(100u64));
    let log: Arc<Mutex<Vec<(u64, Value)>>> = Arc::default();
    let respond: Responder = Arc::new(move |s: &Seen| {
        let mut cur = st.lock().unwrap();
        let mut rv = rv.lock().unwrap();
        let mut log = log.lock().unwrap();
        let path = s.path.as_str();
        match s.method.as_str() {
            "GET" if path == format!("{BASE}/el") => match &*cur {
                Some(l) => (200, l.to_string()),
                None => (404, status(404, "NotFound", "leases \"el\" not found")),
            },
            "GET" if path.contains("watch=true") => {
                let from: u64 = path
                    .split(['?', '&'])
                    .find_map(|p| p.strip_prefix("resourceVersion="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let events: Vec<String> = log
                    .iter()
                    .filter(|(v, _)| *v > from)
                    .map(|(_, e)| e.to_string() + "\n")
                    .collect();
                (200, events.concat())
            }
            "GET" if path.starts_with(&format!("{BASE}?")) => {
                let items: Vec<Value> = cur.iter().cloned().collect();
                let list = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                                  "metadata": {"resourceVersion": rv.to_string()}, "items": items});
                (200, list.to_string())
            }
            "POST" if path.starts_with(BASE) => {
                if cur.is_some() {
                    return (409, status(409, "AlreadyExists", "already exists"));
                }
                *rv += 1;
                let mut l = s.body.clone();
                l["metadata"]["resourceVersion"] = json!(rv.to_string());
                log.push((*rv, json!({"type": "ADDED", "object": l})));
                *cur = Some(l.clone());
                (201, l.to_string())
            }
            "PUT" if path.starts_with(&format!("{BASE}/el")) => {
                let Some(c) = &*cur else {
                    return (404, status(404, "NotFound", "not found"));
                };
                if c["metadata"]["resourceVersion"] != s.body["metadata"]["resourceVersion"] {
                    return (409, status(409, "Conflict", "the object has been modified"));
                }
                *rv += 1;
                let mut l = s.body.clone();
                l["metadata"]["resourceVersion"] = json!(rv.to_string());
                log.push((*rv, json!({"type": "MODIFIED", "object": l})));
                *cur = Some(l.clone());
                (200, l.to_string())
            }
            _ => (500, status(500, "InternalError", "unexpected")),
        }
    });
    (respond, state)
}

fn methods(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect()
}

/// The body of a create: our term, its whole-second duration, no version,
/// a MicroTime renewTime and the fencing token in the annotation.
fn check_created(created: &Value, term: &Term) {
    assert_eq!(
        created["spec"]["holderIdentity"],
        json!(term.holder.term_id)
    );
    assert_eq!(created["spec"]["leaseDurationSeconds"], json!(2));
    assert_eq!(created["spec"]["leaseTransitions"], json!(0));
    assert!(created["metadata"].get("resourceVersion").is_none());
    assert!(
        created["spec"]["renewTime"].as_str().unwrap().contains('.'),
        "MicroTime"
    );
    let t0: u64 = created["metadata"]["annotations"][TOKEN_ANNOTATION]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(term.holder.fencing_token, t0);
}

#[tokio::test]
async fn absent_lease_is_created_then_renewed_and_released_by_cas() {
    let (respond, state) = store(None);
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let term = elected(&b, "pod-0", Duration::from_millis(1500)).await;
    assert_eq!(
        term.ttl,
        Duration::from_secs(2),
        "whole seconds, rounded up"
    );
    assert_eq!(term.holder.identity, "pod-0");
    assert!(term.holder.term_id.as_str().starts_with("pod-0_"));
    check_created(&seen.lock().unwrap()[2].body, &term);

    let r = b.renew(&term).await.unwrap();
    assert_eq!(
        r,
        Renewal::Renewed {
            ttl: Duration::from_secs(2),
            servers: None
        }
    );
    let put = seen.lock().unwrap()[4].clone();
    assert_eq!(put.method, "PUT");
    assert_eq!(
        put.path,
        format!("{BASE}/el?&fieldManager=leader-elector"),
        "an update, never a patch"
    );
    assert_eq!(
        put.body["metadata"]["resourceVersion"],
        json!("101"),
        "CAS on the version read"
    );
    assert_eq!(
        put.body["spec"]["holderIdentity"],
        json!(term.holder.term_id)
    );

    b.release(&term, None).await.unwrap();
    let put = seen.lock().unwrap()[5].clone();
    assert_eq!(put.body["metadata"]["resourceVersion"], json!("102"));
    assert_eq!(put.body["spec"]["holderIdentity"], json!(""));
    assert_eq!(put.body["spec"]["leaseDurationSeconds"], json!(1));
    assert_eq!(
        methods(&seen),
        vec![
            format!("GET {BASE}/el"),
            // A fresh process found nothing: the LIST's version is where
            // its view of the Lease begins.
            format!("GET {BASE}?&fieldSelector=metadata.name%3Del"),
            format!("POST {BASE}?&fieldManager=leader-elector"),
            // The replay from that version up to our create: no other term.
            format!(
                "GET {BASE}?&watch=true&timeoutSeconds=290&fieldSelector=metadata.name%3Del&allowWatchBookmarks=true&resourceVersion=100"
            ),
            format!("PUT {BASE}/el?&fieldManager=leader-elector"),
            // The release: no read of the registry (the Elector names the
            // successor from the registry it follows).
            format!("PUT {BASE}/el?&fieldManager=leader-elector"),
        ]
    );
    assert_eq!(
        state.lock().unwrap().as_ref().unwrap()["spec"]["holderIdentity"],
        json!("")
    );
}

#[tokio::test]
async fn a_held_lease_is_followed_with_one_get_and_no_write() {
    let (respond, _) = store(Some(lease("pod-1_abc", 7, 41, 3, 15)));
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let c = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap();
    let Campaign::Following(h) = c else {
        panic!("following expected: {c:?}")
    };
    assert_eq!(h.identity, "pod-1");
    assert_eq!(h.term_id, "pod-1_abc");
    assert_eq!(h.fencing_token, 41);
    assert_eq!(methods(&seen), vec![format!("GET {BASE}/el")]);
}

#[tokio::test]
async fn same_name_restart_is_a_stranger_to_its_predecessors_term() {
    // The Lease names pod-0 with another term id: we wait like any follower.
    let (respond, _) = store(Some(lease("pod-0_0123456789abcdef", 7, 41, 3, 15)));
    let (client, _) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let c = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap();
    assert!(
        matches!(c, Campaign::Following(ref h) if h.identity == "pod-0"),
        "{c:?}"
    );
}

#[tokio::test]
async fn a_released_lease_is_taken_at_once_with_transitions_and_token_plus_one() {
    let (respond, _) = store(Some(released("pod-1_abc", 7, 41, 3)));
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let c = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap();
    let Campaign::Elected(term) = c else {
        panic!("elected expected: {c:?}")
    };
    assert_eq!(term.holder.fencing_token, 42);
    let put = seen.lock().unwrap()[1].clone();
    assert_eq!(put.method, "PUT");
    assert_eq!(put.body["metadata"]["resourceVersion"], json!("7"));
    assert_eq!(put.body["spec"]["leaseTransitions"], json!(4));
    assert_eq!(put.body["spec"]["leaseDurationSeconds"], json!(2));
    assert_eq!(
        put.body["metadata"]["annotations"][TOKEN_ANNOTATION],
        json!("42")
    );
}

#[tokio::test]
async fn a_lost_race_on_update_rereads_and_follows() {
    // GET shows a released Lease; our PUT meets 409; the re-read shows pod-2.
    let calls = Arc::new(Mutex::new(0));
    let respond: Responder = Arc::new(move |s: &Seen| {
        let mut n = calls.lock().unwrap();
        *n += 1;
        match (*n, s.method.as_str()) {
            (1, "GET") => (200, released("pod-1_abc", 7, 41, 3).to_string()),
            (2, "PUT") => (409, status(409, "Conflict", "the object has been modified")),
            (3, "GET") => (200, lease("pod-2_x", 8, 42, 4, 15).to_string()),
            _ => (500, status(500, "InternalError", "unexpected request")),
        }
    });
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let c = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap();
    assert!(
        matches!(c, Campaign::Following(ref h) if h.term_id == "pod-2_x"),
        "{c:?}"
    );
    assert_eq!(seen.lock().unwrap().len(), 3, "never a second write");
}

#[tokio::test]
async fn a_renew_conflict_with_another_holder_is_lost_without_overwriting() {
    let (respond, state) = store(None);
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let Campaign::Elected(term) = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap()
    else {
        panic!()
    };
    // Edited by hand to another holder (new resourceVersion).
    *state.lock().unwrap() = Some(lease("intruder", 500, 1, 9, 15));
    let r = b.renew(&term).await.unwrap();
    assert_eq!(r, Renewal::Lost(LostReason::KeyOverwritten));
    let m = methods(&seen);
    assert_eq!(
        &m[4..],
        &[
            format!("PUT {BASE}/el?&fieldManager=leader-elector"),
            format!("GET {BASE}/el")
        ]
    );
    // Release finds nothing of ours: no write.
    b.release(&term, None).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 6);
    // Deleted by hand: renew reports the key gone.
    let (respond, state) = store(None);
    let (client, _) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let Campaign::Elected(term) = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap()
    else {
        panic!()
    };
    *state.lock().unwrap() = None;
    assert_eq!(
        b.renew(&term).await.unwrap(),
        Renewal::Lost(LostReason::KeyDeleted)
    );
}

#[tokio::test]
async fn a_deleted_lease_waits_out_the_holders_term_and_tokens_grow() {
    // The holder's Lease says 1 s; we run with 1 s too (a follower never
    // counts a term shorter than its own duration).
    let (respond, state) = store(Some(lease("pod-1_abc", 7, 41, 3, 1)));
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    assert!(matches!(
        b.campaign("pod-0", Duration::from_secs(1), None)
            .await
            .unwrap(),
        Campaign::Following(_)
    ));
    *state.lock().unwrap() = None;
    let c = b
        .campaign("pod-0", Duration::from_secs(1), None)
        .await
        .unwrap();
    let Campaign::Waiting { retry_after, .. } = c else {
        panic!("waiting expected: {c:?}")
    };
    assert!(retry_after <= Duration::from_secs(1));
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "no create while the old term may run"
    );
    tokio::time::sleep(retry_after + Duration::from_millis(20)).await;
    let term = elected(&b, "pod-0", Duration::from_secs(1)).await;
    assert!(
        term.holder.fencing_token > 41,
        "token grows across a deletion"
    );
}

#[tokio::test]
async fn errors_are_classified_once() {
    let cases: [(u16, &str, &str, bool); 5] = [
        (403, "Forbidden", "auth", false),
        (404, "NotFound", "namespace_not_found", true),
        (429, "TooManyRequests", "throttled", true),
        (500, "InternalError", "server", true),
        (503, "ServiceUnavailable", "server", true),
    ];
    for (code, reason, label, retryable) in cases {
        let respond: Responder = Arc::new(move |s: &Seen| match s.method.as_str() {
            "GET" if s.path.contains("fieldSelector") => (
                200,
                json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1",
                       "metadata": {"resourceVersion": "5"}, "items": []})
                .to_string(),
            ),
            "GET" => (404, status(404, "NotFound", "leases \"el\" not found")),
            _ => (code, status(code, reason, "denied or failed")),
        });
        let (client, _) = mock(respond);
        let b = KubeLeaseBackend::with_client(client, "ns", "el");
        let e = b
            .campaign("pod-0", Duration::from_secs(2), None)
            .await
            .unwrap_err();
        assert_eq!(e.reason(), label, "{code}");
        assert_eq!(e.is_retryable(), retryable, "{code}");
        let report = e.report();
        if code == 403 {
            assert!(
                report.contains("may not create leases.coordination.k8s.io in namespace ns"),
                "{report}"
            );
            assert!(report.contains("Role"), "{report}");
        }
        if code == 404 {
            assert!(report.contains("namespace ns not found"), "{report}");
        }
    }
}

#[tokio::test]
async fn followers_watch_the_named_lease_from_the_version_read() {
    let seen_lease = lease("pod-1_abc", 7, 41, 3, 15);
    let respond: Responder = Arc::new(move |s: &Seen| {
        if s.path.contains("watch=true") {
            let ev1 = json!({"type": "BOOKMARK", "object": {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"resourceVersion": "9"}}});
            let ev2 = json!({"type": "MODIFIED", "object": released("pod-1_abc", 10, 41, 3)});
            (200, format!("{ev1}\n{ev2}\n"))
        } else {
            (200, seen_lease.to_string())
        }
    });
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let Campaign::Following(h) = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap()
    else {
        panic!()
    };
    tokio::time::timeout(Duration::from_secs(5), b.watch(&h))
        .await
        .expect("the release event ends the watch")
        .unwrap();
    let w = seen.lock().unwrap()[1].path.clone();
    assert!(w.starts_with(&format!("{BASE}?")), "{w}");
    for part in [
        "watch=true",
        "fieldSelector=metadata.name%3Del",
        "resourceVersion=7",
        "timeoutSeconds=290",
        "allowWatchBookmarks=true",
    ] {
        assert!(w.contains(part), "{part} missing in {w}");
    }
}

/// A client whose watch requests hang forever (never answered) and whose
/// other requests `respond` answers: a hung watch beside a working API.
fn hung_watch_client(respond: Responder) -> Client {
    let hold = move |s: &Seen| (!s.path.contains("watch=true")).then(|| respond(s));
    mock_or_hold(Arc::new(hold)).0
}

#[tokio::test(start_paused = true)]
async fn a_silent_lease_expires_for_a_watching_follower_after_its_own_duration() {
    // The watch hangs and says nothing: the follower's watch resolves
    // after the Lease's 3 s (not the local 1 s TTL), measured from the read.
    let respond: Responder = Arc::new(move |s: &Seen| {
        if s.path.contains("watch=true") {
            (200, String::new())
        } else {
            (200, lease("pod-1_abc", 7, 41, 3, 3).to_string())
        }
    });
    let client = hung_watch_client(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let start = Instant::now();
    let Campaign::Following(h) = b
        .campaign("pod-0", Duration::from_secs(1), None)
        .await
        .unwrap()
    else {
        panic!()
    };
    b.watch(&h).await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(3), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
}

#[tokio::test]
async fn the_coordination_api_answers_400_naming_the_backends_that_serve_it() {
    use tower::ServiceExt;
    let app = crate::coord::http::routes(crate::coord::http::CoordState {
        service: Arc::new(crate::coord::Service::new(
            Box::new(crate::coord::Unserved::new(
                "kubernetes",
                crate::backend::registry::unserved_message("kubernetes"),
            )),
            None,
            "me".into(),
        )),
        completed_retention: Duration::from_secs(60),
    });
    for path in ["/locks/a", "/semaphores/s?permits=2", "/jobs/q/j/claim"] {
        let res = app
            .clone()
            .oneshot(
                http::Request::post(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{path}");
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("not served by the kubernetes backend")
                && text.contains("--backend etcd"),
            "{path}: {text}"
        );
    }
}

#[tokio::test]
async fn an_acquisition_whose_answer_was_lost_is_replaced_at_once_not_waited_out() {
    // The first PUT is applied by the server but its answer never arrives
    // (the Elector's deadline drops the call). Nobody claimed that term, so
    // the next campaign replaces it by CAS instead of waiting its 15 s.
    let state = Arc::new(Mutex::new(released("pod-1_abc", 7, 41, 3)));
    let st = state.clone();
    let puts = Arc::new(Mutex::new(0));
    let p = puts.clone();
    let respond = move |s: &Seen| {
        if s.method == "GET" {
            return Some((200, st.lock().unwrap().clone()));
        }
        let mut cur = st.lock().unwrap();
        assert_eq!(
            cur["metadata"]["resourceVersion"],
            s.body["metadata"]["resourceVersion"]
        );
        let rv: u64 = cur["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let mut next = s.body.clone();
        next["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
        *cur = next.clone();
        let mut n = p.lock().unwrap();
        *n += 1;
        // The first PUT is applied and never answered.
        (*n > 1).then_some((200, next))
    };
    let (client, _) = mock_or_hold(Arc::new(respond));
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let lost = tokio::time::timeout(
        Duration::from_millis(300),
        b.campaign("pod-0", Duration::from_secs(15), None),
    )
    .await;
    assert!(lost.is_err(), "the first acquisition's answer is lost");
    let orphan = state.lock().unwrap()["spec"]["holderIdentity"].clone();
    assert!(orphan.as_str().unwrap().starts_with("pod-0_"));
    let c = b
        .campaign("pod-0", Duration::from_secs(15), None)
        .await
        .unwrap();
    let Campaign::Elected(term) = c else {
        panic!("elected expected: {c:?}")
    };
    assert_ne!(json!(term.holder.term_id), orphan, "a new term, by CAS");
    assert_eq!(
        term.holder.fencing_token, 43,
        "tokens grow past the orphan's"
    );
    assert_eq!(*puts.lock().unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_create_whose_replay_is_gone_is_claimed_only_after_a_whole_duration() {
    // The replay from the absence point answers 410 (compacted): a term we
    // never saw may have run in between, so our new Lease stays unclaimed
    // for its whole duration, then is taken by CAS like any unclaimed one.
    let (inner, state) = store(None);
    let respond: Responder = Arc::new(move |s: &Seen| {
        if s.path.contains("watch=true") {
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "status": "Failure", "code": 410, "reason": "Expired", "message": "too old"}});
            (200, format!("{gone}\n"))
        } else {
            inner(s)
        }
    });
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let start = Instant::now();
    let c = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap();
    let Campaign::Waiting { retry_after, .. } = c else {
        panic!("waiting expected: {c:?}")
    };
    assert!(
        retry_after > Duration::from_millis(1900) && retry_after <= Duration::from_secs(2),
        "the Lease's whole 2 s: {retry_after:?}"
    );
    let created = state.lock().unwrap().clone().unwrap();
    assert!(
        created["spec"]["holderIdentity"]
            .as_str()
            .unwrap()
            .starts_with("pod-0_")
    );
    // Before the duration has passed: still waiting, no write.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c = b
        .campaign("pod-0", Duration::from_secs(2), None)
        .await
        .unwrap();
    assert!(matches!(c, Campaign::Waiting { .. }), "{c:?}");
    let writes = || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|s| s.method != "GET")
            .count()
    };
    assert_eq!(writes(), 1, "only the create so far");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let term = elected(&b, "pod-0", Duration::from_secs(2)).await;
    assert!(start.elapsed() >= Duration::from_secs(2));
    assert_ne!(
        json!(term.holder.term_id),
        created["spec"]["holderIdentity"],
        "a new term, by CAS"
    );
    let token: u64 = created["metadata"]["annotations"][TOKEN_ANNOTATION]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(term.holder.fencing_token, token + 1);
    assert_eq!(writes(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_campaign_dropped_during_its_replay_leaves_the_lease_unclaimed_for_a_whole_duration() {
    // The replay's watch never answers and the Elector's deadline drops the
    // campaign after the create was applied: the Lease names us, but nobody
    // claims it until a whole duration after the create's answer.
    let (inner, state) = store(None);
    let client = hung_watch_client(inner);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let ttl = Duration::from_secs(3);
    let start = Instant::now();
    let dropped =
        tokio::time::timeout(Duration::from_millis(300), b.campaign("pod-0", ttl, None)).await;
    assert!(
        dropped.is_err(),
        "the campaign is dropped during its replay"
    );
    assert!(state.lock().unwrap().is_some(), "the create was applied");
    let c = b.campaign("pod-0", ttl, None).await.unwrap();
    let Campaign::Waiting { retry_after, .. } = c else {
        panic!("waiting expected: {c:?}")
    };
    assert!(
        retry_after > Duration::from_millis(2500) && retry_after <= ttl,
        "about the whole 3 s from the create: {retry_after:?}"
    );
    tokio::time::sleep(retry_after).await;
    let Campaign::Elected(_) = b.campaign("pod-0", ttl, None).await.unwrap() else {
        panic!("elected once the whole duration has passed")
    };
    assert!(start.elapsed() >= ttl);
}
