//! The labeler against kube-rs's mock service (`tower_test::mock`): the exact
//! requests (method, path, patch type, body) and their order. No API server
//! runs in our test environment.

use std::sync::{Arc, Mutex};

use super::super::check_label_key;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::elector::{Elector, ElectorConfig, LeaderState, OwnTerm};
use crate::kube_client::mock::{Seen, mock};

type Responder = crate::kube_client::mock::Responder<Value>;

fn pod_json(name: &str, label: Option<&str>) -> Value {
    let mut labels = serde_json::Map::new();
    if let Some(v) = label {
        labels.insert(KEY.into(), json!(v));
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": labels}})
}

const KEY: &str = "leader-elector/leader";

/// Answers like an API server where pod-1 (stale leader) and pod-0 (us) exist.
fn ok_server() -> Responder {
    Arc::new(|s: &Seen| match s.method.as_str() {
        "PATCH" => {
            let name = s
                .path
                .rsplit('/')
                .next()
                .unwrap()
                .split('?')
                .next()
                .unwrap()
                .to_owned();
            (
                200,
                pod_json(&name, s.body["metadata"]["labels"][KEY].as_str()),
            )
        }
        "GET" if s.path.contains("labelSelector") => (
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod_json("pod-0", Some("true")), pod_json("pod-1", Some("true"))]}),
        ),
        "GET" => (200, pod_json("pod-0", Some("true"))),
        "POST" => (201, s.body.clone()),
        _ => (404, json!({})),
    })
}

fn cfg(events: bool) -> LabelerConfig {
    LabelerConfig {
        key: KEY.into(),
        pod: "pod-0".into(),
        namespace: "ns".into(),
        events,
    }
}

fn state(leading: bool, token: u64) -> LeaderState {
    LeaderState {
        election: "e".into(),
        identity: "pod-0".into(),
        backend: "memory",
        leader: leading.then(|| "pod-0".to_owned()),
        fencing_token: leading.then_some(token),
        term_observed_at: None,
        own_term: leading.then(|| OwnTerm {
            suspended_at_send: crate::elector::suspend::suspended(),
            valid_until: tokio::time::Instant::now() + Duration::from_secs(60),
            fencing_token: token,
        }),
        lease_duration: Duration::from_secs(15),
        backend_healthy: true,
        error: None,
        stopping: false,
        transitions: 0,
        servers: None,
        heard_until: None,
        waiting: None,
        paused: false,
        priority: 1,
        pinned: None,
        failsafe: None,
    }
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn patch_of(s: &Seen) -> (&str, &str) {
    (
        s.path.as_str(),
        s.body["metadata"]["labels"][KEY].as_str().unwrap_or("?"),
    )
}

/// The patch paths of our own Pod and another's (with our field manager).
const POD0: &str = "/api/v1/namespaces/ns/pods/pod-0?&fieldManager=leader-elector";
const POD1: &str = "/api/v1/namespaces/ns/pods/pod-1?&fieldManager=leader-elector";

#[tokio::test]
async fn start_acquire_and_release_send_exact_requests_in_order() {
    let (client, seen) = mock(ok_server());
    let (tx, rx) = watch::channel(state(false, 0));
    let (acting_tx, acting) = watch::channel(None);
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_labeler(
        client,
        cfg(true),
        rx,
        acting_tx,
        None,
        stop.clone(),
    ));
    settle().await;
    // Start: "false" on our own Pod, as a JSON merge patch.
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].method, "PATCH");
        assert_eq!(s[0].path, POD0);
        assert_eq!(s[0].content_type, "application/merge-patch+json");
        assert_eq!(s[0].body, json!({"metadata": {"labels": {KEY: "false"}}}));
    }
    // Acquire: an Event, "true", then the stale label of pod-1 is cleared.
    tx.send_replace(state(true, 7));
    settle().await;
    {
        let s = seen.lock().unwrap();
        assert_eq!(s[1].method, "POST");
        assert_eq!(
            s[1].path,
            "/api/v1/namespaces/ns/events?&fieldManager=leader-elector"
        );
        assert_eq!(s[1].body["reason"], "BecameLeader");
        assert_eq!(s[1].body["involvedObject"]["name"], "pod-0");
        assert_eq!(s[1].body["involvedObject"]["kind"], "Pod");
        assert_eq!(s[2].method, "PATCH");
        assert_eq!(patch_of(&s[2]), (POD0, "true"));
        assert_eq!(s[3].method, "GET");
        assert_eq!(
            s[3].path,
            "/api/v1/namespaces/ns/pods?&labelSelector=leader-elector%2Fleader%3Dtrue"
        );
        assert_eq!(s[4].method, "PATCH");
        assert_eq!(patch_of(&s[4]), (POD1, "false"));
        assert_eq!(s[4].content_type, "application/merge-patch+json");
        assert_eq!(s.len(), 5, "{s:?}");
    }
    assert_eq!(
        *acting.borrow(),
        Some(7),
        "acting for term 7 while labelled true"
    );
    // Graceful release: an Event, then "false" before the Elector may release.
    let mut released = state(false, 0);
    released.stopping = true;
    tx.send_replace(released);
    settle().await;
    {
        let s = seen.lock().unwrap();
        assert_eq!(s[5].body["reason"], "StoppedLeading");
        assert_eq!(patch_of(&s[6]), (POD0, "false"));
        assert_eq!(s.len(), 7, "{s:?}");
    }
    assert_eq!(*acting.borrow(), None, "let go after the false patch");
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_label_changed_by_hand_is_put_back_on_the_next_renewal() {
    let hand_edited: Responder = Arc::new(|s: &Seen| match s.method.as_str() {
        "GET" if !s.path.contains("labelSelector") => (200, pod_json("pod-0", Some("false"))),
        "GET" => (
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}),
        ),
        _ => (200, pod_json("pod-0", Some("true"))),
    });
    let (client, seen) = mock(hand_edited);
    let (tx, rx) = watch::channel(state(true, 3));
    let (acting_tx, _acting) = watch::channel(None);
    let stop = CancellationToken::new();
    tokio::spawn(run_labeler(
        client,
        cfg(false),
        rx,
        acting_tx,
        None,
        stop.clone(),
    ));
    settle().await;
    let before = seen.lock().unwrap().len();
    // A renewal: the labeler reads the Pod, sees "false", patches "true".
    tx.send_modify(|s| s.own_term.as_mut().unwrap().valid_until += Duration::from_secs(1));
    settle().await;
    let s = seen.lock().unwrap();
    let new: Vec<_> = s[before..]
        .iter()
        .map(|x| (x.method.clone(), x.body["metadata"]["labels"][KEY].clone()))
        .collect();
    assert_eq!(new[0].0, "GET");
    assert_eq!(new[1], ("PATCH".to_owned(), json!("true")), "{new:?}");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_403_never_changes_who_leads_and_the_key_is_released_anyway() {
    let forbidden: Responder = Arc::new(|_s: &Seen| {
        (
            403,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                   "message": "pods \"pod-0\" is forbidden: User \"system:serviceaccount:ns:default\" cannot patch resource \"pods\""}),
        )
    });
    let (client, seen) = mock(forbidden);
    let backend = MemoryBackend::new();
    let ecfg = ElectorConfig {
        retry_period: Duration::from_millis(200),
        health_grace: Duration::from_secs(1),
        ..ElectorConfig::new("e", "pod-0", Duration::from_secs(3))
    };
    let metrics = crate::metrics::Metrics::new(prometheus::Registry::new(), "e", "memory").unwrap();
    let (mut elector, rx) = Elector::connected(ecfg, &backend.connected(), None);
    let acting = elector.add_participant();
    let stop = CancellationToken::new();
    let labeler = tokio::spawn(run_labeler(
        client,
        cfg(false),
        rx.clone(),
        acting,
        Some(metrics.clone()),
        stop.clone(),
    ));
    let elector_task = tokio::spawn(elector.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        rx.borrow().is_leader(tokio::time::Instant::now()),
        "the election went on despite 403s"
    );
    assert!(!seen.lock().unwrap().is_empty());
    assert!(
        metrics
            .render()
            .contains("leader_election_pod_label_failures_total{name=\"e\",reason=\"forbidden\"}"),
        "{}",
        metrics.render()
    );
    // Shutdown: the labeler cannot patch; the Elector releases anyway (bounded wait).
    let t0 = tokio::time::Instant::now();
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(4), elector_task)
        .await
        .expect("the elector finished")
        .unwrap();
    assert!(t0.elapsed() <= PARTICIPANT_WAIT_BOUND);
    assert!(backend.holder().is_none(), "the key was released");
    let _ = labeler.await;
}

