//! The handover by one write on a real etcd (`src/backend/etcd/handover.rs`),
//! through the backend trait: a release naming a successor puts the key
//! under the lease the leader kept for it, the successor takes the term
//! with no write, the third follows without one; its safety twins (a hand
//! put naming a follower elects nobody and ends the holder's term, even
//! under the holder's own lease) and its liveness twin (a named successor
//! that never takes the term costs the others at most the lease's TTL); a
//! paused election hands nothing over, and resumed, the successor claims.

use std::time::Duration;

use etcd_client::PutOptions;
use leader_elector::backend::candidates::Candidate;
use leader_elector::backend::{Campaign, Holder, Renewal, Term};
use tokio::time::{Instant, sleep, timeout};

use crate::etcd_ops::{Backend, backend};
use crate::support::*;

/// The TTL every campaign asks for (etcd's minimum).
const TTL: Duration = Duration::from_secs(2);

/// Three candidates of `test`, each with its record published (a process
/// that keeps a record is one a leader may name).
async fn three(etcd: &Etcd, test: &str) -> (String, [Backend; 3]) {
    let key = format!("/leader-elector/{}", election(test));
    let bs = [
        backend(etcd, &key),
        backend(etcd, &key),
        backend(etcd, &key),
    ];
    for (b, id) in bs.iter().zip(["a", "b", "c"]) {
        b.publish_candidate(&Candidate::new(id), Duration::from_secs(30))
            .await
            .unwrap();
    }
    (key, bs)
}

fn elected(c: Campaign) -> Term {
    match c {
        Campaign::Elected(t) => t,
        other => panic!("expected to be elected, got {other:?}"),
    }
}

fn following(c: Campaign) -> Holder {
    match c {
        Campaign::Following(h) => h,
        other => panic!("expected to follow, got {other:?}"),
    }
}

