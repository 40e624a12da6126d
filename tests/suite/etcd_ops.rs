//! Operations on a real etcd, through the backend trait: the candidate
//! registry (publish, list, withdraw, lapse, watch), a release naming a
//! successor (the successor takes the term, the others leave it the wait;
//! a dead or unknown successor costs at most that wait), and the pause
//! (no new term while paused, a holder keeps renewing, resume lets the
//! next campaign win). Each safety test has its liveness twin.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use leader_elector::backend::candidates::{Candidate, SUCCESSOR_WAIT_CAP, from_unix_ms, unix_ms};
use leader_elector::backend::controls::Controls;
use leader_elector::backend::etcd::{EtcdBackend, EtcdOptions};
use leader_elector::backend::{Campaign, LeaseBackend, Renewal, Term, WaitReason};
use leader_elector::backend::{CandidateRegistry, ControlStore};
use leader_elector::elector::{Rules, successor_for};
use tokio::time::{Instant, sleep, timeout};

use crate::support::*;

/// A campaign that loops no faster than this; the Elector's retry period
/// is of this order in the tests' fast set-up.
pub const RETRY: Duration = Duration::from_millis(20);

/// The TTL every campaign asks for (etcd's minimum; a Redis server keeps
/// candidates out for one TTL plus a second after it starts).
pub const TTL: Duration = Duration::from_secs(2);

/// What a scenario's backend is: the election, its candidate registry and
/// its controls on one struct, as every backend delivers them.
pub trait Whole: LeaseBackend + CandidateRegistry + ControlStore {}

impl<T: LeaseBackend + CandidateRegistry + ControlStore + ?Sized> Whole for T {}

/// A backend as the scenarios use it: each candidate has its own.
pub type Backend = Arc<dyn Whole>;

/// One candidate's etcd backend (each has its own, as each sidecar does).
pub fn backend(etcd: &Etcd, key: &str) -> Backend {
    EtcdBackend::new(
        key.to_owned(),
        EtcdOptions {
            endpoints: vec![etcd.url.clone()],
            connect_timeout: Duration::from_secs(2),
            keepalive_interval: Duration::from_secs(2),
            ..EtcdOptions::default()
        },
    )
}

fn key(test: &str) -> String {
    format!("/leader-elector/{}", election(test))
}

pub fn candidate(id: &str, priority: u32, revision: &str) -> Candidate {
    Candidate {
        priority,
        revision: revision.into(),
        // Round-trips through every registry (election-wide, compared by followers).
        preempt_after: Some(Duration::from_millis(2500)),
        ..Candidate::new(id)
    }
}

pub async fn campaign(b: &dyn LeaseBackend, id: &str) -> Campaign {
    timeout(Duration::from_secs(5), b.campaign(id, TTL, None))
        .await
        .expect("a campaign hung for 5 s")
        .expect("a campaign failed")
}

/// Campaign every [`RETRY`] (or `retry_after`, when shorter) until elected
/// within `limit`: the term, the time it took, and every `why` waited on.
pub async fn until_elected(
    b: &dyn LeaseBackend,
    id: &str,
    limit: Duration,
) -> Option<(Term, Duration, Vec<WaitReason>)> {
    let start = Instant::now();
    let mut whys = Vec::new();
    while start.elapsed() < limit {
        match campaign(b, id).await {
            Campaign::Elected(t) => return Some((t, start.elapsed(), whys)),
            Campaign::Waiting {
                why, retry_after, ..
            } => {
                whys.push(why);
                sleep(retry_after.min(RETRY)).await;
            }
            Campaign::Following(_) => sleep(RETRY).await,
        }
    }
    None
}

/// Elected within 8 s (a fresh Redis server keeps candidates out for a while).
pub async fn elect(b: &dyn LeaseBackend, id: &str) -> Term {
    match until_elected(b, id, Duration::from_secs(8)).await {
        Some((t, _, _)) => t,
        None => panic!("{id} not elected on a free key within 8 s"),
    }
}

