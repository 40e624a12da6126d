//! Handover to a named successor on the Kubernetes stand-in: the candidate
//! registry (one Lease per sidecar, labelled by election and role), the
//! release naming the registry's best candidate, and the others leaving it
//! one round trip. Each safety test has its liveness twin: a dead named
//! successor, a record deleted by hand, an empty registry.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep};

use crate::kubernetes::{Group, group_with, holder, until_no_overlap};
use crate::support::*;

/// Ten candidates: enough for a stampede to show, few enough for 2 cores.
const N: usize = 10;

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("pod-{i}")).collect()
}

async fn ten(test: &str) -> Group {
    let ids = ids(N);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    group_with(test, &refs, &[], false).await
}

/// The candidate Leases of the group's election, by holder identity.
fn records(g: &Group) -> Vec<Value> {
    g.api
        .objects("leases")
        .into_iter()
        .filter(|l| {
            l["metadata"]["labels"]["leader-elector.io/election"] == json!(g.election)
                && l["metadata"]["labels"]["leader-elector.io/role"] == json!("candidate")
        })
        .collect()
}

fn record_of(g: &Group, id: &str) -> Option<Value> {
    records(g)
        .into_iter()
        .find(|l| l["spec"]["holderIdentity"] == json!(id))
}

async fn until_registered(g: &Group, n: usize) {
    wait_for(
        Duration::from_secs(20),
        "every candidate's record",
        || async { records(g).len() == n },
    )
    .await;
}

/// Raise `id`'s priority in its record by hand (its owner rewrites it only
/// at its next renewal, 4 lease durations later), so the test knows whom
/// the leader will name.
fn prefer(g: &Group, id: &str) {
    let name = record_of(g, id).expect("a record")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(g.api.edit("leases", &name, |l| {
        l["metadata"]["annotations"]["leader-elector.io/priority"] = json!("5");
    }));
}

/// Update attempts (PUT or POST) on the election Lease in each endpoint's
/// log after `marks` (the new leader's up to its claim: its renewals
/// after it are not part of the handover), and how many were refused
/// with 409.
fn attempts_since(g: &Group, marks: &[usize], new: usize) -> (Vec<usize>, usize) {
    let mut per = Vec::new();
    let mut conflicts = 0;
    for (i, (ep, mark)) in g.eps.iter().zip(marks).enumerate() {
        let mut writes: Vec<_> = ep.log()[*mark..]
            .iter()
            .filter(|l| l.name == g.election && matches!(l.verb, "update" | "create"))
            .cloned()
            .collect();
        if i == new
            && let Some(claim) = writes.iter().position(|l| l.code < 300)
        {
            writes.truncate(claim + 1);
        }
        conflicts += writes.iter().filter(|l| l.code == 409).count();
        per.push(writes.len());
    }
    (per, conflicts)
}

fn marks(g: &Group) -> Vec<usize> {
    g.eps.iter().map(|ep| ep.log().len()).collect()
}

