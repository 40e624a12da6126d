//! A crashed preferred member costs one failover (issue 46), on every
//! backend with a candidate registry: three members of revision `a` (or
//! priority 1) and a fourth of revision `b` (or `--priority 2`) that takes
//! over as the precedence table says (the liveness twin: within the
//! table's bound), then SIGKILL of it while it leads. Its registry record
//! stays `ready` for twelve lease durations; the survivors must not hand
//! the term back to it. Safety: 0 overlaps (the recorder's checker).
//! Liveness: the longest time nobody leads is one crash failover (at most
//! the lease and 1.5 s), at most one handover names the dead member, and
//! neither `status` nor a survivor's `/leader` names it as leading after
//! lease + 1 s.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::{Instant, sleep};

use crate::support::Sidecar;
use crate::support::fleet::{FLEET_LEASE, Fleet, measure, until_answering};
use crate::support::recorder::Recorder;

/// What makes the fourth member preferred.
#[derive(Clone, Copy, Debug)]
enum Preferred {
    /// A newer revision: handed the term at once.
    Revision,
    /// A higher priority: preempts after `--preempt-after` (1 s).
    Priority,
}

impl Preferred {
    fn flags(self, preferred: bool) -> Vec<&'static str> {
        match (self, preferred) {
            (Preferred::Revision, false) => vec!["--revision", "a"],
            (Preferred::Revision, true) => vec!["--revision", "b"],
            (Preferred::Priority, p) => {
                vec![
                    "--priority",
                    if p { "2" } else { "1" },
                    "--preempt-after",
                    "1s",
                ]
            }
        }
    }

    /// How long the preferred member may take to lead once it answers:
    /// a relist (a lease duration) and the handover; preemption adds its
    /// wait.
    fn bound(self) -> Duration {
        let base = FLEET_LEASE + Duration::from_secs(2);
        match self {
            Preferred::Revision => base,
            Preferred::Priority => base + Duration::from_secs(1),
        }
    }
}

/// Handovers that named `dead` in `logs` after the byte offsets `from`.
fn handovers_to(logs: &[&Sidecar], from: &[usize], dead: &str) -> usize {
    let named = format!("successor={dead}");
    logs.iter()
        .zip(from)
        .map(|(s, at)| {
            s.log()[*at..]
                .lines()
                .filter(|l| l.contains("releasing the term to the named successor"))
                .filter(|l| l.contains(&named))
                .count()
        })
        .sum()
}

/// `status -o json`'s leader, where the fleet's backend has server flags.
fn status_leader(fleet: &Fleet) -> Option<Option<String>> {
    if fleet.backend.name() == "kubernetes" {
        return None;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args(["status", "--election", &fleet.election, "-o", "json"])
        .args(fleet.backend.server_flags())
        .env_remove("LEADER_ELECTOR_ELECTION")
        .output()
        .expect("run leader-elector status");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v["leader"].as_str().map(str::to_owned))
}