pub async fn listed_ids(b: &dyn Whole) -> Vec<String> {
    let mut ids: Vec<String> = b
        .candidates()
        .await
        .expect("list")
        .into_iter()
        .map(|l| l.candidate.identity)
        .collect();
    ids.sort();
    ids
}

/// Publish, list, renew, withdraw, lapse; liveness twin: republished
/// after a lapse, listed again (and created later).
pub async fn registry_lists_until_withdrawn_or_lapsed(make: &dyn Fn() -> Backend) {
    let b = make();
    b.publish_candidate(&candidate("a", 3, "r1"), TTL)
        .await
        .unwrap();
    sleep(Duration::from_millis(5)).await;
    b.publish_candidate(&candidate("b", 1, "r2"), TTL)
        .await
        .unwrap();
    let listed = b.candidates().await.unwrap();
    let a = listed.iter().find(|l| l.candidate.identity == "a").unwrap();
    let bb = listed.iter().find(|l| l.candidate.identity == "b").unwrap();
    assert_eq!(a.candidate, candidate("a", 3, "r1"));
    assert_eq!(a.ttl, TTL);
    assert!(a.alive(), "{a:?}");
    // `status` shows an age on every backend (etcd: from the record's write time).
    assert!(a.age.or(a.written_ago).is_some(), "{a:?}");
    assert!(a.created < bb.created, "{a:?} {bb:?}");
    // A freeze round-trips on every backend (Redis dropped it: issue 46).
    let until = from_unix_ms(unix_ms(SystemTime::now()) + 60_000);
    let frozen = Candidate {
        ready: false,
        frozen_until: Some(until),
        ..candidate("c", 1, "r1")
    };
    b.publish_candidate(&frozen, TTL).await.unwrap();
    let c = b.candidates().await.unwrap();
    let c = c.iter().find(|l| l.candidate.identity == "c").unwrap();
    assert_eq!(c.candidate, frozen, "the freeze is kept");
    b.withdraw_candidate("c").await.unwrap();
    // A renewal keeps the record's place in the order of creation.
    let created = a.created;
    sleep(Duration::from_millis(5)).await;
    b.publish_candidate(&candidate("a", 4, "r1"), TTL)
        .await
        .unwrap();
    let again = b.candidates().await.unwrap();
    let a2 = again.iter().find(|l| l.candidate.identity == "a").unwrap();
    assert_eq!((a2.created, a2.candidate.priority), (created, 4));
    b.withdraw_candidate("b").await.unwrap();
    b.withdraw_candidate("b")
        .await
        .expect("withdrawn twice is fine");
    assert_eq!(listed_ids(&*b).await, ["a"]);
    // Not renewed: the backend expires it.
    wait_for(Duration::from_secs(6), "the record to lapse", || async {
        listed_ids(&*b).await.is_empty()
    })
    .await;
    b.publish_candidate(&candidate("a", 4, "r1"), TTL)
        .await
        .unwrap();
    let back = b.candidates().await.unwrap();
    assert_eq!(back.len(), 1);
    assert!(back[0].created > created);
}

