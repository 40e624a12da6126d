//! The coordination API on the Kubernetes Lease backend, through real
//! sidecars on the API stand-in: what the Lease objects look like, fencing
//! tokens across release and deletion, third parties editing or deleting a
//! held lock's Lease, waiters woken by the watch, completed jobs forgotten
//! after the retention. The behaviour shared with etcd and Redis is tested
//! in `coord` and `model`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::support::kube_api::{Endpoint, KubeApi};
use crate::support::*;
use leader_elector::backend::kubernetes::coord::object_name;
use leader_elector::coord::Kind;
use serde_json::Value;
use tokio::time::{Instant, sleep};

const NS: &str = "locks";

/// One HTTP request to a control API; panics when there is no answer.
async fn call(port: u16, method: &str, path: &str) -> (u16, Value) {
    http_json(port, method, path, None, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the control API (did the sidecar die?): {e}"))
}

/// Sidecars `ids` on their own endpoints of one stand-in, with `extra` flags.
async fn sidecars(
    test: &str,
    ids: &[&str],
    extra: &[&str],
) -> (KubeApi, Vec<(Arc<Endpoint>, Sidecar, u16)>) {
    let api = KubeApi::start(NS);
    let mut out = Vec::new();
    for id in ids {
        let ep = api.endpoint(id).await;
        let mut args = vec!["--backend".to_owned(), "kubernetes".to_owned()];
        args.extend(
            FAST.iter()
                .chain(CONTROL)
                .chain(extra)
                .map(|s| s.to_string()),
        );
        let kubeconfig = ep.kubeconfig().to_string_lossy().into_owned();
        let s = Sidecar::start_env(&election(test), id, &args, &[("KUBECONFIG", &kubeconfig)]);
        let port = s.control();
        out.push((ep, s, port));
    }
    (api, out)
}

fn fence(g: &Value) -> u64 {
    g["fencing_token"].as_u64().expect("a fencing token")
}

fn token(g: &Value) -> &str {
    g["token"].as_str().expect("a token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_semaphore_and_job_leases_say_what_they_are_and_keep_their_fencing_counter() {
    let (api, s) = sidecars("lease-objects", &["a"], &[]).await;
    let port = s[0].2;
    let (st, g1) = call(port, "POST", "/locks/My.Lock?ttl=5s&owner=w1").await;
    assert_eq!(st, 200, "{g1}");
    let object = object_name(Kind::Lock, "My.Lock");
    let lease = api.lease(&object).expect("one Lease for the lock");
    let meta = &lease["metadata"];
    assert_eq!(meta["labels"]["leader-elector.io/kind"], "lock");
    assert!(meta["labels"]["leader-elector.io/election"].is_string());
    assert_eq!(meta["annotations"]["leader-elector.io/name"], "My.Lock");
    assert_eq!(lease["spec"]["holderIdentity"], "w1");
    let (st, _) = call(
        port,
        "DELETE",
        &format!("/locks/My.Lock?token={}", token(&g1)),
    )
    .await;
    assert_eq!(st, 200);
    // Released, not deleted: the counter stays, and the next grant is above.
    let kept = api.lease(&object).expect("the lock's Lease stays");
    assert!(kept["spec"]["holderIdentity"].is_null(), "{kept}");
    let (st, g2) = call(port, "POST", "/locks/My.Lock?ttl=5s").await;
    assert_eq!(st, 200, "{g2}");
    assert!(fence(&g2) > fence(&g1), "{g1} then {g2}");
    // Another case of the same name is another lock.
    let (st, other) = call(port, "POST", "/locks/my.lock?ttl=5s").await;
    assert_eq!(st, 200, "{other}");
    for (path, kind, object) in [
        (
            "/semaphores/pool?permits=2&ttl=5s",
            "semaphore",
            object_name(Kind::Semaphore, "pool"),
        ),
        (
            "/jobs/q/j1/claim?ttl=5s",
            "job",
            object_name(Kind::Job, "q/j1"),
        ),
    ] {
        let (st, g) = call(port, "POST", path).await;
        assert_eq!(st, 200, "{g}");
        let l = api.lease(&object).expect("a Lease");
        assert_eq!(l["metadata"]["labels"]["leader-elector.io/kind"], kind);
    }
    let (st, full) = call(port, "POST", "/semaphores/pool?permits=2&ttl=5s").await;
    assert_eq!(st, 200, "{full}");
    let (st, full) = call(port, "POST", "/semaphores/pool?permits=2&ttl=5s").await;
    assert_eq!(
        (st, full["live_permits"].as_u64()),
        (409, Some(2)),
        "{full}"
    );
}

/// A third party removes a held lock's holder (`edit`) or deletes its
/// Lease: another client is refused until the first holder's TTL has run
/// out by the sidecar's sight, then granted (the liveness twin), with a
/// greater fencing token.
async fn third_party(test: &str, edit: bool) {
    let (api, s) = sidecars(test, &["a", "b"], &[]).await;
    let (pa, pb) = (s[0].2, s[1].2);
    let object = object_name(Kind::Lock, "res");
    let sent = Instant::now();
    let (st, a) = call(pa, "POST", "/locks/res?ttl=3s&owner=first").await;
    assert_eq!(st, 200, "{a}");
    // Sidecar b has seen the holder (the watch, or a refused try).
    let (st, r) = call(pb, "POST", "/locks/res?ttl=3s&owner=second").await;
    assert_eq!((st, r["holder"].as_str()), (409, Some("first")), "{r}");
    if edit {
        assert!(api.edit_lease(&object, |l| {
            l["metadata"]["annotations"]
                .as_object_mut()
                .unwrap()
                .remove("leader-elector.io/coordination");
            l["spec"]["holderIdentity"] = Value::Null;
        }));
    } else {
        assert!(api.delete_lease(&object));
    }
    sleep(Duration::from_millis(200)).await;
    for port in [pa, pb] {
        let (st, r) = call(port, "POST", "/locks/res?ttl=3s&owner=second").await;
        assert_eq!((st, r["holder"].as_str()), (409, Some("first")), "{r}");
    }
    let (st, b) = call(pb, "POST", "/locks/res?ttl=3s&owner=second&wait=6s").await;
    assert_eq!(st, 200, "the lock never became grantable again: {b}");
    assert!(
        sent.elapsed() >= Duration::from_secs(3),
        "granted {:?} after the first holder's request, within its TTL",
        sent.elapsed()
    );
    assert!(fence(&b) > fence(&a), "{a} then {b}");
    // The first holder's token is no longer good.
    let (st, _) = call(pa, "POST", &format!("/locks/res/renew?token={}", token(&a))).await;
    assert_eq!(st, 410);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_edit_of_a_held_locks_lease_never_makes_two_holders() {
    third_party("lease-edited", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_locks_lease_deleted_by_hand_never_makes_two_holders() {
    third_party("lease-deleted", false).await;
}

fn reads(ep: &Endpoint) -> u64 {
    ep.counts().get("GET lease").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_the_watch_and_do_not_poll() {
    let (_api, s) = sidecars("lease-waiters", &["a", "b"], &[]).await;
    let ((_, _, pa), (eb, _, pb)) = (&s[0], &s[1]);
    let (st, a) = call(*pa, "POST", "/locks/w?ttl=20s").await;
    assert_eq!(st, 200, "{a}");
    // A waiter on the other sidecar while the lock stays held: refused at
    // the end of its wait, having read the Lease at most twice.
    // (After a first try, which starts its watch, and the election's
    // start-up reads.)
    let (st, _) = call(*pb, "POST", "/locks/w?ttl=5s").await;
    assert_eq!(st, 409);
    sleep(Duration::from_secs(1)).await;
    let before = reads(eb);
    let (st, r) = call(*pb, "POST", "/locks/w?ttl=5s&wait=3s").await;
    assert_eq!(st, 409, "{r}");
    let polled = reads(eb) - before;
    assert!(polled <= 2, "a waiter read the Lease {polled} times in 3 s");
    // The twin: released on the other sidecar while it waits, it is granted.
    let release = format!("/locks/w?token={}", token(&a));
    let pa = *pa;
    let releaser = tokio::spawn(async move {
        sleep(Duration::from_millis(500)).await;
        call(pa, "DELETE", &release).await
    });
    let (st, b) = call(*pb, "POST", "/locks/w?ttl=5s&wait=10s").await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(releaser.await.unwrap().0, 200);
    assert!(fence(&b) > fence(&a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_jobs_lease_is_deleted_after_the_retention_and_the_job_claimable_again() {
    let extra = ["--completed-retention", "1s"];
    let (api, s) = sidecars("lease-jobs", &["a"], &extra).await;
    let port = s[0].2;
    let object = object_name(Kind::Job, "q/7");
    let (st, c) = call(port, "POST", "/jobs/q/7/claim?ttl=5s").await;
    assert_eq!(st, 200, "{c}");
    let (st, _) = call(
        port,
        "POST",
        &format!("/jobs/q/7/complete?token={}", token(&c)),
    )
    .await;
    assert_eq!(st, 200);
    let (st, r) = call(port, "POST", "/jobs/q/7/claim?ttl=5s").await;
    assert_eq!((st, r["state"].as_str()), (409, Some("completed")), "{r}");
    let end = Instant::now() + Duration::from_secs(20);
    while api.lease(&object).is_some() {
        assert!(
            Instant::now() < end,
            "the completed job's Lease was never deleted"
        );
        sleep(Duration::from_millis(100)).await;
    }
    let (st, again) = call(port, "POST", "/jobs/q/7/claim?ttl=5s").await;
    assert_eq!(st, 200, "{again}");
    assert!(fence(&again) > fence(&c), "{c} then {again}");
    // Every request is one the chart's Role grants, `delete` among them.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/leader-elector/ci/sidecar-requests.txt"
    );
    let listed = std::fs::read_to_string(path).unwrap();
    let made: BTreeSet<String> = s[0]
        .0
        .log()
        .iter()
        .map(|l| format!("{} {}", l.verb, l.resource))
        .collect();
    assert!(made.contains("delete leases"), "{made:?}");
    for r in &made {
        assert!(listed.lines().any(|l| l == r), "{r} is not in {path}");
    }
}

/// A fair waiter whose client went away leaves its entry in the queue: the
/// lock is refused while it may still be renewed, and granted once its TTL
/// has run out by the sidecars' sight (the liveness twin of the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_waiter_blocks_the_lock_only_until_its_ttl() {
    let (_api, s) = sidecars("lease-dead-waiter", &["a", "b"], &[]).await;
    let (pa, pb) = (s[0].2, s[1].2);
    let (st, a) = call(pa, "POST", "/locks/q?ttl=10s").await;
    assert_eq!(st, 200, "{a}");
    let waiter =
        tokio::spawn(async move { call(pb, "POST", "/locks/q?fair=true&ttl=2s&wait=20s").await });
    sleep(Duration::from_millis(300)).await;
    waiter.abort();
    sleep(Duration::from_millis(100)).await;
    let (st, _) = call(pa, "DELETE", &format!("/locks/q?token={}", token(&a))).await;
    assert_eq!(st, 200);
    let (st, r) = call(pa, "POST", "/locks/q?ttl=2s").await;
    assert_eq!(
        st, 409,
        "granted past a fair waiter that may still be there: {r}"
    );
    let (st, g) = call(pa, "POST", "/locks/q?ttl=2s&wait=6s").await;
    assert_eq!(
        st, 200,
        "the dead waiter blocked the lock past its TTL: {g}"
    );
    assert!(fence(&g) > fence(&a));
}

/// Issue 37 item 6: at rest, after a lock was held and released, the stand-in
/// sees only renewals — the leader's Lease renewals and each candidate's
/// record renewals — and no LIST from anyone; each follower holds one watch
/// on the election Lease. Prints every client's requests over the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_rest_after_a_lock_only_renewals_and_one_watch_per_follower() {
    let (api, s) = sidecars("lease-rest", &["a", "b", "c"], &[]).await;
    let ports: Vec<u16> = s.iter().map(|x| x.2).collect();
    let start = Instant::now();
    let leader = loop {
        let mut l = Vec::new();
        for (i, x) in s.iter().enumerate() {
            if x.1.is_leader().await {
                l.push(i);
            }
        }
        if l.len() == 1 {
            break l[0];
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no single leader: {l:?}"
        );
        sleep(Duration::from_millis(100)).await;
    };
    println!("leader: {leader}");
    let (st, g) = call(ports[0], "POST", "/locks/rest?ttl=5s&owner=w1").await;
    assert_eq!(st, 200, "{g}");
    let (st, _) = call(
        ports[0],
        "DELETE",
        &format!("/locks/rest?token={}", token(&g)),
    )
    .await;
    assert_eq!(st, 200);
    sleep(Duration::from_secs(3)).await;
    let before: Vec<usize> = s.iter().map(|x| x.0.log().len()).collect();
    let window = Duration::from_secs(10);
    sleep(window).await;
    let mut lists = Vec::new();
    for (i, (ep, _, _)) in s.iter().enumerate() {
        let log = ep.log();
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for l in &log[before[i]..] {
            *by.entry(format!("{} {} {}", l.verb, l.resource, l.name))
                .or_default() += 1;
            if l.verb == "list" {
                lists.push((i, l.resource.clone()));
            }
        }
        let watches = ep.open_watches();
        if i != leader {
            assert_eq!(
                watches, 1,
                "follower {i} holds one watch, of the election Lease"
            );
        }
        let role = if i == leader { "leader" } else { "follower" };
        println!("at rest {window:?}, client {i} ({role}): {by:?}; watches open: {watches}");
    }
    drop(api);
    assert!(lists.is_empty(), "LISTs at rest: {lists:?}");
}
