//! Faults only etcd has: a 3-member cluster losing its Raft leader or its
//! quorum, and a compaction of the history during a term.

use super::*;

// ------------------------------------------------------------ etcd scenarios

pub(super) async fn cluster_group(test: &str) -> (Servers, Group) {
    let servers = Servers::EtcdCluster(
        within(
            Duration::from_secs(40),
            "a 3-member etcd cluster to start",
            EtcdCluster::start(3),
        )
        .await,
    );
    let g = Group::start(&servers, test, ABC).await;
    (servers, g)
}

pub(super) fn cluster(s: &mut Servers) -> &mut EtcdCluster {
    match s {
        Servers::EtcdCluster(c) => c,
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_raft_leader_killed() {
    let (mut servers, g) = cluster_group("cluster-raft").await;
    let (_l, _tok) = g.leader("first election on the cluster").await;
    let c = cluster(&mut servers);
    let raft = within(Duration::from_secs(10), "member status", c.raft_leader())
        .await
        .expect("the cluster has a Raft leader");
    // The sidecar leader may keep its term (renewals go to the new Raft
    // leader) or lose it during the election; either way one leader within
    // 2 x TTL (a Raft leader change gives every lease its full TTL again).
    let f = g.rec.fault(Fault::new(
        &format!("Raft leader member m{raft} SIGKILLed"),
        None,
        Expect::Other,
        RESTART_BOUND,
    ));
    c.kill(raft);
    within(
        RESTART_BOUND + Duration::from_secs(4),
        "a leader after the Raft leader member died",
        g.rec.wait_leader(RESTART_BOUND + Duration::from_secs(3)),
    )
    .await;
    sleep(TTL).await;
    c.restart(raft);
    within(
        Duration::from_secs(30),
        "the member to rejoin",
        c.wait_healthy(Duration::from_secs(25)),
    )
    .await;
    g.rec.heal(f, false);
    sleep(Duration::from_secs(2)).await;
    g.leader("one leader after the member rejoined").await;
    g.finish("etcd cluster: Raft leader member SIGKILLed, then back")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_quorum_lost_and_restored() {
    let (mut servers, g) = cluster_group("cluster-quorum").await;
    let (l, tok) = g.leader("first election on the cluster").await;
    // The remaining member still answers pings, but nothing
    // trustworthy: every sidecar reports it within the silence bound.
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        silent_after: Some(SILENT_BOUND),
        ..Fault::new(
            "2 of 3 members SIGKILLed for 3 x TTL",
            Some(l),
            Expect::CutOff,
            RESTART_BOUND,
        )
    });
    let c = cluster(&mut servers);
    c.kill(0);
    c.kill(1);
    sleep(TTL * 3).await;
    g.rec.end_silence(f);
    c.restart(0);
    c.restart(1);
    within(
        Duration::from_secs(30),
        "the cluster to regain quorum",
        c.wait_healthy(Duration::from_secs(25)),
    )
    .await;
    g.rec.heal(f, true);
    within(
        RESTART_BOUND + Duration::from_secs(5),
        "a leader after quorum came back",
        g.rec.wait_leader(RESTART_BOUND + Duration::from_secs(4)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    g.finish("etcd cluster: quorum lost 3 x TTL, then restored")
        .await;
}

/// Move etcd's revision on with writes to other keys, then compact its whole
/// history: a watch from any earlier revision can no longer be opened.
pub(super) async fn compact(servers: &Servers) {
    let Servers::EtcdCluster(c) = servers else {
        unreachable!("compaction is an etcd fault")
    };
    let mut cl = cluster_client(c).await;
    let mut rev = 0;
    for i in 0..20 {
        rev = within(
            Duration::from_secs(5),
            "etcd put",
            cl.put(format!("/other/{i}"), "x", None),
        )
        .await
        .expect("put another key")
        .header()
        .map_or(0, |h| h.revision());
    }
    within(
        Duration::from_secs(5),
        "etcd compact",
        cl.compact(rev, None),
    )
    .await
    .expect("compact");
}

/// Returns as soon as the sidecar's count of acknowledged renewals grows
/// (`leader_election_renew_duration_seconds_count` on `/metrics`), polled
/// every 5 ms: the next renewal is then about a renew interval away.
pub(super) async fn just_after_a_renewal(s: &Sidecar) {
    async fn renewals(s: &Sidecar) -> Option<u64> {
        let (_, body) = http_get(s.port, "/metrics").await.ok()?;
        body.lines()
            .find(|l| l.starts_with("leader_election_renew_duration_seconds_count"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }
    let before = renewals(s).await;
    within(Duration::from_secs(5), "a renewal of the holder", async {
        while renewals(s).await == before {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Etcd compacts its history during a long term, then the
/// leader's watch breaks (a reset of its connections shorter than the safety
/// margin). The watch must come back from a revision etcd still has, so a key
/// deleted by hand afterwards is noticed by the watch, not by the next
/// renewal. On the original code every reopen failed ("revision compacted").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compaction_during_a_term() {
    let servers = Servers::single(Kind::Etcd).await;
    let g = Group::start(&servers, "etcd-compaction", ABC).await;
    let key = key_of(Kind::Etcd, &g.election);
    let (l, tok) = g.leader("first election").await;
    sleep(Duration::from_secs(1)).await;
    let f = g.rec.fault(Fault::new(
        "compaction, then a 150 ms reset of the leader",
        Some(l),
        Expect::Other,
        FAILOVER_BOUND,
    ));
    compact(&servers).await;
    g.cut(l, Mode::Reset);
    sleep(BLIP).await;
    g.cut(l, Mode::Pass);
    g.rec.heal(f, false);
    // Renewals reopen the watch.
    sleep(RENEW * 4).await;
    let (l2, tok2) = g.leader("the same leader after the blip").await;
    assert_eq!(
        (l2, tok2),
        (l, tok),
        "a 150 ms reset changed the leader: the scenario needs one long term"
    );
    let d = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new(
            "key deleted after the compaction",
            Some(l),
            Expect::Other,
            FAILOVER_BOUND,
        )
    });
    // Right after a renewal: the renewal also reads the key, so a delete
    // just before one would race the watch (CI under load saw it lose).
    let holder = g.sidecars[l].as_ref().expect("the holder runs");
    just_after_a_renewal(holder).await;
    tamper(&servers, &key, None).await;
    within(
        FAILOVER_BOUND + Duration::from_secs(3),
        "a new term after the key was deleted",
        g.rec
            .wait_new_leader((l, tok), FAILOVER_BOUND + Duration::from_secs(2)),
    )
    .await;
    g.rec.heal(d, false);
    sleep(Duration::from_millis(500)).await;
    let log = g.sidecars[l].as_ref().expect("the holder runs").log();
    assert!(
        // The original code's watch error ("revision compacted at N").
        !log.contains("revision compacted at"),
        "the holder's watch could not come back after the compaction:\n{}",
        tail(&log, 30)
    );
    assert!(
        log.contains("key deleted, overwritten or edited by someone else"),
        "the holder learned of the delete from a renewal, not from its watch:\n{}",
        tail(&log, 30)
    );
    g.finish("etcd: compaction during a term, then the key deleted by hand")
        .await;
}