/// The registry watch is pending while nothing changes and resolves on a
/// join and on a leave, each within 2 s.
pub async fn registry_watch_resolves_on_join_and_leave(make: &dyn Fn() -> Backend) {
    let (leader, other) = (make(), make());
    let ttl = Duration::from_secs(30);
    leader.candidates().await.unwrap();
    let watch = tokio::spawn({
        let leader = leader.clone();
        async move { leader.watch_candidates().await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!watch.is_finished(), "resolved with nothing changed");
    other
        .publish_candidate(&candidate("c", 1, ""), ttl)
        .await
        .unwrap();
    timeout(Duration::from_secs(2), watch)
        .await
        .expect("the watch did not report a join")
        .unwrap()
        .unwrap();
    assert_eq!(listed_ids(&*leader).await, ["c"]);
    let watch = tokio::spawn({
        let leader = leader.clone();
        async move { leader.watch_candidates().await }
    });
    sleep(Duration::from_millis(100)).await;
    other.withdraw_candidate("c").await.unwrap();
    timeout(Duration::from_secs(2), watch)
        .await
        .expect("the watch did not report a leave")
        .unwrap()
        .unwrap();
    assert!(listed_ids(&*leader).await.is_empty());
}

/// Start `id` campaigning on `backend` after `delay`, for `limit`.
fn campaigner(
    backend: &Backend,
    id: &'static str,
    delay: Duration,
    limit: Duration,
) -> tokio::task::JoinHandle<Option<(Term, Duration, Vec<WaitReason>)>> {
    let b = backend.clone();
    tokio::spawn(async move {
        sleep(delay).await;
        until_elected(&*b, id, limit).await
    })
}

/// Renew `term` on `backend` every quarter of its TTL until the returned
/// handle is dropped by [`RenewedWhile::check`]: while `c` is watched for a
/// term it must not take, `b` holds its own as a leader does. (Left
/// unrenewed, `b`'s key runs out [`TTL`] after its grant and `c` may take
/// it by right: under load `c`'s watch ended after that, seen in CI.)
struct RenewedWhile {
    task: tokio::task::JoinHandle<()>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
}

impl RenewedWhile {
    fn start(backend: &Backend, term: &Term) -> RenewedWhile {
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (b, t, f) = (backend.clone(), term.clone(), failures.clone());
        let task = tokio::spawn(async move {
            loop {
                sleep(TTL / 4).await;
                match b.renew(&t).await {
                    Ok(Renewal::Renewed { .. }) => {}
                    other => f.lock().unwrap().push(format!("{other:?}")),
                }
            }
        });
        RenewedWhile { task, failures }
    }

    /// Stop renewing; every renewal must have said renewed.
    fn check(self) {
        self.task.abort();
        let failures = self.failures.lock().unwrap();
        assert!(failures.is_empty(), "b's renewals failed: {failures:?}");
    }
}

/// `b` and `c` campaign while `a` releases to `b`; `b` starts `late` after
/// the release. `b` leads; `c` never does meanwhile. Returns the time from
/// the release to `b`'s term.
async fn hand_over_to_b(make: &dyn Fn() -> Backend, late: Duration) -> Duration {
    let (a, b, c) = (make(), make(), make());
    let term = elect(&*a, "a").await;
    let limit = SUCCESSOR_WAIT_CAP * 2;
    let cs = campaigner(&c, "c", Duration::ZERO, limit);
    sleep(Duration::from_millis(50)).await;
    let bs = campaigner(&b, "b", late, limit);
    let released = Instant::now();
    a.release(&term, Some("b")).await.unwrap();
    let (won, _, _) = bs.await.unwrap().expect("the named successor leads");
    let handover = released.elapsed();
    let renewed = RenewedWhile::start(&b, &won);
    assert_eq!(won.holder.identity, "b");
    assert!(won.holder.fencing_token > term.holder.fencing_token);
    let third = cs.await.unwrap();
    assert!(
        third.is_none(),
        "c took the term: {third:?}; b took it {handover:?} after the release"
    );
    renewed.check();
    b.release(&won, None).await.unwrap();
    handover
}

/// Three rounds of a release to a named successor among 3 candidates,
/// then one whose successor starts 60 ms late (within the wait).
pub async fn successor_takes_the_term(make: &dyn Fn() -> Backend, name: &str) {
    let mut took = Vec::new();
    for _ in 0..3 {
        took.push(hand_over_to_b(make, Duration::ZERO).await);
    }
    println!("{name}: handover to the named successor among 3 candidates: {took:?}");
    let late = hand_over_to_b(make, Duration::from_millis(60)).await;
    println!("{name}: handover to a successor starting 60 ms late: {late:?}");
}

/// A plain release (SIGTERM's) names the registry's choice, as the
/// Elector's one `successor_for` ranks the backend's list: `b`, of the
/// higher priority, leads although `c` campaigns from the start; with
/// `b`'s record withdrawn, the next plain release names `c`.
pub async fn a_plain_release_names_the_registry_choice(make: &dyn Fn() -> Backend) {
    let (a, b, c) = (make(), make(), make());
    let ttl = Duration::from_secs(30);
    b.publish_candidate(&candidate("b", 5, ""), ttl)
        .await
        .unwrap();
    c.publish_candidate(&candidate("c", 1, ""), ttl)
        .await
        .unwrap();
    let term = elect(&*a, "a").await;
    let limit = SUCCESSOR_WAIT_CAP * 2;
    let cs = campaigner(&c, "c", Duration::ZERO, limit);
    sleep(Duration::from_millis(50)).await;
    let bs = campaigner(&b, "b", Duration::from_millis(30), limit);
    let to = choice(&*a, "a").await;
    assert_eq!(to.as_deref(), Some("b"));
    a.release(&term, to.as_deref()).await.unwrap();
    let (won, _, _) = bs.await.unwrap().expect("the registry's choice leads");
    let renewed = RenewedWhile::start(&b, &won);
    assert!(cs.await.unwrap().is_none(), "c took the term");
    renewed.check();
    b.withdraw_candidate("b").await.unwrap();
    let cs = campaigner(&c, "c", Duration::from_millis(30), limit);
    let to = choice(&*b, "b").await;
    b.release(&won, to.as_deref()).await.unwrap();
    let (_, _, whys) = cs.await.unwrap().expect("c leads, named");
    assert!(whys.is_empty(), "c, the one named, waited: {whys:?}");
}

/// The successor the Elector names for `me` from `backend`'s registry.
async fn choice(backend: &dyn Whole, me: &str) -> Option<String> {
    let listed = backend.candidates().await.unwrap();
    let rules = Rules {
        me,
        paused: false,
        pinned: None,
        now: std::time::SystemTime::now(),
    };
    successor_for(&listed, &rules).map(|c| c.identity.clone())
}

/// Liveness twin: a named successor that never campaigns costs the
/// others at most the wait; the name goes with the next claim.
pub async fn a_dead_successor_costs_at_most_the_wait(
    make: &dyn Fn() -> Backend,
    name: &str,
    yielding: WaitReason,
) {
    let (a, c) = (make(), make());
    let term = elect(&*a, "a").await;
    let cs = campaigner(&c, "c", Duration::ZERO, Duration::from_secs(5));
    sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    a.release(&term, Some("b")).await.unwrap();
    let (won, _, whys) = cs.await.unwrap().expect("c leads after the wait");
    let took = released.elapsed();
    println!("{name}: handover with the named successor dead: {took:?}");
    assert!(whys.contains(&yielding), "{whys:?}");
    assert!(took <= SUCCESSOR_WAIT_CAP + RETRY * 5, "{took:?}");
    c.release(&won, None).await.unwrap();
    let (_, took, whys) = until_elected(&*a, "a", RETRY * 5).await.unwrap();
    assert!(
        whys.is_empty(),
        "a stale name after the claim: {whys:?} {took:?}"
    );
}

/// A hand-written successor naming nobody known costs a campaign at most
/// the wait.
pub async fn a_foreign_successor_costs_at_most_the_wait(
    b: &dyn LeaseBackend,
    name: &str,
    yielding: WaitReason,
) {
    let (_, took, whys) = until_elected(b, "d", Duration::from_secs(5))
        .await
        .expect("d leads despite a foreign successor key");
    println!("{name}: a hand-written successor key cost {took:?}");
    assert!(whys.contains(&yielding), "{whys:?}");
    assert!(took <= SUCCESSOR_WAIT_CAP + RETRY * 5, "{took:?}");
}

/// While paused the holder renews and a free key is not taken; liveness
/// twin: after resume the next campaign wins.
pub async fn a_paused_election_starts_no_term(make: &dyn Fn() -> Backend) {
    let (a, c, op) = (make(), make(), make());
    let term = elect(&*a, "a").await;
    op.set_paused(true).await.unwrap();
    assert!(op.controls().await.unwrap().paused);
    for _ in 0..3 {
        let r = a.renew(&term).await.unwrap();
        assert!(matches!(r, Renewal::Renewed { .. }), "{r:?}");
    }
    assert!(matches!(campaign(&*c, "c").await, Campaign::Following(_)));
    a.release(&term, None).await.unwrap();
    for _ in 0..5 {
        match campaign(&*c, "c").await {
            Campaign::Waiting { why, .. } => assert_eq!(why, WaitReason::Paused),
            other => panic!("a campaign while paused: {other:?}"),
        }
        sleep(RETRY).await;
    }
    op.set_paused(false).await.unwrap();
    let (t, took, _) = until_elected(&*c, "c", Duration::from_secs(2))
        .await
        .expect("c leads after resume");
    assert!(took < RETRY * 2, "not at once: {took:?}");
    c.release(&t, None).await.unwrap();
}

/// Campaigns racing the pause: any that won started before the pause was
/// written; once `set_paused` returned, none wins.
pub async fn campaigns_racing_the_pause(make: &dyn Fn() -> Backend) {
    let op = make();
    let cs: Vec<Backend> = (0..4).map(|_| make()).collect();
    // Past a fresh Redis server's hold-off first.
    let t = elect(&*cs[0], "c0").await;
    cs[0].release(&t, None).await.unwrap();
    for round in 0..10 {
        let racers: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let b = b.clone();
                tokio::spawn(async move {
                    sleep(Duration::from_micros(300 * i as u64)).await;
                    b.campaign(&format!("c{i}"), TTL, None).await
                })
            })
            .collect();
        op.set_paused(true).await.unwrap();
        let mut won = None;
        for (i, r) in racers.into_iter().enumerate() {
            if let Ok(Campaign::Elected(t)) = r.await.unwrap() {
                won = Some((i, t));
            }
        }
        for (i, b) in cs.iter().enumerate() {
            match campaign(&**b, &format!("c{i}")).await {
                Campaign::Elected(_) => panic!("round {round}: c{i} won after the pause"),
                Campaign::Waiting { why, .. } => assert_eq!(why, WaitReason::Paused),
                Campaign::Following(h) => assert!(won.is_some(), "{h:?}"),
            }
        }
        if let Some((i, t)) = won {
            cs[i].release(&t, None).await.unwrap();
        }
        op.set_paused(false).await.unwrap();
    }
}

