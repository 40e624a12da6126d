//! Failsafe when only the leader is cut from the backend: three sidecars
//! with `--failsafe` on one etcd, the leader's connections through a fault
//! proxy that turns into a partition (blackhole) while both members still
//! reach etcd. The members confirm the leader while its key lives; once
//! they see the key expire they refuse its heartbeats (a member that reads
//! the backend promises only a term live there), so the leader steps down
//! by its last promise, and a member takes over only after it. Safety
//! throughout: never two sidecars answering 200 at once (the watch
//! panics), the fencing token of the new term above the old.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::failsafe::{TTL, secret_file, watch};
use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

fn start(etcd: &str, name: &str, id: &str, secret: &str) -> Sidecar {
    let mut args: Vec<String> = vec!["--etcd-endpoints".into(), etcd.into()];
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(["--failsafe", "--peer-addr", "127.0.0.1:0"].map(String::from));
    args.extend(["--failsafe-secret-file".into(), secret.into()]);
    Sidecar::start_raw(name, id, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_cut_off_steps_down_once_its_members_see_its_term_gone() {
    let cl = EtcdCluster::start(1).await;
    let url = cl.urls()[0].clone();
    let proxy = Proxy::to_url(&url).await;
    let dir = tempfile::TempDir::new().unwrap();
    let secret = secret_file(dir.path(), "s");
    let name = election("fs-cut");
    // The leader first, through the proxy; then the two members, direct.
    let mut sidecars = vec![start(&proxy.url_for(&url), &name, "m0", &secret)];
    one_leader(&sidecars, Duration::from_secs(30)).await;
    let token = token_of(&sidecars[0]).await;
    for id in ["m1", "m2"] {
        sidecars.push(start(&url, &name, id, &secret));
    }
    // Both members admitted (a renewal after each applied), the term unchanged.
    sleep(TTL * 3).await;
    assert_eq!(leaders(&sidecars).await, [0]);
    assert_eq!(token_of(&sidecars[0]).await, token);

    proxy.set(Mode::Blackhole);
    let cut = Instant::now();
    let mut stepped_down = None;
    let mut taken_over = None;
    while cut.elapsed() < TTL * 8 && taken_over.is_none() {
        let l = leaders(&sidecars).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        if !l.contains(&0) && stepped_down.is_none() {
            stepped_down = Some(cut.elapsed());
        }
        if l == [1] || l == [2] {
            assert!(
                stepped_down.is_some(),
                "a member led before the leader stepped down"
            );
            taken_over = Some(cut.elapsed());
        }
        sleep(Duration::from_millis(20)).await;
    }
    let down = stepped_down.expect("the leader stepped down");
    let over = taken_over.expect("a member that reaches etcd took over");
    println!(
        "leader cut off, members reaching etcd: the leader stepped down {down:?} after the cut (bound: its lease {TTL:?} + a member's read + its last promise {TTL:?}), a member led {over:?} after ({:?} after the step-down); overlaps 0",
        over - down
    );
    // The lease, one renew interval for the members to read the key gone
    // and refuse, the last promise, and a second of scheduling slack.
    let bound = TTL * 2 + Duration::from_millis(500) + Duration::from_secs(1);
    assert!(down <= bound, "{down:?} > {bound:?}");
    let new = leaders(&sidecars).await;
    assert!(
        token_of(&sidecars[new[0]]).await > token,
        "the new term's token grew"
    );
    proxy.set(Mode::Pass);
    let w = watch(&sidecars, TTL * 3).await;
    assert_eq!(
        w.leaders.len(),
        1,
        "the new leader kept leading: {:?}",
        w.leaders
    );
}
