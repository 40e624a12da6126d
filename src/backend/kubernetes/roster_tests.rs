//! The Lease backend's failsafe roster against kube-rs's mock service: the
//! roster rides in the term's own writes, a member trusts "no roster" only
//! where no failsafe leader can be hidden behind it, and applications are
//! Leases listed by label.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::*;
use crate::backend::kubernetes::tests::{elected, status, store};
use crate::kube_client::mock::{Seen, mock};

type Responder = crate::kube_client::mock::Responder<String>;

fn member(id: &str) -> Member {
    Member {
        identity: id.into(),
        peer_addr: format!("{id}:4042"),
    }
}

fn annotations(v: &Value) -> Value {
    v["metadata"]["annotations"].clone()
}

#[tokio::test]
async fn the_roster_rides_in_the_campaign_and_every_renewal() {
    let (respond, state) = store(None);
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let roster = Roster::new([member("pod-0"), member("pod-1")]);
    b.stage("pod-0", roster.clone());
    let term = elected(&b, "pod-0", Duration::from_secs(2)).await;
    let written = state.lock().unwrap().clone().unwrap();
    assert_eq!(
        annotations(&written)[ROSTER_ANNOTATION],
        json!(roster.to_json())
    );
    assert_eq!(b.roster().await.unwrap(), Some(roster.clone()));
    // A renewal writes it again (a hand edit in between is undone).
    b.renew(&term).await.unwrap();
    let put = seen
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s.method == "PUT")
        .cloned();
    let put = put.expect("a renewal PUT");
    assert_eq!(
        annotations(&put.body)[ROSTER_ANNOTATION],
        json!(roster.to_json())
    );
}

fn held(holder: &str, rv: u64, renewed: &str, roster: Option<&Roster>) -> Value {
    let mut l = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "el", "namespace": "ns", "resourceVersion": rv.to_string(),
                     "annotations": {TOKEN_ANNOTATION: "7"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 2,
                 "renewTime": renewed}
    });
    if let Some(r) = roster {
        l["metadata"]["annotations"][ROSTER_ANNOTATION] = json!(r.to_json());
    }
    l
}

#[tokio::test]
async fn a_member_trusts_no_roster_only_where_no_failsafe_leader_can_hide() {
    let current: Arc<Mutex<Option<Value>>> = Arc::default();
    let c = current.clone();
    let respond: Responder =
        Arc::new(
            move |s: &Seen| match (&*c.lock().unwrap(), s.path.contains('?')) {
                (Some(l), false) => (200, l.to_string()),
                (_, true) => (
                    200,
                    json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1",
                                   "metadata": {"resourceVersion": "1"}, "items": []})
                    .to_string(),
                ),
                (None, false) => (404, status(404, "NotFound", "not found")),
            },
        );
    let (client, _) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    let set = |l: Value| *current.lock().unwrap() = Some(l);
    let (t1, t2, t3) = (
        "2026-01-01T00:00:01.000000Z",
        "2026-01-01T00:00:02.000000Z",
        "2026-01-01T00:00:03.000000Z",
    );
    // No Lease: anyone may campaign.
    assert_eq!(b.roster().await.unwrap(), None);
    // Held, no roster, first sight: its holder may be a failsafe leader
    // whose roster was removed by hand.
    set(held("pod-1_a", 2, t1, None));
    let e = b.roster().await.unwrap_err();
    assert_eq!(e.reason(), "roster_unknown", "{}", e.report());
    // The same term renewed without one: a holder without failsafe.
    set(held("pod-1_a", 3, t2, None));
    assert_eq!(b.roster().await.unwrap(), None);
    // A term seen carrying a roster never counts as roster-less again.
    let r = Roster::new([member("pod-2")]);
    set(held("pod-2_b", 4, t1, Some(&r)));
    assert_eq!(b.roster().await.unwrap(), Some(r));
    set(held("pod-2_b", 5, t2, None));
    assert!(b.roster().await.is_err());
    set(held("pod-2_b", 6, t3, None));
    assert!(b.roster().await.is_err(), "a failsafe term stays one");
    // Cleared by hand (no release mark): not trusted; released: trusted.
    set(held("", 7, t3, None));
    assert!(b.roster().await.is_err());
    let mut released = held("", 8, t3, None);
    released["metadata"]["annotations"][RELEASED_ANNOTATION] = json!("pod-2_b");
    set(released);
    assert_eq!(b.roster().await.unwrap(), None);
    // A garbled roster is not a roster.
    let mut garbled = held("pod-3_c", 9, t1, None);
    garbled["metadata"]["annotations"][ROSTER_ANNOTATION] = json!("{not json");
    set(garbled);
    assert!(b.roster().await.is_err());
}

#[tokio::test]
async fn applications_are_leases_listed_by_label_until_they_lapse() {
    let apps: Arc<Mutex<Vec<Value>>> = Arc::default();
    let a = apps.clone();
    let respond: Responder = Arc::new(move |s: &Seen| match s.method.as_str() {
        "GET" if s.path.contains("labelSelector") => {
            let items = a.lock().unwrap().clone();
            (
                200,
                json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1",
                         "metadata": {"resourceVersion": "1"}, "items": items})
                .to_string(),
            )
        }
        "GET" => (404, status(404, "NotFound", "not found")),
        "POST" => {
            a.lock().unwrap().push(s.body.clone());
            (201, s.body.to_string())
        }
        "DELETE" => {
            a.lock().unwrap().clear();
            (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}).to_string(),
            )
        }
        _ => (500, status(500, "InternalError", "unexpected")),
    });
    let (client, seen) = mock(respond);
    let b = KubeLeaseBackend::with_client(client, "ns", "el");
    b.apply(&member("pod-1"), Duration::from_secs(30))
        .await
        .unwrap();
    let posted = seen.lock().unwrap().last().cloned().unwrap();
    assert!(
        posted
            .path
            .starts_with("/apis/coordination.k8s.io/v1/namespaces/ns/leases?"),
        "{}",
        posted.path
    );
    assert_eq!(
        posted.body["metadata"]["labels"][ROLE_LABEL_FOR_TEST],
        json!("failsafe-member")
    );
    assert_eq!(b.applicants().await.unwrap(), vec![member("pod-1")]);
    let selector = seen.lock().unwrap().last().cloned().unwrap().path;
    assert!(selector.contains("failsafe-member"), "{selector}");
    // Lapsed by its renewTime + duration: dropped.
    apps.lock().unwrap()[0]["spec"]["renewTime"] = json!("2020-01-01T00:00:00.000000Z");
    assert_eq!(b.applicants().await.unwrap(), vec![]);
    b.withdraw("pod-1").await.unwrap();
    assert!(apps.lock().unwrap().is_empty());
}

const ROLE_LABEL_FOR_TEST: &str = super::super::candidates::ROLE_LABEL;
