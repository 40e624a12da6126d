//! The sidecar on a Redis Cluster (three primaries, three replicas,
//! `cluster-node-timeout` 1000 ms), given with `--redis-cluster` and every
//! node as a seed: three sidecars through a `CLUSTER FAILOVER` on the replica
//! of the election slot's primary, a SIGKILL of that primary and a SIGSTOP of
//! it past `cluster-node-timeout`. Safety (the recorder's checker): no two
//! leaders at once, fencing tokens that grow from term to term. Liveness twin
//! (same run): a leader again within one lease duration + the cluster's
//! failover time + 1 s (the promotion hold-off's second) + one retry period.
//! Each prints its figures (`--nocapture`).

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::{Instant, sleep};

use crate::support::cluster::{NODE_TIMEOUT_MS, RedisCluster};
use crate::support::failover::{self, FAILOVER_LIMIT, Fault3, RETRY, three_on};
use crate::support::*;

/// Run `fault` against the election slot's primary with three sidecars on
/// the cluster; check and print the recording ([`failover::judge`]).
async fn survive(fault: Fault3, test: &str, extra: &[&str]) {
    let mut cl = RedisCluster::start().await;
    let name = election(test);
    let slot = cl.slot(&format!("leader-elector:{{{name}}}")).await;
    let old = cl
        .primary_of(slot, 0)
        .await
        .expect("a primary for the slot");
    let replica = cl.replica_of(old).await;
    let (cs, rec, first) = three_on(&name, cl.flags(), extra, "cluster").await;
    // Let a renewal or two land on the replica.
    sleep(Duration::from_millis(700)).await;
    let (f, start) = failover::record(&rec, fault, "the slot's primary", first.0);
    match fault {
        Fault3::Manual => cl.failover(replica).await,
        Fault3::Kill => cl.nodes[old].stop(),
        Fault3::Stop => cl.signal(old, Signal::SIGSTOP),
    }
    let (new, failover) = cl.wait_failover(slot, old, FAILOVER_LIMIT).await;
    if let Fault3::Stop = fault {
        let stopped = Duration::from_millis(3 * NODE_TIMEOUT_MS);
        sleep(stopped.saturating_sub(start.elapsed())).await;
        cl.signal(old, Signal::SIGCONT);
    }
    rec.heal(f, false);
    let moved = format!("slot {slot} node {old} -> {new} in {failover:?} (cluster)");
    let seen = failover::Seen {
        platform: "cluster",
        fault,
        first,
        start,
        ready: failover,
        moved,
    };
    failover::judge(cs, &rec, seen).await;
    cl.nodes.clear();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_keeps_one_leader_and_growing_tokens() {
    survive(Fault3::Manual, "cluster-manual", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_slot_primary_is_followed_to_the_promoted_replica() {
    survive(Fault3::Kill, "cluster-kill", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_primary_paused_past_node_timeout_is_followed_to_the_promoted_replica() {
    survive(Fault3::Stop, "cluster-stop", &[]).await;
}

/// `--redis-min-replicas 1` on a cluster: `WAIT` goes to the election
/// slot's primary (not to every primary), on a connection of its own, across
/// a `CLUSTER FAILOVER` (the demoted primary becomes the new one's replica
/// and acknowledges). A SIGKILL would leave the promoted replica without a
/// replica of its own in a 3+3 cluster: no grant could count there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_works_on_a_cluster_across_a_failover() {
    survive(
        Fault3::Manual,
        "cluster-min-replicas",
        &["--redis-min-replicas", "1"],
    )
    .await;
}

/// A lock held by a client across a `CLUSTER FAILOVER` of its slot (the
/// coordination API on Cluster): safety, a second holder only after the
/// first's TTL; liveness twin, the second holder gets it then, with a larger
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_across_a_cluster_failover_has_no_second_holder_before_its_ttl() {
    use leader_elector::backend::redis::coord::RedisCoord;
    use leader_elector::backend::redis::{RedisBackend, RedisOptions};
    use leader_elector::coord::{Acquire, Coordinator, Try};

    let cl = RedisCluster::start().await;
    let options = RedisOptions {
        urls: cl.urls(),
        per_server_timeout: Duration::from_millis(500),
        cluster: true,
        ..RedisOptions::default()
    };
    let backend = RedisBackend::new("leader-elector:", &election("cluster-lock"), options)
        .expect("a Redis backend on the cluster");
    let c = RedisCoord::new(backend);
    let slot = cl.slot("leader-elector:{lock:L}").await;
    let old = cl
        .primary_of(slot, 0)
        .await
        .expect("a primary for the slot");
    let replica = cl.replica_of(old).await;
    let ttl = Duration::from_secs(3);
    let lock = Acquire::Lock("L");
    let asked = Instant::now();
    let first = match c.acquire(lock, "a", ttl).await {
        Ok(Try::Acquired(g)) => g,
        other => panic!("a's lock: {other:?}"),
    };
    sleep(Duration::from_millis(300)).await;
    cl.failover(replica).await;
    let second = loop {
        match tokio::time::timeout(Duration::from_secs(2), c.acquire(lock, "b", ttl)).await {
            Ok(Ok(Try::Acquired(g))) => break g,
            Ok(Ok(Try::Held(who))) => assert_eq!(who, "a"),
            Ok(other) => eprintln!("b's lock during the failover: {other:?}"),
            Err(_) => eprintln!("b's lock hung for 2 s during the failover"),
        }
        assert!(asked.elapsed() < FAILOVER_LIMIT, "b never got the lock");
        sleep(Duration::from_millis(50)).await;
    };
    let after = asked.elapsed();
    let (new, _) = cl.wait_failover(slot, old, FAILOVER_LIMIT).await;
    eprintln!(
        "cluster lock: slot {slot} node {old} -> {new}; a's token {}, b's {} after {after:?} (TTL {ttl:?})",
        first.fencing_token, second.fencing_token
    );
    assert!(
        after >= ttl,
        "b got the lock {after:?} after a asked, before a's TTL ({ttl:?}) ran out"
    );
    assert_token_grew(first.fencing_token, second.fencing_token, "b's lock");
}

/// Bad cluster flags exit 2 naming the flag.
#[test]
fn cluster_configuration_errors_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--election", "x", "--backend", "redis", "--redis-cluster"],
            "--redis-url is required",
        ),
        (
            &[
                "--election",
                "x",
                "--redis-cluster",
                "--redis-sentinel",
                "127.0.0.1:26379",
                "--redis-sentinel-master",
                "m",
            ],
            "--redis-cluster and --redis-sentinel are both given",
        ),
        (
            &[
                "--election",
                "x",
                "--redis-cluster",
                "--redis-url",
                "redis://127.0.0.1:2",
                "--redis-prefix",
                "app{x}:",
            ],
            "--redis-prefix",
        ),
    ];
    for (args, expected) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leader-elector"))
            .args(*args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// A lock granted on its slot's primary that the replica never got (its
/// link cut, the primary SIGKILLed at once), then the cluster's failover:
/// the promoted replica never heard of the grant. Safety: a second client
/// does not get the lock before the first grant's TTL has run out (the
/// coordination promotion hold-off, one marker per slot); liveness twin: it
/// gets it within the TTL + the cluster's failover time + 1 s + one retry
/// period, with a larger fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_with_a_killed_slot_primary_has_no_second_holder_before_its_ttl() {
    use crate::support::redis_server::cut_off_replicas;
    use leader_elector::backend::redis::coord::RedisCoord;
    use leader_elector::backend::redis::{RedisBackend, RedisOptions};
    use leader_elector::coord::{Acquire, Coordinator, Try};

    let cl = RedisCluster::start().await;
    let options = RedisOptions {
        urls: cl.urls(),
        per_server_timeout: Duration::from_millis(500),
        cluster: true,
        ..RedisOptions::default()
    };
    let backend = RedisBackend::new("leader-elector:", &election("cluster-lost"), options)
        .expect("a Redis backend on the cluster");
    let c = RedisCoord::new(backend);
    let ttl = Duration::from_secs(4);
    let lock = Acquire::Lock("L");
    // An earlier lock of the same TTL, replicated: the usual life before.
    let warm = c.acquire(lock, "w", ttl).await;
    assert!(matches!(warm, Ok(Try::Acquired(_))), "{warm:?}");
    sleep(Duration::from_millis(300)).await;
    let slot = cl.slot("leader-elector:{lock:L}").await;
    let old = cl
        .primary_of(slot, 0)
        .await
        .expect("a primary for the slot");
    let replica = cl.replica_of(old).await;
    let _: i64 = redis::cmd("DEL")
        .arg("leader-elector:{lock:L}")
        .query_async(&mut cl.nodes[old].conn().await)
        .await
        .unwrap();
    sleep(Duration::from_millis(300)).await;
    cut_off_replicas(&cl.nodes[old], &[&cl.nodes[replica]]).await;
    let granted = Instant::now();
    let first = match c.acquire(lock, "a", ttl).await {
        Ok(Try::Acquired(g)) => g,
        other => panic!("a's lock: {other:?}"),
    };
    cl.signal(old, Signal::SIGKILL);
    let killed = Instant::now();
    let (new, failover) = cl.wait_failover(slot, old, FAILOVER_LIMIT).await;
    let on_new: Option<String> = redis::cmd("GET")
        .arg("leader-elector:{lock:L}")
        .query_async(&mut cl.nodes[new].conn().await)
        .await
        .unwrap();
    assert_eq!(on_new, None, "the promoted replica got a's grant after all");
    let second = loop {
        match tokio::time::timeout(Duration::from_secs(2), c.acquire(lock, "b", ttl)).await {
            Ok(Ok(Try::Acquired(g))) => break g,
            Ok(other) => eprintln!("b's lock after the failover: {other:?}"),
            Err(_) => eprintln!("b's lock hung for 2 s after the failover"),
        }
        assert!(
            killed.elapsed() < FAILOVER_LIMIT * 2,
            "b never got the lock"
        );
        sleep(Duration::from_millis(50)).await;
    };
    let after = granted.elapsed();
    let bound = failover + ttl + Duration::from_secs(1) + RETRY * 2;
    eprintln!(
        "cluster lost lock: slot {slot} node {old} -> {new}, failover {failover:?}; a's token {}, b's {} {after:?} after a's grant (TTL {ttl:?}, bound {bound:?} after the kill: took {:?})",
        first.fencing_token,
        second.fencing_token,
        killed.elapsed()
    );
    assert!(
        after >= ttl,
        "b got the lock {after:?} after a's grant, before its TTL ({ttl:?}) ran out: two holders"
    );
    assert!(
        killed.elapsed() <= bound,
        "b got the lock {:?} after the kill, past TTL + failover + 1 s + retry ({bound:?})",
        killed.elapsed()
    );
    assert_token_grew(first.fencing_token, second.fencing_token, "b's lock");
}
