//! `--migrate-from-endpoints` on the Kubernetes stand-in: a rolling update
//! from the archived `leader-elector` image (tests/support/old_elector.rs,
//! client-go's `EndpointsLock` loop) to the sidecar never shows two
//! leaders and ends with one of ours leading; losing the Endpoints lock
//! (deleted or edited by hand) is losing; without the flag nothing touches
//! Endpoints. Every `/leader` (the old image's too) is recorded by the
//! overlap checker (tests/support/recorder.rs).
//!
//! Durations are printed; the only limits are liveness bounds stated with
//! their reason.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::support::kube_api::{Endpoint, KubeApi};
use crate::support::old_elector::{OldElector, OldTiming};
use crate::support::recorder::Recorder;
use crate::support::*;
use tokio::time::{Instant, sleep};

const NS: &str = "team-a";
const ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// The old image with the sidecar's test timing (`FAST`: lease 2 s, renew
/// 500 ms): lease 2 s, renew deadline 1 s, retry 500 ms.
const OLD: OldTiming = OldTiming {
    lease: Duration::from_secs(2),
    renew_deadline: Duration::from_secs(1),
    retry: Duration::from_millis(500),
};

/// How long a leader may take to appear after the last holder died: its
/// record's duration of silence (2 s) counted from the last change a
/// candidate saw (up to one renew or retry period, 500 ms, before the
/// death), one poll (500 ms) to notice, and the Lease's own wait when its
/// holder died with it (2 s), plus 2 s of slack for a loaded machine.
const RECOVERY: Duration = Duration::from_secs(7);

/// One of ours on its own stand-in endpoint (whose requests it logs).
async fn ours(api: &KubeApi, election: &str, id: &str, bridge: bool) -> (Arc<Endpoint>, Sidecar) {
    let ep = api.endpoint(id).await;
    let mut args: Vec<String> = vec!["--backend".into(), "kubernetes".into()];
    args.extend(FAST.iter().map(|s| s.to_string()));
    if bridge {
        args.push("--migrate-from-endpoints".into());
    }
    let kubeconfig = ep.kubeconfig().to_string_lossy().into_owned();
    let env = [("KUBECONFIG", kubeconfig.as_str()), ("POD_NAMESPACE", NS)];
    let s = Sidecar::start_env(election, id, &args, &env);
    (ep, s)
}

/// The verbs `eps` sent on Endpoints.
fn endpoints_verbs(eps: &[Arc<Endpoint>]) -> BTreeSet<&'static str> {
    eps.iter()
        .flat_map(|ep| ep.log())
        .filter(|l| l.resource == "endpoints")
        .map(|l| l.verb)
        .collect()
}

