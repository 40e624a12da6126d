//! Failsafe under real partitions: three sidecars with `--failsafe` on one
//! etcd member. Every sidecar is cut from etcd (the backend is down for
//! all): the leader leads on while both members confirm it over their peer
//! links. Then the leader is cut from both members as well: it must stop
//! claiming within one promise (a lease duration), and nobody may lead
//! until etcd is back (the members cannot campaign). Then everything
//! heals: a leader again within the bound. Runs with
//! `LEADER_ELECTOR_PARTITIONS=all`.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::partition::{BOUND, Store, TTL, World, all};
use crate::support::recorder::{Expect, Fault};

/// The failsafe flags of a sidecar on `ip` (the secret file in `dir`).
pub fn flags(ip: IpAddr, dir: &Path) -> Vec<String> {
    let secret = dir.join("failsafe-secret");
    std::fs::write(&secret, "partition-0123456789abcdef0123456789\n").unwrap();
    vec![
        "--failsafe".into(),
        "--peer-addr".into(),
        format!("{ip}:0"),
        "--failsafe-secret-file".into(),
        secret.display().to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failsafe_members_cut_from_each_other_while_etcd_is_down() {
    if !all() {
        return;
    }
    let name = "p-failsafe";
    let w = World::start(Store::EtcdFailsafe, name).await;
    // Both members admitted to the roster (a renewal after each).
    sleep(TTL * 3).await;
    let (slot, token) = w.leader(Duration::from_secs(5)).await;
    let fault = w.rec.fault(Fault::new(
        "etcd cut from everyone",
        None,
        Expect::Other,
        BOUND,
    ));
    w.net.split(&w.side, &w.back);
    w.rec.in_effect(fault);
    sleep(TTL * 2).await;
    let still = w
        .rec
        .leader_now(Instant::now() - Duration::from_millis(200));
    assert_eq!(
        still,
        Some((slot, token)),
        "the failsafe leader stopped while confirmed"
    );
    let others: Vec<usize> = (0..3).filter(|&i| i != slot).map(|i| w.side[i]).collect();
    w.net.split(&[w.side[slot]], &others);
    let cut = Instant::now();
    sleep(TTL + Duration::from_millis(500)).await;
    let asked = Instant::now();
    sleep(Duration::from_millis(200)).await;
    let now = w.rec.leader_now(asked);
    assert_eq!(
        now,
        None,
        "someone leads {:?} after the peer cut",
        cut.elapsed()
    );
    sleep(TTL * 2).await;
    w.heal("everything", None);
    w.rec.heal(fault, true);
    w.judge(name, TTL * 2).await;
}