/// The controls watch reports a pause and a switchover request.
pub async fn the_controls_watch_reports_changes(make: &dyn Fn() -> Backend) {
    let (op, c) = (make(), make());
    let w = tokio::spawn({
        let c = c.clone();
        async move { c.watch_controls(&Controls::default()).await }
    });
    sleep(Duration::from_millis(100)).await;
    op.set_paused(true).await.unwrap();
    let now = timeout(Duration::from_secs(2), w).await.unwrap().unwrap();
    assert!(now.as_ref().unwrap().paused, "{now:?}");
    op.request_switchover(Some("b")).await.unwrap();
    let now = timeout(Duration::from_secs(2), c.watch_controls(&paused()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.switchover.as_deref(), Some("b"));
    op.request_switchover(None).await.unwrap();
    assert_eq!(c.controls().await.unwrap(), paused());
}

pub fn paused() -> Controls {
    Controls {
        paused: true,
        switchover: None,
    }
}

/// After `delete` removes the pause marker by hand, a watch from
/// [`paused`] reports the election resumed within `limit` and a campaign
/// wins.
pub async fn a_pause_deleted_by_hand_resumes(
    c: &dyn Whole,
    delete: impl std::future::Future<Output = ()>,
    limit: Duration,
) {
    let seen = paused();
    let w = c.watch_controls(&seen);
    tokio::pin!(w);
    assert!(timeout(Duration::from_millis(100), &mut w).await.is_err());
    delete.await;
    let now = timeout(limit, w).await.unwrap().unwrap();
    assert_eq!(now, Controls::default());
    elect(c, "c").await;
}

fn etcd_maker(etcd: &Etcd, test: &str) -> impl Fn() -> Backend {
    let k = key(test);
    move || backend(etcd, &k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_lists_what_was_published_until_withdrawn_or_lapsed() {
    let etcd = Etcd::start().await;
    registry_lists_until_withdrawn_or_lapsed(&etcd_maker(&etcd, "e-registry")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_watch_resolves_on_join_and_leave() {
    let etcd = Etcd::start().await;
    registry_watch_resolves_on_join_and_leave(&etcd_maker(&etcd, "e-registry-watch")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_to_a_named_successor_goes_to_it_and_the_third_waits() {
    let etcd = Etcd::start().await;
    successor_takes_the_term(&etcd_maker(&etcd, "e-successor"), "etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_names_the_registry_choice_on_etcd() {
    let etcd = Etcd::start().await;
    a_plain_release_names_the_registry_choice(&etcd_maker(&etcd, "e-registry-choice")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_unknown_successor_costs_at_most_the_wait() {
    let etcd = Etcd::start().await;
    let make = etcd_maker(&etcd, "e-successor-dead");
    a_dead_successor_costs_at_most_the_wait(&make, "etcd", WaitReason::SuccessorHeadStart).await;
    let k = key("e-successor-foreign");
    let mut client = etcd.client().await;
    client
        .put(format!("{k}/successor"), "nobody", None)
        .await
        .unwrap();
    a_foreign_successor_costs_at_most_the_wait(
        &*backend(&etcd, &k),
        "etcd",
        WaitReason::SuccessorHeadStart,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_election_starts_no_term_until_resumed() {
    let etcd = Etcd::start().await;
    a_paused_election_starts_no_term(&etcd_maker(&etcd, "e-pause")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_racing_the_pause_never_wins_after_it() {
    let etcd = Etcd::start().await;
    campaigns_racing_the_pause(&etcd_maker(&etcd, "e-pause-race")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controls_watch_reports_pause_switchover_and_a_foreign_resume() {
    let etcd = Etcd::start().await;
    let make = etcd_maker(&etcd, "e-controls");
    the_controls_watch_reports_changes(&make).await;
    let mut client = etcd.client().await;
    let k = key("e-controls");
    let delete = async move {
        client
            .delete(format!("{k}/controls/paused"), None)
            .await
            .unwrap();
    };
    a_pause_deleted_by_hand_resumes(&*make(), delete, Duration::from_secs(2)).await;
}

/// The release mark: a follower that saw the holder takes its released
/// term at its first campaign (the holder's lease may still be revoking),
/// while a key deleted by hand (no mark for that term: the mark names an
/// earlier one) keeps it out until the holder's lease is gone. Safety:
/// never elected while the hand-deleted holder's lease lives; liveness:
/// elected at once after a release, and soon after that lease's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_term_is_taken_at_once_and_a_key_deleted_by_hand_waits_for_its_lease() {
    let etcd = Etcd::start().await;
    let k = key("e-release-mark");
    let (a, b) = (backend(&etcd, &k), backend(&etcd, &k));
    let ta = elect(&*a, "a").await;
    let Campaign::Following(seen_a) = campaign(&*b, "b").await else {
        panic!("b did not follow a");
    };
    a.release(&ta, None).await.expect("a releases");
    let limit = Duration::from_secs(5);
    let tb = match timeout(limit, b.campaign("b", TTL, Some(&seen_a))).await {
        Ok(Ok(Campaign::Elected(t))) => t,
        other => panic!("b not elected at its first campaign after a's release: {other:?}"),
    };
    let Campaign::Following(seen_b) = campaign(&*a, "a").await else {
        panic!("a did not follow b");
    };
    let mut client = etcd.client().await;
    client
        .delete(k.clone(), None)
        .await
        .expect("delete by hand");
    let lease_b = tb.holder.term_id.number().expect("a lease id");
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "a not elected within 8 s of b's key deleted by hand (b's TTL is 2 s)"
        );
        let answer = timeout(limit, a.campaign("a", TTL, Some(&seen_b)))
            .await
            .expect("a campaign hung")
            .expect("a campaign failed");
        match answer {
            Campaign::Elected(_) => break,
            Campaign::Waiting { .. } => sleep(RETRY).await,
            Campaign::Following(h) => panic!("a follows {h:?} on a key deleted by hand"),
        }
    }
    let left = client
        .lease_time_to_live(lease_b, None)
        .await
        .expect("lease time-to-live")
        .ttl();
    assert!(
        left <= 0,
        "a was elected while b's lease still had {left} s"
    );
}