fn endpoints_holder(api: &KubeApi, election: &str) -> String {
    api.object("endpoints", election)
        .and_then(|e| {
            e["metadata"]["annotations"][ANNOTATION]
                .as_str()
                .map(str::to_owned)
        })
        .and_then(|raw| serde_json::from_str::<serde_json::Value>(&raw).ok())
        .and_then(|r| r["holderIdentity"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn lease_holder(api: &KubeApi, election: &str) -> String {
    api.lease(election)
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The slot that leads now, waiting up to `limit`.
async fn led_within(rec: &Recorder, limit: Duration, what: &str) -> usize {
    let start = Instant::now();
    let (slot, _) = rec
        .wait_leader(limit)
        .await
        .unwrap_or_else(|| panic!("no leader within {limit:?} {what}"));
    println!("bridge: a leader {what} after {:?}", start.elapsed());
    slot
}

/// Three old-image candidates replaced by three of ours, one at a time
/// (start one of ours, then stop an old one, the leading one first), as a
/// Deployment's rolling update with maxSurge 1 does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_from_the_old_image_never_elects_two() {
    let api = KubeApi::start(NS);
    let election = election("bridge-roll");
    let rec = Recorder::new(OLD.lease);
    let mut old = Vec::new();
    let mut old_slots = Vec::new();
    for i in 0..3 {
        let o = OldElector::start(&api, &election, &format!("old-{i}"), OLD).await;
        old_slots.push(rec.add(&o.identity, o.port));
        old.push(Some(o));
    }
    let first = led_within(&rec, RECOVERY, "among the old image").await;
    assert!(old_slots.contains(&first));
    let mut new = Vec::new();
    for i in 0..3 {
        let (ep, s) = ours(&api, &election, &format!("new-{i}"), true).await;
        rec.add(&s.identity, s.port);
        new.push((ep, s));
        sleep(Duration::from_secs(2)).await;
        // Stop the old candidate that leads, else any old one left.
        let leading = rec.leader_now(Instant::now() - Duration::from_millis(200));
        let k = (0..3)
            .find(|k| old[*k].is_some() && leading.is_some_and(|(slot, _)| slot == old_slots[*k]))
            .or_else(|| (0..3).find(|k| old[*k].is_some()))
            .unwrap();
        old[k].take().unwrap().kill();
        rec.stop_polling(old_slots[k]);
        println!(
            "bridge: stopped old-{k} (it led: {})",
            leading.is_some_and(|(s, _)| s == old_slots[k])
        );
        led_within(&rec, RECOVERY, &format!("after old-{k} stopped")).await;
    }
    let last = led_within(&rec, RECOVERY, "at the end").await;
    assert!(!old_slots.contains(&last), "one of ours leads at the end");
    let leader = rec.snapshot()[last].0.clone();
    assert_eq!(
        endpoints_holder(&api, &election),
        leader,
        "the old lock names it"
    );
    assert!(lease_holder(&api, &election).starts_with(&format!("{leader}_")));
    let report = rec.check("rolling update from the old image");
    println!(
        "bridge: {} terms, {} samples, longest gap {:?}",
        report.terms, report.samples, report.longest_gap
    );
    assert!(report.overlaps.is_empty(), "{:#?}", report.problems);
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert!(report.terms >= 2, "leadership moved to ours");
    let eps: Vec<Arc<Endpoint>> = new.iter().map(|(ep, _)| ep.clone()).collect();
    let verbs = endpoints_verbs(&eps);
    let allowed = BTreeSet::from(["get", "create", "update"]);
    assert!(verbs.is_subset(&allowed), "the chart's RBAC: {verbs:?}");
}

/// The Endpoints lock edited by hand to another holder, then deleted: the
/// leader steps down each time (losing either lock is losing), a leader of
/// ours comes back once the hand-made holder's record has been silent for
/// its duration, and two never lead at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_endpoints_lock_is_losing() {
    let api = KubeApi::start(NS);
    let election = election("bridge-lose");
    let rec = Recorder::new(OLD.lease);
    let mut cs = Vec::new();
    for id in ["a", "b"] {
        let (ep, s) = ours(&api, &election, id, true).await;
        rec.add(&s.identity, s.port);
        cs.push((ep, s));
    }
    let first = led_within(&rec, RECOVERY, "at start").await;
    let edited = api.edit("endpoints", &election, |e| {
        let r = serde_json::json!({"holderIdentity": "by-hand", "leaseDurationSeconds": 2,
            "acquireTime": null, "renewTime": null, "leaderTransitions": 7});
        e["metadata"]["annotations"][ANNOTATION] = serde_json::json!(r.to_string());
    });
    assert!(edited);
    let edit = Instant::now();
    wait_for(
        Duration::from_secs(3),
        "the leader to step down after the edit",
        || async {
            rec.last(first)
                .is_some_and(|s| s.send > edit && !s.is_true())
        },
    )
    .await;
    println!("bridge: step-down after the edit took {:?}", edit.elapsed());
    let second = led_within(&rec, RECOVERY, "after the edit").await;
    let deleted = Instant::now();
    assert!(api.delete("endpoints", &election));
    wait_for(
        Duration::from_secs(3),
        "the leader to step down after the delete",
        || async {
            rec.last(second)
                .is_some_and(|s| s.send > deleted && !s.is_true())
        },
    )
    .await;
    println!(
        "bridge: step-down after the delete took {:?}",
        deleted.elapsed()
    );
    led_within(&rec, RECOVERY, "after the delete").await;
    let report = rec.check("the Endpoints lock edited and deleted by hand");
    assert!(report.overlaps.is_empty(), "{:#?}", report.problems);
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    let eps: Vec<Arc<Endpoint>> = cs.iter().map(|(ep, _)| ep.clone()).collect();
    let verbs = endpoints_verbs(&eps);
    assert_eq!(
        verbs,
        BTreeSet::from(["get", "create", "update"]),
        "the chart's RBAC"
    );
}

/// Without the flag no request touches Endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_nothing_touches_endpoints() {
    let api = KubeApi::start(NS);
    let election = election("bridge-off");
    let (mut eps, mut cs) = (Vec::new(), Vec::new());
    for id in ["a", "b"] {
        let (ep, s) = ours(&api, &election, id, false).await;
        eps.push(ep);
        cs.push(s);
    }
    let first = one_leader(&cs, Duration::from_secs(20)).await;
    // A handover too: the release path touches nothing else either.
    cs[first].signal(nix::sys::signal::Signal::SIGTERM);
    one_leader(&cs[1 - first..2 - first], Duration::from_secs(10)).await;
    assert!(endpoints_verbs(&eps).is_empty(), "requests on endpoints");
    assert!(api.objects("endpoints").is_empty());
}

/// At rest under a bridged leader, followers only read: the lock once per
/// renew interval (their poll, which also counts as hearing the leader when
/// it finds a new record), never a write, never the Lease. Counts printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_of_a_bridged_leader_only_read_the_lock_at_rest() {
    let api = KubeApi::start(NS);
    let election = election("bridge-rest");
    let (mut eps, mut cs) = (Vec::new(), Vec::new());
    for id in ["a", "b", "c"] {
        let (ep, s) = ours(&api, &election, id, true).await;
        eps.push(ep);
        cs.push(s);
    }
    let first = one_leader(&cs, Duration::from_secs(20)).await;
    sleep(Duration::from_secs(1)).await;
    let before: Vec<_> = eps.iter().map(|ep| ep.counts()).collect();
    let span = Duration::from_secs(5);
    sleep(span).await;
    for (i, ep) in eps.iter().enumerate() {
        let after = ep.counts();
        let delta: Vec<(String, u64)> = after
            .iter()
            .map(|(k, n)| (k.clone(), n - before[i].get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let role = if i == first { "leader" } else { "follower" };
        println!("bridge at rest, {role} {i}, requests in {span:?}: {delta:?}");
        if i != first {
            for (key, n) in &delta {
                assert!(
                    key.starts_with("GET") || key.starts_with("WATCH"),
                    "follower {i} sent {n} × {key} at rest"
                );
            }
        }
    }
    assert_eq!(
        one_leader(&cs, Duration::from_secs(1)).await,
        first,
        "no transition at rest"
    );
}

/// The lock's own rules through the backend itself: a renewal within the
/// same second as the last writes the same record (old-image followers see
/// no change), so it reports only the TTL left since the last change, never
/// more (safety), and never less than a second below it (liveness twin); a
/// process restarted under the holder's name waits for the record to be
/// silent for its duration before taking it (safety), then takes it
/// (liveness twin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_counts_only_changing_renewals_and_strangers_wait() {
    use leader_elector::backend::kubernetes::endpoints_lock::EndpointsLock;
    use leader_elector::backend::{Campaign, LeaseBackend, Renewal};
    let api = KubeApi::start(NS);
    let election = election("bridge-lock");
    let client = crate::kubernetes::client_on(&api, "first").await;
    let lock = EndpointsLock::with_client(client, NS, &election);
    let ttl = Duration::from_secs(2);
    let Campaign::Elected(term) = lock.campaign("pod-a", ttl, None).await.unwrap() else {
        panic!("a free lock is taken");
    };
    let end = Instant::now() + Duration::from_millis(1200);
    let mut shortest = ttl;
    while Instant::now() < end {
        let Renewal::Renewed { ttl: left, .. } = lock.renew(&term).await.unwrap() else {
            panic!("our term");
        };
        assert!(
            left <= ttl,
            "a renewal never reports more than the TTL: {left:?}"
        );
        shortest = shortest.min(left);
    }
    println!("bridge: shortest TTL reported by a same-second renewal: {shortest:?}");
    assert!(
        shortest < ttl,
        "a same-second renewal reports less than the TTL"
    );
    assert!(shortest > ttl - Duration::from_millis(1100), "{shortest:?}");
    // The holder's process is gone; the same name starts again.
    drop(lock);
    let client = crate::kubernetes::client_on(&api, "second").await;
    let again = EndpointsLock::with_client(client, NS, &election);
    let start = Instant::now();
    loop {
        match again.campaign("pod-a", ttl, None).await.unwrap() {
            Campaign::Elected(_) => break,
            Campaign::Following(h) => assert_eq!(h.identity, "pod-a"),
            other => panic!("{other:?}"),
        }
        sleep(Duration::from_millis(100)).await;
    }
    let waited = start.elapsed();
    println!("bridge: a same-name restart took the lock after {waited:?}");
    assert!(waited >= ttl, "it waited for a whole duration of silence");
}

/// The recipe's second rollout: bridged sidecars replaced by Lease-only
/// ones (start one without the flag, SIGTERM a bridged one, the leader
/// first, twice). A bridged leader holds the Lease too, so Lease-only
/// sidecars follow it; never two leaders, and a Lease-only sidecar leads at
/// the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_rollout_turns_the_bridge_off_without_two_leaders() {
    let api = KubeApi::start(NS);
    let election = election("bridge-off-roll");
    let rec = Recorder::new(OLD.lease);
    let (mut bridged, mut slots) = (Vec::new(), Vec::new());
    for id in ["on-0", "on-1"] {
        let (_, s) = ours(&api, &election, id, true).await;
        slots.push(rec.add(&s.identity, s.port));
        bridged.push(Some(s));
    }
    led_within(&rec, RECOVERY, "among the bridged").await;
    let mut plain = Vec::new();
    for i in 0..2 {
        let (_, s) = ours(&api, &election, &format!("off-{i}"), false).await;
        rec.add(&s.identity, s.port);
        plain.push(s);
        sleep(Duration::from_secs(1)).await;
        let leading = rec.leader_now(Instant::now() - Duration::from_millis(200));
        let k = (0..2)
            .find(|k| bridged[*k].is_some() && leading.is_some_and(|(s, _)| s == slots[*k]))
            .or_else(|| (0..2).find(|k| bridged[*k].is_some()))
            .unwrap();
        let mut s = bridged[k].take().unwrap();
        s.signal(nix::sys::signal::Signal::SIGTERM);
        s.wait_exit(Duration::from_secs(5)).await;
        rec.stop_polling(slots[k]);
        led_within(&rec, RECOVERY, &format!("after on-{k} stopped")).await;
    }
    let last = led_within(&rec, RECOVERY, "at the end").await;
    assert!(
        !slots.contains(&last),
        "a Lease-only sidecar leads at the end"
    );
    let report = rec.check("the rollout that turns the bridge off");
    assert!(report.overlaps.is_empty(), "{:#?}", report.problems);
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
}