async fn a_crashed_preferred_leader_costs_one_failover(mut fleet: Fleet, how: Preferred) {
    let rec = Recorder::new(FLEET_LEASE);
    let mut old = Vec::new();
    for i in 0..3 {
        let s = fleet.start(&format!("a{i}"), &how.flags(false)).await;
        rec.add(&s.identity, s.port);
        old.push(s);
    }
    rec.wait_leader(Duration::from_secs(30))
        .await
        .expect("a first leader");
    let mut b = fleet.start("b", &how.flags(true)).await;
    let slot = rec.add(&b.identity, b.port);
    until_answering(&b, Duration::from_secs(30)).await;
    let joined = Instant::now();
    let end = joined + how.bound();
    while rec.leader_now(joined).map(|l| l.0) != Some(slot) {
        assert!(
            Instant::now() < end,
            "{how:?}: b did not lead within {:?}",
            how.bound()
        );
        sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{}/{how:?}: b leads {:?} after its first answer",
        fleet.backend.name(),
        joined.elapsed()
    );
    let survivors: Vec<&Sidecar> = old.iter().collect();
    let from: Vec<usize> = survivors.iter().map(|s| s.log().len()).collect();
    b.signal(Signal::SIGKILL);
    b.wait_exit(Duration::from_secs(5)).await;
    rec.stop_polling(slot);
    let killed = Instant::now();
    // Watch who the survivors and `status` say leads for six leases.
    let mut named_dead = Vec::new();
    while killed.elapsed() < 6 * FLEET_LEASE {
        if killed.elapsed() > FLEET_LEASE + Duration::from_secs(1) {
            for s in &survivors {
                if let Some((_, body)) = s.leader().await
                    && body["leader"] == b.identity.as_str()
                {
                    named_dead.push(format!(
                        "{}'s /leader at {:?}",
                        s.identity,
                        killed.elapsed()
                    ));
                }
            }
            if let Some(Some(l)) = status_leader(&fleet)
                && l == b.identity
            {
                named_dead.push(format!("status at {:?}", killed.elapsed()));
            }
        }
        sleep(Duration::from_millis(300)).await;
    }
    let rolled = measure(&rec, "a crashed preferred leader");
    let toward = handovers_to(&survivors, &from, &b.identity);
    println!(
        "{}/{how:?}: after SIGKILL of the preferred leader: longest leaderless {:?}, handovers toward it {toward}, leader changes {}, named as leading after lease + 1 s: {}",
        fleet.backend.name(),
        rolled.longest_gap,
        rolled.changes,
        named_dead.len()
    );
    assert!(rolled.problems.is_empty(), "{:?}", rolled.problems);
    let one_failover = FLEET_LEASE + Duration::from_millis(1500);
    assert!(rolled.longest_gap <= one_failover, "{rolled:?}");
    assert!(toward <= 1, "{toward} handovers toward the dead member");
    assert!(
        named_dead.is_empty(),
        "the dead member shown leading: {named_dead:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_crashed_newer_revision_costs_one_failover() {
    let fleet = Fleet::etcd("alive-e-rev").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_crashed_higher_priority_costs_one_failover() {
    let fleet = Fleet::etcd("alive-e-pri").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Priority).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_crashed_newer_revision_costs_one_failover() {
    let fleet = Fleet::redis("alive-r-rev").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_crashed_higher_priority_costs_one_failover() {
    let fleet = Fleet::redis("alive-r-pri").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Priority).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_crashed_newer_revision_costs_one_failover() {
    let fleet = Fleet::redlock("alive-rl-rev").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_crashed_higher_priority_costs_one_failover() {
    let fleet = Fleet::redlock("alive-rl-pri").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Priority).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_a_crashed_newer_revision_costs_one_failover() {
    let fleet = Fleet::kubernetes("alive-k-rev").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_a_crashed_higher_priority_costs_one_failover() {
    let fleet = Fleet::kubernetes("alive-k-pri").await;
    a_crashed_preferred_leader_costs_one_failover(fleet, Preferred::Priority).await;
}

/// `status -o json`'s candidate identities.
fn status_candidates(fleet: &Fleet) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args(["status", "--election", &fleet.election, "-o", "json"])
        .args(fleet.backend.server_flags())
        .env_remove("LEADER_ELECTOR_ELECTION")
        .output()
        .expect("run leader-elector status");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["candidates"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["identity"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The crashed preferred member restarted with the same identity takes the
/// term back (the survivors hand it over to the newer revision); its new
/// record stays listed while it leads, past the record's TTL (12 lease
/// durations: etcd deletes a record whose lease nobody keeps alive, and a
/// leader that did not renew its record lost it then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_restarted_preferred_member_leads_with_its_record_listed() {
    let mut fleet = Fleet::etcd("alive-e-restart").await;
    let how = Preferred::Revision;
    let rec = Recorder::new(FLEET_LEASE);
    let mut old = Vec::new();
    for i in 0..3 {
        let s = fleet.start(&format!("a{i}"), &how.flags(false)).await;
        rec.add(&s.identity, s.port);
        old.push(s);
    }
    rec.wait_leader(Duration::from_secs(30))
        .await
        .expect("a first leader");
    let mut b = fleet.start("b", &how.flags(true)).await;
    let slot = rec.add(&b.identity, b.port);
    until_answering(&b, Duration::from_secs(30)).await;
    let joined = Instant::now();
    while rec.leader_now(joined).map(|l| l.0) != Some(slot) {
        assert!(Instant::now() < joined + how.bound(), "b did not lead");
        sleep(Duration::from_millis(50)).await;
    }
    b.signal(Signal::SIGKILL);
    b.wait_exit(Duration::from_secs(5)).await;
    rec.stop_polling(slot);
    let killed = Instant::now();
    while rec.leader_now(killed).is_none_or(|l| l.0 == slot) {
        assert!(killed.elapsed() < 6 * FLEET_LEASE, "no survivor leads");
        sleep(Duration::from_millis(50)).await;
    }
    let b2 = fleet.start("b", &how.flags(true)).await;
    let identity = b2.identity.clone();
    assert_eq!(identity, b.identity, "the restart keeps the identity");
    let slot = rec.add(&b2.identity, b2.port);
    until_answering(&b2, Duration::from_secs(30)).await;
    let joined = Instant::now();
    while rec.leader_now(joined).map(|l| l.0) != Some(slot) {
        assert!(
            joined.elapsed() < 6 * FLEET_LEASE,
            "the restarted b did not take the term back"
        );
        sleep(Duration::from_millis(50)).await;
    }
    let led = Instant::now();
    while led.elapsed() < 14 * FLEET_LEASE {
        let listed = status_candidates(&fleet);
        assert!(
            listed.contains(&identity),
            "the leading restarted {identity} is not listed {:?} after it took the term back: {listed:?}\n{}",
            led.elapsed(),
            b2.log()
        );
        sleep(Duration::from_millis(300)).await;
    }
    drop(old);
}