const PARTICIPANT_WAIT_BOUND: Duration = Duration::from_millis(2500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_label_goes_false_before_the_key_is_released() {
    let backend = MemoryBackend::new();
    let b2 = backend.clone();
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let o2 = order.clone();
    let respond: Responder = Arc::new(move |s: &Seen| {
        if s.method == "PATCH" {
            let v = s.body["metadata"]["labels"][KEY]
                .as_str()
                .unwrap_or("?")
                .to_owned();
            let holder = b2
                .holder()
                .map(|h| h.identity)
                .unwrap_or_else(|| "nobody".into());
            o2.lock()
                .unwrap()
                .push(format!("patch {v} while the key is held by {holder}"));
        }
        match s.method.as_str() {
            "GET" => (
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}),
            ),
            _ => (200, pod_json("pod-0", Some("x"))),
        }
    });
    let (client, _seen) = mock(respond);
    let ecfg = ElectorConfig {
        retry_period: Duration::from_millis(200),
        health_grace: Duration::from_secs(1),
        ..ElectorConfig::new("e", "pod-0", Duration::from_secs(3))
    };
    let (mut elector, rx) = Elector::connected(ecfg, &backend.connected(), None);
    let acting = elector.add_participant();
    let stop = CancellationToken::new();
    tokio::spawn(run_labeler(
        client,
        cfg(false),
        rx.clone(),
        acting,
        None,
        stop.clone(),
    ));
    // The start-up "false" goes out before the campaign begins.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let task = tokio::spawn(elector.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    task.await.unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            "patch false while the key is held by nobody",
            "patch true while the key is held by pod-0",
            "patch false while the key is held by pod-0",
        ],
        "{order:?}"
    );
    assert!(backend.holder().is_none());
}

#[test]
fn label_keys_are_checked() {
    assert!(check_label_key("leader-elector/leader").is_ok());
    assert!(check_label_key("leader").is_ok());
    assert!(check_label_key("example.com/is-leader").is_ok());
    assert!(check_label_key("Bad_Prefix/x").is_err());
    assert!(check_label_key("x/").is_err());
    assert!(check_label_key("-x").is_err());
    assert!(check_label_key(&"a".repeat(64)).is_err());
}
