//! Failsafe when only the leader is cut from the backend: three sidecars
//! with `--failsafe` on one etcd, the leader's connections through a fault
//! proxy that turns into a partition (blackhole) while both members still
//! reach etcd and see the term's key expire. The leader keeps leading only
//! while every member confirms it; when one member stops confirming
//! (SIGSTOP), the leader steps down by the bound (one promise), and the
//! other member takes over only after it. Safety throughout: never two
//! sidecars answering 200 at once (the watch panics), the fencing token of
//! the new term above the old.

use std::time::Duration;

use nix::sys::signal::Signal;
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
async fn the_leader_cut_off_leads_only_while_every_member_confirms() {
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
    let w = watch(&sidecars, TTL * 3).await;
    assert_eq!(w.led_until, None, "the cut-off leader led while confirmed");
    assert_eq!(w.leaders.len(), 1, "{:?}", w.leaders);
    let (code, body) = sidecars[0].leader().await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["failsafe"]["active"], true, "{body}");
    assert_eq!(body["failsafe"]["members_confirmed"], 2, "{body}");
    let confirmed_for = cut.elapsed();

    // m2 stops confirming; m1 still sees etcd with the key expired.
    sidecars[2].signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let mut stepped_down = None;
    let mut taken_over = None;
    // The stopped member is left out of the polls (a frozen process answers
    // nothing; each poll would wait for its timeout).
    while stopped.elapsed() < TTL * 8 && taken_over.is_none() {
        let l = leaders(&sidecars[..2]).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        if !l.contains(&0) && stepped_down.is_none() {
            stepped_down = Some(stopped.elapsed());
        }
        if l == [1] {
            assert!(
                stepped_down.is_some(),
                "m1 led before the leader stepped down"
            );
            taken_over = Some(stopped.elapsed());
        }
        sleep(Duration::from_millis(20)).await;
    }
    let down = stepped_down.expect("the leader stepped down");
    let over = taken_over.expect("the member that reaches etcd took over");
    println!(
        "leader cut off, both members confirming: led {confirmed_for:?} (failsafe active, 2 confirmed); one member stopped: the leader stepped down {down:?} after (bound: one promise = {TTL:?} + margin), the other member led {over:?} after ({:?} after the step-down); overlaps 0",
        over - down
    );
    assert!(down <= TTL + Duration::from_secs(1), "{down:?}");
    assert!(
        token_of(&sidecars[1]).await > token,
        "the new term's token grew"
    );

    sidecars[2].signal(Signal::SIGCONT);
    proxy.set(Mode::Pass);
    let w = watch(&sidecars, TTL * 3).await;
    assert_eq!(w.leaders.len(), 1, "m1 kept leading: {:?}", w.leaders);
}
