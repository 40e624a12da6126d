//! Candidate priority, preemption and rolling updates, as sidecars: each
//! scenario takes a fleet (`support::fleet`) so it runs on every backend
//! with a candidate registry, under the overlap checker (0 overlaps).
//! Safety and liveness come in pairs: the priority-0 member never leads
//! (safety) beside the priority-10 member that leads again after a restart
//! (liveness); the rolling update changes the leader once, and leads
//! throughout but for milliseconds.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;
use tokio::time::{Instant, sleep};

use crate::support::fleet::{FLEET_LEASE, Fleet, rolling_update, until_answering};
use crate::support::recorder::Recorder;

/// `--preempt-after` in these tests.
const PREEMPT_AFTER: Duration = Duration::from_secs(2);

fn priority(p: &'static str) -> [&'static str; 4] {
    ["--priority", p, "--preempt-after", "2s"]
}

/// Wait until the sidecar `s` of those polled by `rec` (its slot) leads.
async fn until_leads(rec: &Recorder, slot: usize, limit: Duration, what: &str) {
    let end = Instant::now() + limit;
    loop {
        if let Some((l, _)) = rec.wait_leader(Duration::from_millis(500)).await
            && l == slot
        {
            return;
        }
        assert!(Instant::now() < end, "timed out after {limit:?}: {what}");
    }
}

/// Priorities 10, 5 and 0: the 10 leads (preempting whoever won first);
/// restarted, it leads again within `--preempt-after` plus one handover
/// (liveness); with 10 and 5 killed, the 0 never leads and says why.
async fn priorities_lead_in_order(mut fleet: Fleet) {
    let rec = Recorder::new(FLEET_LEASE);
    let mut high = fleet.start("p10", &priority("10")).await;
    let mid = fleet.start("p5", &priority("5")).await;
    let zero = fleet.start("p0", &priority("0")).await;
    let mut slots = [&high, &mid, &zero].map(|s| rec.add(&s.identity, s.port));
    until_leads(&rec, slots[0], Duration::from_secs(30), "p10 leads").await;

    high.signal(Signal::SIGTERM);
    high.wait_exit(Duration::from_secs(10)).await;
    rec.stop_polling(slots[0]);
    until_leads(&rec, slots[1], Duration::from_secs(10), "p5 takes over").await;
    let restarted = Instant::now();
    let mut high = fleet.start("p10", &priority("10")).await;
    slots[0] = rec.add(&high.identity, high.port);
    until_answering(&high, Duration::from_secs(30)).await;
    until_leads(&rec, slots[0], Duration::from_secs(20), "p10 leads again").await;
    let took = restarted.elapsed();
    println!("priority 10 restarted: leads again after {took:?} (preempt-after {PREEMPT_AFTER:?})");
    // Its registry record is seen within one relist (a lease duration),
    // then the wait, then one handover.
    let bound = PREEMPT_AFTER + 2 * FLEET_LEASE + Duration::from_secs(3);
    assert!(took < bound, "{took:?} ≥ {bound:?}");

    let mut mid = mid;
    for s in [&mut high, &mut mid] {
        s.signal(Signal::SIGKILL);
        s.wait_exit(Duration::from_secs(5)).await;
    }
    rec.stop_polling(slots[0]);
    rec.stop_polling(slots[1]);
    // Past the killed term's TTL, twice over: nobody leads.
    sleep(3 * FLEET_LEASE).await;
    let (status, body) = zero.leader().await.expect("p0 answers");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["is_leader"], json!(false), "{body}");
    let why = body["waiting"]["what"].as_str().unwrap_or_default();
    assert!(why.contains("priority 0"), "{body}");
    let report = rec.check("priorities 10, 5, 0");
    println!("{}", report.summary());
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let runs_of_zero = crate::support::recorder::runs(slots[2], "p0", &rec.snapshot()[slots[2]].1);
    assert!(runs_of_zero.is_empty(), "priority 0 led: {runs_of_zero:?}");
}

/// A rolling update of 3 replicas with revisions changes the leader once,
/// to a new replica, leaderless for milliseconds; without revisions it may
/// change more often (printed beside it).
async fn a_rolling_update_changes_the_leader_once(on: Fleet, off: Fleet) {
    let settle = FLEET_LEASE + Duration::from_millis(500);
    let mut on = on;
    let with = rolling_update(&mut on, 3, true, settle).await;
    let mut off = off;
    let without = rolling_update(&mut off, 3, false, settle).await;
    println!("rolling update of 3, revisions on:  {with:?}");
    println!("rolling update of 3, revisions off: {without:?}");
    assert!(with.problems.is_empty(), "{:?}", with.problems);
    assert!(without.problems.is_empty(), "{:?}", without.problems);
    assert_eq!(with.changes, 1, "{with:?}");
    assert!(with.longest_gap < Duration::from_secs(1), "{with:?}");
    assert!(without.changes <= 3, "{without:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_priorities_lead_in_order() {
    priorities_lead_in_order(Fleet::kubernetes("k-prio").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_a_rolling_update_changes_the_leader_once() {
    let on = Fleet::kubernetes("k-roll-on").await;
    let off = Fleet::kubernetes("k-roll-off").await;
    a_rolling_update_changes_the_leader_once(on, off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_priorities_lead_in_order() {
    priorities_lead_in_order(Fleet::etcd("e-prio").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_rolling_update_changes_the_leader_once() {
    let on = Fleet::etcd("e-roll-on").await;
    let off = Fleet::etcd("e-roll-off").await;
    a_rolling_update_changes_the_leader_once(on, off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_priorities_lead_in_order() {
    priorities_lead_in_order(Fleet::redis("r-prio").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_rolling_update_changes_the_leader_once() {
    let on = Fleet::redis("r-roll-on").await;
    let off = Fleet::redis("r-roll-off").await;
    a_rolling_update_changes_the_leader_once(on, off).await;
}
