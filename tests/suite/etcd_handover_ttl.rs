//! A rolling update between etcd sidecars of different `--lease-duration`s
//! (kubernetes#47671's shape; issue 50), in both directions and scaled
//! down (6 s and 2 s): the term the old leader hands over by one write
//! runs on the taker's own TTL within one renew interval of the handover
//! (its `/leader` and the key's lease in etcd say so), and a SIGKILL of the
//! taker then costs its own TTL + renew interval + 0.5 s at most, not the
//! old leader's TTL; the overlap checker finds no two leaders.

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::support::backends::Backend;
use crate::support::fleet::{Fleet, until_answering};
use crate::support::recorder::{Expect, Fault, Recorder};
use crate::support::wait_for;

/// One side of the update: its lease duration and renew interval.
#[derive(Clone, Copy, Debug)]
struct Side {
    ttl: Duration,
    renew: Duration,
}

const LONG: Side = Side {
    ttl: Duration::from_secs(6),
    renew: Duration::from_secs(2),
};

const SHORT: Side = Side {
    ttl: Duration::from_secs(2),
    renew: Duration::from_millis(500),
};

impl Side {
    fn flags(&self) -> Vec<String> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        vec![
            "--lease-duration".into(),
            ms(self.ttl),
            "--renew-interval".into(),
            ms(self.renew),
        ]
    }
}

/// The granted TTL of the lease the election key is bound to now, in
/// seconds (0: no key).
async fn key_lease_ttl(fleet: &Fleet) -> i64 {
    let Backend::Etcd(etcd) = &fleet.backend else {
        panic!("an etcd fleet");
    };
    let mut client = etcd.client().await;
    let key = format!("/leader-elector/{}", fleet.election);
    let got = client.get(key, None).await.unwrap();
    let Some(kv) = got.kvs().first() else {
        return 0;
    };
    let ttl = client.lease_time_to_live(kv.lease(), None).await.unwrap();
    ttl.granted_ttl()
}

/// Whether the election key was put over (a handover by one write, or
/// the taker's swap) rather than deleted and created by a claim.
async fn key_put_over(fleet: &Fleet) -> bool {
    let Backend::Etcd(etcd) = &fleet.backend else {
        panic!("an etcd fleet");
    };
    let mut client = etcd.client().await;
    let key = format!("/leader-elector/{}", fleet.election);
    let got = client.get(key, None).await.unwrap();
    got.kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() < kv.mod_revision())
}

/// `s1` (`from`) leads, `s2` (`to`) follows; SIGTERM `s1` (s2 takes the
/// term by the handover); `s1` comes back; SIGKILL `s2`. Returns the
/// handover's and the crash failover's times.
async fn update(test: &str, from: Side, to: Side) -> (Duration, Duration) {
    let mut fleet = Fleet::etcd(test).await;
    fleet.common = vec!["--retry-period".into(), "500ms".into()];
    let rec = Recorder::new(from.ttl.max(to.ttl));
    let mut s1 = fleet.start("s1", &strs(&from.flags())).await;
    let slot1 = rec.add("s1", s1.port);
    let first = rec.wait_leader(Duration::from_secs(30)).await;
    let first = first.expect("s1 leads");
    let s2 = fleet.start("s2", &strs(&to.flags())).await;
    let slot2 = rec.add("s2", s2.port);
    until_answering(&s2, Duration::from_secs(30)).await;
    // The time a Pod takes to turn ready: s1 has seen s2's record.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let resigned = Instant::now();
    s1.signal(Signal::SIGTERM);
    let taken = rec.wait_new_leader(first, Duration::from_secs(20)).await;
    let handover = resigned.elapsed();
    let taken = taken.expect("s2 leads after s1's SIGTERM");
    assert_eq!(taken.0, slot2, "the successor leads");
    s1.wait_exit(Duration::from_secs(15))
        .await
        .expect("s1 exits");
    rec.stop_polling(slot1);
    assert!(
        s1.log().contains("successor=s2"),
        "s1 released to s2:\n{}",
        s1.log()
    );
    assert!(key_put_over(&fleet).await, "a handover by one write");
    // Within one renew interval of the handover, the term runs on s2's TTL.
    let own = to.ttl.as_secs() as i64;
    wait_for(to.renew, "s2's term on its own TTL", || async {
        let body = s2.leader().await.map(|(_, b)| b);
        let said = body.and_then(|b| b["lease_duration_seconds"].as_f64());
        said == Some(own as f64) && key_lease_ttl(&fleet).await == own
    })
    .await;

    let s1 = fleet.start("s1", &strs(&from.flags())).await;
    rec.add("s1 again", s1.port);
    until_answering(&s1, Duration::from_secs(30)).await;
    let bound = to.ttl + to.renew + Duration::from_millis(500);
    rec.fault(Fault {
        ends_term: Some(taken),
        ..Fault::new("SIGKILL s2", Some(slot2), Expect::Killed, bound)
    });
    let killed = Instant::now();
    s2.signal(Signal::SIGKILL);
    let next = rec.wait_new_leader(taken, Duration::from_secs(20)).await;
    let failover = killed.elapsed();
    next.expect("s1 leads after s2's SIGKILL");
    assert!(
        failover <= bound,
        "a leader {failover:?} after s2's SIGKILL, over its own TTL + renew interval + 0.5 s ({bound:?})"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = rec.check(test);
    assert!(report.problems.is_empty(), "{}", report.summary());
    drop(s2);
    (handover, failover)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_shorter_ttl_runs_on_the_takers_ttl() {
    let (handover, failover) = update("e-ttl-shorter", LONG, SHORT).await;
    eprintln!("6 s -> 2 s: handover {handover:?}, crash failover {failover:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_longer_ttl_runs_on_the_takers_ttl() {
    let (handover, failover) = update("e-ttl-longer", SHORT, LONG).await;
    eprintln!("2 s -> 6 s: handover {handover:?}, crash failover {failover:?}");
}
