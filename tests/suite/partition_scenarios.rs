//! The partition scenarios, each on the backends it applies to. Two run in
//! every `cargo test` (the etcd leader cut from its member, and the leader
//! attached to an etcd member partitioned into the minority); the rest only
//! with `LEADER_ELECTOR_PARTITIONS=all`.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::partition::{BOUND, RAFT_BOUND, Store, TTL, World, all};
use crate::support::netns::Net;
use crate::support::recorder::{Expect, Fault};

/// Which way a one-way cut between the leader and its backend drops.
#[derive(Clone, Copy)]
enum Way {
    /// The leader's packets never arrive; the backend's do.
    LeaderToBackend,
    /// The backend's packets (answers) never arrive; the leader's do.
    BackendToLeader,
}

/// Cut the leader's node from every backend node (`way`, or both when
/// `None`); the others must take over during the cut; then heal.
async fn cut_leader(store: Store, name: &str, way: Option<Way>) {
    let w = World::start(store, name).await;
    let (fault, slot) = w
        .fault_on_leader("leader cut from the backend", Expect::CutOff, BOUND)
        .await;
    let leader = w.side[slot];
    for &b in &w.back {
        match way {
            None => w.net.cut_both(leader, b),
            Some(Way::LeaderToBackend) => w.net.cut(leader, b),
            Some(Way::BackendToLeader) => w.net.cut(b, leader),
        }
    }
    w.rec.in_effect(fault);
    hold_for_new_leader(&w, slot).await;
    w.heal("cut", Some(fault));
    w.judge(name, TTL * 2).await;
}

/// Wait for a term of another slot than `slot` (at most [`BOUND`]), then
/// one TTL more with the fault in place.
pub async fn hold_for_new_leader(w: &World, slot: usize) {
    let end = Instant::now() + BOUND;
    while Instant::now() < end {
        if w.rec
            .wait_leader(Duration::from_millis(100))
            .await
            .is_some_and(|(s, _)| s != slot)
        {
            break;
        }
    }
    sleep(TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_cut_from_its_member() {
    cut_leader(Store::Etcd, "p-cut-etcd", None).await;
}

/// The leader's sidecar talks to member `slot` only; that member is cut
/// from the two others (the sidecar still reaches it).
async fn minority(store: Store, name: &str) {
    let w = World::start(store, name).await;
    let (fault, slot) = w
        .fault_on_leader(
            "leader's member in the minority",
            Expect::CutOff,
            RAFT_BOUND,
        )
        .await;
    let minority = w.back[slot];
    let majority: Vec<usize> = w.back.iter().copied().filter(|&b| b != minority).collect();
    w.net.split(&[minority], &majority);
    w.rec.in_effect(fault);
    hold_for_new_leader(&w, slot).await;
    w.heal("minority", Some(fault));
    w.judge(name, TTL * 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_on_a_minority_member() {
    minority(Store::Etcd3, "p-minority").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_on_a_minority_member_pre_vote() {
    if all() {
        minority(Store::Etcd3PreVote, "p-minority-prevote").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_leader_cut_from_its_server() {
    if all() {
        cut_leader(Store::Redis, "p-cut-redis", None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_one_way_leader_to_member() {
    if all() {
        cut_leader(Store::Etcd, "p-ow1-etcd", Some(Way::LeaderToBackend)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_one_way_member_to_leader() {
    if all() {
        cut_leader(Store::Etcd, "p-ow2-etcd", Some(Way::BackendToLeader)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_one_way_leader_to_server() {
    if all() {
        cut_leader(Store::Redis, "p-ow1-redis", Some(Way::LeaderToBackend)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_one_way_server_to_leader() {
    if all() {
        cut_leader(Store::Redis, "p-ow2-redis", Some(Way::BackendToLeader)).await;
    }
}

/// For `period`, cut whoever leads from the backend for 1 s, heal for 1 s.
async fn flapping(store: Store, name: &str, period: Duration) {
    let w = World::start(store, name).await;
    let fault = w
        .rec
        .fault(Fault::new("flapping cut", None, Expect::Other, BOUND));
    let end = Instant::now() + period;
    let mut target = w.leader(Duration::from_secs(5)).await.0;
    while Instant::now() < end {
        if let Some((slot, _)) = w.rec.wait_leader(Duration::from_millis(100)).await {
            target = slot;
        }
        w.net.split(&[w.side[target]], &w.back);
        sleep(Duration::from_secs(1)).await;
        w.heal("flap", None);
        sleep(Duration::from_secs(1)).await;
    }
    w.rec.heal(fault, true);
    w.judge(name, TTL * 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_flapping_cut() {
    if all() {
        flapping(Store::Etcd, "p-flap-etcd", Duration::from_secs(60)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_flapping_cut() {
    if all() {
        flapping(Store::Redis, "p-flap-redis", Duration::from_secs(60)).await;
    }
}

/// `impair` every link for 30 s, then heal.
async fn impaired(store: Store, name: &str, impair: fn(&Net)) {
    let w = World::start(store, name).await;
    let fault = w
        .rec
        .fault(Fault::new("impaired links", None, Expect::Other, BOUND));
    impair(&w.net);
    sleep(Duration::from_secs(30)).await;
    w.heal("impaired", Some(fault));
    w.judge(name, TTL * 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_five_percent_loss() {
    if all() {
        impaired(Store::Etcd, "p-loss-etcd", |n| n.loss(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_five_percent_loss() {
    if all() {
        impaired(Store::Redis, "p-loss-redis", |n| n.loss(5)).await;
    }
}

/// 200 ms ± 100 ms (which reorders) and 5 % loss on every link. Ignored:
/// it needs `tc netem`, and the kernel of our test machines has no
/// sch_netem (run it with `--ignored` where `tc qdisc add … netem` works).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kernel with sch_netem (tc netem)"]
async fn etcd_netem_delay_and_loss() {
    impaired(Store::Etcd, "p-netem-etcd", |n| n.netem(200, 100, 5)).await;
}
