//! Redis Sentinel under a real partition: the primary isolated together
//! with the leader's sidecar while the Sentinels, the replicas and the other
//! sidecars, on the majority side, promote a replica. With
//! `--redis-min-replicas 1` the isolated primary confirms no write (no
//! replica acknowledges `WAIT`), so the leader's renewals fail and it steps
//! down by its own deadline; the others lead on the promoted replica after
//! the promotion hold-off. Runs with `LEADER_ELECTOR_PARTITIONS=all`.

use std::time::Duration;

use tempfile::TempDir;
use tokio::time::sleep;

use super::partition::{Servers, Store, TTL, World, all, start_redis};
use crate::support::netns::Net;
use crate::support::recorder::{Expect, Fault};
use crate::support::wait_for;

/// The master's name in the Sentinels' configuration.
const MASTER: &str = "mymaster";

/// The Redis book page's bound for a leader after a lost primary: one lease
/// + Sentinel's failover (down-after 1 s, election and promotion: up to 3 s
///   here) + 1 s + one retry period.
const SENTINEL_BOUND: Duration = Duration::from_millis(2000 + 4000 + 1000 + 500);

/// Start a primary, two replicas and three Sentinels on new nodes (`back`
/// in that order), every Sentinel knowing both replicas and both other
/// Sentinels; the sidecars' flags.
pub async fn start(net: &Net, dir: &TempDir) -> Servers {
    let servers: Vec<usize> = (0..3).map(|i| net.add(&format!("r{i}"))).collect();
    let primary = net.ip(servers[0]);
    let mut procs = vec![start_redis(net, servers[0], dir, &[]).await];
    for &r in &servers[1..] {
        let of = ["--replicaof".into(), primary.to_string(), "6379".into()];
        procs.push(start_redis(net, r, dir, &of).await);
    }
    let mut back = servers.clone();
    let mut hosts = Vec::new();
    for i in 0..3 {
        let n = net.add(&format!("sen{i}"));
        let ip = net.ip(n);
        let conf = dir.path().join(format!("sentinel{i}.conf"));
        let text = format!(
            "port 26379\nbind {ip}\nprotected-mode no\ndir {dir}\n\
             sentinel monitor {MASTER} {primary} 6379 2\n\
             sentinel down-after-milliseconds {MASTER} 1000\n\
             sentinel failover-timeout {MASTER} 4000\n\
             sentinel parallel-syncs {MASTER} 2\n",
            dir = dir.path().display()
        );
        std::fs::write(&conf, text).unwrap();
        let args = [conf.display().to_string(), "--sentinel".into()];
        let log = dir.path().join(format!("sentinel{i}.log"));
        procs.push(net.spawn(n, "redis-server", &args, &log));
        back.push(n);
        hosts.push(format!("{ip}:26379"));
    }
    for h in &hosts {
        let what = format!("Sentinel {h} to know 2 replicas and 2 Sentinels");
        wait_for(Duration::from_secs(30), &what, || knows_all(h)).await;
    }
    let flags = vec![
        "--redis-sentinel".into(),
        hosts.join(","),
        "--redis-sentinel-master".into(),
        MASTER.into(),
        "--redis-min-replicas".into(),
        "1".into(),
    ];
    Servers {
        back,
        procs,
        flags: vec![flags; 3],
        env: Vec::new(),
        kube: None,
    }
}

/// Whether the Sentinel at `host` knows two replicas and two other Sentinels.
async fn knows_all(host: &str) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://{host}")) else {
        return false;
    };
    let Ok(Ok(mut c)) = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    else {
        return false;
    };
    let mut count = async |what: &str| {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg(what).arg(MASTER);
        let v: Vec<redis::Value> = cmd.query_async(&mut c).await.unwrap_or_default();
        v.len()
    };
    let replicas = count("replicas").await;
    replicas == 2 && count("sentinels").await == 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_isolated_with_the_leader() {
    if !all() {
        return;
    }
    let name = "p-sentinel";
    let w = World::start(Store::Sentinel, name).await;
    let (slot, token) = w.leader(Duration::from_secs(30)).await;
    let mut f = Fault::new(
        "primary isolated with the leader",
        Some(slot),
        Expect::CutOff,
        SENTINEL_BOUND,
    );
    f.ends_term = Some((slot, token));
    let fault = w.rec.fault(f);
    let island = [w.back[0], w.side[slot]];
    let rest: Vec<usize> = w.back[1..]
        .iter()
        .chain(&w.side)
        .copied()
        .filter(|n| !island.contains(n))
        .collect();
    w.net.split(&island, &rest);
    w.rec.in_effect(fault);
    sleep(SENTINEL_BOUND + TTL).await;
    w.heal("sentinel island", Some(fault));
    w.judge(name, TTL * 3).await;
}