/// The cluster's revision now (every write moves it).
async fn revision(etcd: &Etcd) -> i64 {
    let mut c = etcd.client().await;
    c.get("/nothing", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

/// `a` leads; `b` and `c` follow it. Waits for `a`'s next lease.
async fn a_leads(bs: &[Backend; 3]) -> (Term, Holder) {
    let term = elected(bs[0].campaign("a", TTL, None).await.unwrap());
    let seen = following(bs[1].campaign("b", TTL, None).await.unwrap());
    following(bs[2].campaign("c", TTL, None).await.unwrap());
    // The next lease is granted off the campaign's path.
    sleep(Duration::from_millis(300)).await;
    (term, seen)
}

/// `b` watching the term of `seen`, in a task of its own.
fn watching(
    b: &Backend,
    seen: &Holder,
) -> tokio::task::JoinHandle<leader_elector::backend::Result<()>> {
    let (b, seen) = (b.clone(), seen.clone());
    tokio::spawn(async move { b.watch(&seen).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_to_a_named_successor_elects_it_by_the_put_alone() {
    let etcd = Etcd::start().await;
    let (key, bs) = three(&etcd, "e-handover-put").await;
    let (term_a, seen) = a_leads(&bs).await;
    let (wb, wc) = (watching(&bs[1], &seen), watching(&bs[2], &seen));
    sleep(Duration::from_millis(200)).await;
    bs[0].release(&term_a, Some("b")).await.unwrap();
    timeout(Duration::from_secs(5), wb)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    timeout(Duration::from_secs(5), wc)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let before = revision(&etcd).await;
    let term_b = elected(bs[1].campaign("b", TTL, Some(&seen)).await.unwrap());
    let to_c = following(bs[2].campaign("c", TTL, Some(&seen)).await.unwrap());
    // The successor's next-lease grant is its one write, off the path:
    // wait for it before reading the revision again.
    sleep(Duration::from_millis(300)).await;
    let after = revision(&etcd).await;
    assert!(
        after - before <= 1,
        "the successor and the third wrote {} times (the next lease's grant is the only write)",
        after - before
    );
    let mut client = etcd.client().await;
    let kv = client.get(key.as_str(), None).await.unwrap().kvs()[0].clone();
    assert_eq!(kv.value(), b"b");
    assert!(
        kv.create_revision() < kv.mod_revision(),
        "the key was put over, not deleted and created"
    );
    assert_eq!(term_b.holder.fencing_token, kv.mod_revision() as u64);
    assert!(term_b.holder.fencing_token > term_a.holder.fencing_token);
    assert_eq!(to_c.identity, "b");
    assert_eq!(to_c.fencing_token, term_b.holder.fencing_token);
    assert_eq!(to_c.term_id, term_b.holder.term_id);
    assert!(
        matches!(bs[1].renew(&term_b).await.unwrap(), Renewal::Renewed { .. }),
        "the adopted term renews"
    );
    // And it ends like any term: c takes it at once after b's release.
    bs[1].release(&term_b, None).await.unwrap();
    let term_c = elected(bs[2].campaign("c", TTL, Some(&to_c)).await.unwrap());
    assert!(term_c.holder.fencing_token > term_b.holder.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_put_naming_a_follower_elects_nobody_and_ends_the_holders_term() {
    let etcd = Etcd::start().await;
    let (key, bs) = three(&etcd, "e-handover-foreign").await;
    let (term_a, seen) = a_leads(&bs).await;
    let mut client = etcd.client().await;
    // A live lease of nobody's, and no release mark: not a handover.
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let wb = watching(&bs[1], &seen);
    sleep(Duration::from_millis(200)).await;
    let opts = PutOptions::new().with_lease(lease);
    client.put(key.as_str(), "b", Some(opts)).await.unwrap();
    timeout(Duration::from_secs(5), wb)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let answer = bs[1].campaign("b", TTL, Some(&seen)).await.unwrap();
    assert!(
        !matches!(answer, Campaign::Elected(_)),
        "a hand put naming b elected it: {answer:?}"
    );
    assert!(matches!(
        bs[0].renew(&term_a).await.unwrap(),
        Renewal::Lost(_)
    ));

    // Under the holder's own lease: the holder's term ends at its next
    // renewal (the key's mod_revision moved), and b is not elected.
    let (key2, bs2) = three(&etcd, "e-handover-foreign-own").await;
    let (term_a2, seen2) = a_leads(&bs2).await;
    let own = term_a2.holder.term_id.number().unwrap();
    let opts = PutOptions::new().with_lease(own);
    client.put(key2.as_str(), "b", Some(opts)).await.unwrap();
    assert!(matches!(
        bs2[0].renew(&term_a2).await.unwrap(),
        Renewal::Lost(_)
    ));
    let answer = bs2[1].campaign("b", TTL, Some(&seen2)).await.unwrap();
    assert!(
        !matches!(answer, Campaign::Elected(_)),
        "a hand put under the holder's lease elected b: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_successor_that_never_takes_the_term_costs_at_most_the_ttl() {
    let etcd = Etcd::start().await;
    let (_key, bs) = three(&etcd, "e-handover-dead").await;
    let (term_a, seen) = a_leads(&bs).await;
    // b is named and never campaigns (dead); c watches.
    let wc = watching(&bs[2], &seen);
    sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    bs[0].release(&term_a, Some("b")).await.unwrap();
    timeout(Duration::from_secs(5), wc)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut previous = following(bs[2].campaign("c", TTL, Some(&seen)).await.unwrap());
    assert_eq!(previous.identity, "b");
    let bound = TTL + Duration::from_millis(1500);
    let term_c = loop {
        assert!(
            released.elapsed() < bound + Duration::from_secs(1),
            "c did not lead within the next lease's TTL"
        );
        let w = timeout(Duration::from_secs(4), bs[2].watch(&previous)).await;
        assert!(w.is_ok(), "the watch saw no change");
        match bs[2].campaign("c", TTL, Some(&previous)).await.unwrap() {
            Campaign::Elected(t) => break t,
            Campaign::Following(h) => previous = h,
            Campaign::Waiting { retry_after, .. } => sleep(retry_after.min(TTL)).await,
        }
    };
    let took = released.elapsed();
    println!("a dead named successor: c led {took:?} after the release (bound {bound:?})");
    assert!(took <= bound, "{took:?} > {bound:?}");
    assert!(term_c.holder.fencing_token > term_a.holder.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_election_hands_nothing_over_and_a_resume_lets_the_successor_claim() {
    let etcd = Etcd::start().await;
    let (key, bs) = three(&etcd, "e-handover-paused").await;
    let (term_a, seen) = a_leads(&bs).await;
    bs[0].set_paused(true).await.unwrap();
    bs[0].release(&term_a, Some("b")).await.unwrap();
    let mut client = etcd.client().await;
    let kvs = client.get(key.as_str(), None).await.unwrap();
    assert!(kvs.kvs().is_empty(), "a paused release put the key");
    let answer = bs[1].campaign("b", TTL, Some(&seen)).await.unwrap();
    assert!(
        matches!(answer, Campaign::Waiting { .. }),
        "a campaign while paused: {answer:?}"
    );
    // Its liveness twin: resumed, the named successor takes the term.
    bs[0].set_paused(false).await.unwrap();
    let term_b = elected(bs[1].campaign("b", TTL, Some(&seen)).await.unwrap());
    assert!(term_b.holder.fencing_token > term_a.holder.fencing_token);
}

/// The successor's watch did not deliver the put (it was waiting, or
/// stopped): its next campaign finds the key naming it and adopts the term
/// all the same. Its twin: a process of the same identity started after
/// the put (a restart) adopts nothing and waits for the lease, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_missed_the_put_adopts_at_its_next_campaign_and_a_restart_does_not() {
    let etcd = Etcd::start().await;
    let (key, bs) = three(&etcd, "e-handover-missed").await;
    let (term_a, seen) = a_leads(&bs).await;
    bs[0].release(&term_a, Some("b")).await.unwrap();
    let term_b = elected(bs[1].campaign("b", TTL, Some(&seen)).await.unwrap());
    assert_eq!(term_b.holder.identity, "b");

    // a leads again; b is named and "restarts": a new process of identity
    // b publishes its record after the put, then campaigns.
    bs[1].release(&term_b, None).await.unwrap();
    let term_a = elected(bs[0].campaign("a", TTL, None).await.unwrap());
    sleep(Duration::from_millis(300)).await;
    bs[0].release(&term_a, Some("b")).await.unwrap();
    let restarted = backend(&etcd, &key);
    restarted
        .publish_candidate(
            &leader_elector::backend::candidates::Candidate::new("b"),
            TTL * 15,
        )
        .await
        .unwrap();
    let answer = restarted.campaign("b", TTL, None).await.unwrap();
    assert!(
        !matches!(answer, Campaign::Elected(_)),
        "a process of b started after the put adopted b's handed term: {answer:?}"
    );
}

/// A handed put starts one term. A successor whose adopted term ended
/// without a release (its deadline passed, the release failed: the Elector
/// keeps it as abandoned) must not adopt the same put again at its next
/// campaign: that would be a second term with the first one's fencing
/// token, under a lease a late-applied release of the first term may still
/// delete. It follows its own old term instead (the Elector then releases
/// it), and after that release the next campaign claims with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_put_elects_once_and_an_abandoned_adopted_term_is_not_adopted_again() {
    let etcd = Etcd::start().await;
    let (_key, bs) = three(&etcd, "e-handover-once").await;
    let (term_a, seen) = a_leads(&bs).await;
    bs[0].release(&term_a, Some("b")).await.unwrap();
    let term_b = elected(bs[1].campaign("b", TTL, Some(&seen)).await.unwrap());
    // b's term ends with no release; it campaigns again at once.
    let again = bs[1]
        .campaign("b", TTL, Some(&term_b.holder))
        .await
        .unwrap();
    let own = match again {
        Campaign::Following(h) => h,
        other => panic!("b adopted the put of its ended term again: {other:?}"),
    };
    assert_eq!(
        own.term_id, term_b.holder.term_id,
        "b follows its own old term"
    );
    assert_eq!(own.fencing_token, term_b.holder.fencing_token);
    // The Elector's way out: release the abandoned term, then claim.
    bs[1].release(&term_b, None).await.unwrap();
    let next = elected(bs[1].campaign("b", TTL, None).await.unwrap());
    assert!(
        next.holder.fencing_token > term_b.holder.fencing_token,
        "a new term has a larger token: {} after {}",
        next.holder.fencing_token,
        term_b.holder.fencing_token
    );
}

/// Whether `identity`'s record is listed in `b`'s registry.
async fn listed(b: &Backend, identity: &str) -> bool {
    let all = b.candidates().await.unwrap();
    all.iter().any(|l| l.candidate.identity == identity)
}

/// A preferred member killed while it leads and restarted with the same
/// identity takes the term back by the handover (the user's report): its
/// new process's record must stay listed while it leads (the leader does
/// not renew it), not vanish with a lease the handover or the term uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_successor_that_takes_the_term_back_keeps_its_record() {
    let etcd = Etcd::start().await;
    let (key, bs) = three(&etcd, "e-handover-restart-record").await;
    let record_ttl = TTL * 12;
    let first = backend(&etcd, &key);
    first
        .publish_candidate(&Candidate::new("d"), record_ttl)
        .await
        .unwrap();
    let (term_a, seen) = a_leads(&bs).await;
    following(first.campaign("d", TTL, None).await.unwrap());
    bs[0].release(&term_a, Some("d")).await.unwrap();
    let term_d = elected(first.campaign("d", TTL, Some(&seen)).await.unwrap());
    // kill -9: no release, no withdraw; a takes over after the lease.
    drop(first);
    let mut previous = term_d.holder.clone();
    let start = Instant::now();
    let term_a = loop {
        assert!(start.elapsed() < TTL * 4, "a did not take over");
        match bs[0].campaign("a", TTL, Some(&previous)).await.unwrap() {
            Campaign::Elected(t) => break t,
            Campaign::Following(h) => {
                previous = h;
                sleep(Duration::from_millis(200)).await;
            }
            Campaign::Waiting { retry_after, .. } => {
                sleep(retry_after.max(Duration::from_millis(100))).await
            }
        }
    };
    sleep(Duration::from_millis(300)).await;
    // The restart: a new process of d publishes its record and follows.
    let restarted = backend(&etcd, &key);
    restarted
        .publish_candidate(&Candidate::new("d"), record_ttl)
        .await
        .unwrap();
    let seen = following(restarted.campaign("d", TTL, None).await.unwrap());
    assert_eq!(seen.identity, "a");
    let wd = watching(&restarted, &seen);
    sleep(Duration::from_millis(200)).await;
    bs[0].release(&term_a, Some("d")).await.unwrap();
    timeout(Duration::from_secs(5), wd)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let term_d = elected(restarted.campaign("d", TTL, Some(&seen)).await.unwrap());
    assert!(listed(&bs[1], "d").await, "d's record is gone at once");
    // It leads (renewing its term, not its record) for two TTLs.
    let until = Instant::now() + TTL * 3;
    while Instant::now() < until {
        let r = restarted.renew(&term_d).await.unwrap();
        assert!(matches!(r, Renewal::Renewed { .. }), "{r:?}");
        assert!(
            listed(&bs[1], "d").await,
            "the leading restarted d's record vanished"
        );
        sleep(TTL / 4).await;
    }
}