/// SIGTERM the leader and wait for another: its index and the time taken.
async fn hand_over(g: &mut Group, leader: usize, limit: Duration) -> (usize, Duration) {
    let start = Instant::now();
    g.cs[leader].signal(Signal::SIGTERM);
    let l = until_no_overlap(&g.cs, limit, "a new leader", |l| {
        l.len() == 1 && l[0] != leader
    })
    .await;
    (l[0], start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_among_ten_goes_to_the_named_successor_in_two_updates() {
    let mut g = ten("k-successor").await;
    let first = one_leader(&g.cs, Duration::from_secs(30)).await;
    until_registered(&g, N).await;
    let named = (first + 3) % N;
    prefer(&g, &g.cs[named].identity.clone());
    // The leader names its successor from the registry it follows (its
    // registry watch, then a list at most every 100 ms), not from a read
    // at release: let the edit reach it before the SIGTERM.
    sleep(Duration::from_millis(500)).await;
    let marks = marks(&g);
    let (second, took) = hand_over(&mut g, first, Duration::from_secs(10)).await;
    // Let any straggler's attempt land before counting.
    sleep(Duration::from_secs(1)).await;
    let (per, conflicts) = attempts_since(&g, &marks, second);
    println!(
        "handover among {N} to the named successor: {took:?}, update attempts {per:?}, 409s {conflicts}"
    );
    assert_eq!(second, named, "the named successor leads");
    let others: usize = (0..N).filter(|i| *i != first).map(|i| per[i]).sum();
    assert_eq!(others, 1, "only the successor's claim: {per:?}");
    // The release, and at most one renewal already in flight at SIGTERM.
    assert!((1..=2).contains(&per[first]), "{per:?}");
    assert_eq!(conflicts, 0, "{per:?}");
    g.cs[first].wait_exit(Duration::from_secs(5)).await;
    wait_for(
        Duration::from_secs(5),
        "the old leader's record withdrawn",
        || async { record_of(&g, &g.cs[first].identity).is_none() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_named_successor_costs_the_others_only_the_wait() {
    let mut g = ten("k-successor-dead").await;
    let first = one_leader(&g.cs, Duration::from_secs(30)).await;
    until_registered(&g, N).await;
    let named = (first + 1) % N;
    prefer(&g, &g.cs[named].identity.clone());
    g.cs[named].signal(Signal::SIGKILL);
    g.cs[named].wait_exit(Duration::from_secs(5)).await;
    let (second, took) = hand_over(&mut g, first, Duration::from_secs(5)).await;
    println!("handover among {N} with the named successor dead: {took:?}");
    assert_ne!(second, named);
    assert!(took < Duration::from_secs(3), "{took:?}");
    watch_no_overlap(&g.cs, Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_registry_hands_over_as_before() {
    let ids = ids(3);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut g = group_with("k-successor-none", &refs, &[], false).await;
    let first = one_leader(&g.cs, Duration::from_secs(20)).await;
    until_registered(&g, 3).await;
    for r in records(&g) {
        assert!(g.api.delete_lease(r["metadata"]["name"].as_str().unwrap()));
    }
    let (second, took) = hand_over(&mut g, first, Duration::from_secs(5)).await;
    println!("handover with an empty registry: {took:?}");
    assert_ne!(second, first);
    watch_no_overlap(&g.cs, Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_deleted_by_hand_is_republished() {
    let ids = ids(2);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let g = group_with("k-successor-republish", &refs, &[], false).await;
    let first = one_leader(&g.cs, Duration::from_secs(20)).await;
    until_registered(&g, 2).await;
    let follower = 1 - first;
    let id = g.cs[follower].identity.clone();
    let name = record_of(&g, &id).unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(g.api.delete_lease(&name));
    // Renewed every 4 lease durations (8 s here).
    wait_for(
        Duration::from_secs(15),
        "the record republished",
        || async { record_of(&g, &id).is_some() },
    )
    .await;
    let r = record_of(&g, &id).unwrap();
    assert_eq!(
        r["metadata"]["annotations"]["leader-elector.io/ready"],
        json!("true")
    );
    assert_eq!(
        r["metadata"]["annotations"]["leader-elector.io/priority"],
        json!("1")
    );
    assert_eq!(r["spec"]["leaseDurationSeconds"], json!(24));
    assert_eq!(leaders(&g.cs).await, vec![first], "the election went on");
}

/// `spec.strategy` and `spec.preferredHolder`, set by a third party
/// (Coordinated Leader Election), survive renewals, a release and the next
/// acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strategy_set_by_hand_survives_renewals_and_handovers() {
    let ids = ids(2);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut g = group_with("k-successor-strategy", &refs, &[], false).await;
    let first = one_leader(&g.cs, Duration::from_secs(20)).await;
    assert!(g.api.edit_lease(&g.election, |l| {
        l["spec"]["strategy"] = json!("OldestEmulationVersion");
        l["spec"]["preferredHolder"] = json!("someone");
    }));
    sleep(Duration::from_secs(1)).await;
    let kept = |g: &Group, when: &str| {
        let l = g.api.lease(&g.election).unwrap();
        assert_eq!(
            l["spec"]["strategy"],
            json!("OldestEmulationVersion"),
            "{when}: {l}"
        );
        assert_eq!(
            l["spec"]["preferredHolder"],
            json!("someone"),
            "{when}: {l}"
        );
    };
    kept(&g, "after renewals");
    assert!(holder(&g.api, &g.election).starts_with(&g.cs[first].identity));
    hand_over(&mut g, first, Duration::from_secs(5)).await;
    kept(&g, "after a handover");
}

/// `leader-elector status` lists the registry's candidates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_the_candidates() {
    let ids = ids(2);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let g = group_with("k-successor-status", &refs, &[], false).await;
    one_leader(&g.cs, Duration::from_secs(20)).await;
    until_registered(&g, 2).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args([
            "status",
            "--backend",
            "kubernetes",
            "--election",
            &g.election,
        ])
        .args(["--output", "json"])
        .env("KUBECONFIG", g.eps[0].kubeconfig())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_str(&stdout).expect("JSON");
    let listed = v["candidates"].as_array().expect("candidates");
    assert_eq!(listed.len(), 2, "{v}");
    for c in listed {
        assert!(ids.iter().any(|i| c["identity"] == json!(i)), "{c}");
        assert_eq!(c["priority"], json!(1));
        assert_eq!(c["ready"], json!(true));
        assert_eq!(c["revision"], json!(""));
        assert!(c["age_seconds"].as_u64().is_some(), "{c}");
    }
}
