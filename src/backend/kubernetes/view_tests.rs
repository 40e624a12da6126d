//! The Lease rules as event sequences: a table of the sequences the
//! integration tests drive through a real API stand-in (foreign edits, 410
//! and compaction, deletion, release), and random sequences checked
//! against the invariants of the module docs.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{Hold, LeaseView, Standing};
use crate::backend::candidates::SUCCESSOR_WAIT_CAP;
use crate::backend::kubernetes::{RELEASED_ANNOTATION, SUCCESSOR_ANNOTATION, TOKEN_ANNOTATION};

const TTL: Duration = Duration::from_secs(6);

fn lease(holder: &str, rv: u64, token: u64, secs: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("e".into()),
            resource_version: Some(rv.to_string()),
            annotations: Some([(TOKEN_ANNOTATION.to_owned(), token.to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(secs),
            ..LeaseSpec::default()
        }),
    }
}

/// `holder`'s own release of term `was` (holder cleared, 1 s, the mark).
fn released(was: &str, rv: u64, token: u64) -> Lease {
    let mut l = lease("", rv, token, 1);
    let a = l.metadata.annotations.as_mut().unwrap();
    a.insert(RELEASED_ANNOTATION.to_owned(), was.to_owned());
    l
}

fn secs(t0: Instant, s: f64) -> Instant {
    t0 + Duration::from_secs_f64(s)
}

fn follower() -> LeaseView {
    let mut v = LeaseView::default();
    v.campaigning(TTL);
    v
}

/// When `v` lets a candidate take the Lease, at the earliest (`now` when
/// it does already).
fn free_at(v: &LeaseView, now: Instant) -> Instant {
    match v.classify(None, now) {
        Standing::Held { until, .. } | Standing::Pending { until, .. } => until,
        _ => now,
    }
}

fn held_until(v: &LeaseView, now: Instant) -> (Instant, Hold) {
    match v.classify(None, now) {
        Standing::Held { until, how, .. } => (until, how),
        other => panic!("expected a held Lease, got {other:?}"),
    }
}

/// A follower leaves a release's named successor its own `wait` from its
/// first sight; the releaser (it handed that term over) the longest one,
/// [`SUCCESSOR_WAIT_CAP`]: it saw the release before the successor could.
/// A later release of another term is counted as any follower's.
#[test]
fn the_releaser_leaves_its_named_successor_the_longest_head_start() {
    let t0 = Instant::now();
    let short = Duration::from_millis(100);
    let naming = |was: &str, rv: u64| {
        let mut l = released(was, rv, 7);
        let a = l.metadata.annotations.as_mut().unwrap();
        a.insert(SUCCESSOR_ANNOTATION.to_owned(), "b".to_owned());
        l
    };
    let mut v = follower();
    v.observed(&naming("a_1", 2), t0);
    assert_eq!(v.yield_until("c", short), Some(t0 + short));
    assert_eq!(v.yield_until("b", short), None);
    v.handed_over("a_1");
    assert_eq!(v.yield_until("a", short), Some(t0 + SUCCESSOR_WAIT_CAP));
    assert_eq!(v.yield_until("b", short), None);
    let t1 = secs(t0, 5.0);
    v.observed(&naming("c_1", 4), t1);
    assert_eq!(v.yield_until("a", short), Some(t1 + short));
}

#[test]
fn nothing_seen_is_absent_and_a_renewing_holder_is_held_for_its_duration() {
    let t0 = Instant::now();
    let mut v = follower();
    assert_eq!(v.classify(None, t0), Standing::Absent { since: None });
    v.observed(&lease("a_1", 1, 7, 10), t0);
    assert_eq!(held_until(&v, t0), (secs(t0, 10.0), Hold::Renewing));
    assert!(matches!(
        v.classify(None, secs(t0, 10.0)),
        Standing::Free { .. }
    ));
    // A renewal (new version) restarts the silence clock.
    v.observed(&lease("a_1", 2, 7, 10), secs(t0, 4.0));
    assert_eq!(held_until(&v, t0).0, secs(t0, 14.0));
}

#[test]
fn a_duration_below_our_own_is_counted_as_our_own() {
    let t0 = Instant::now();
    let mut v = follower();
    v.observed(&lease("a_1", 1, 7, 1), t0);
    assert_eq!(held_until(&v, t0).0, t0 + TTL);
}

/// `a_duration_edit_of_the_leaders_lease_never_makes_two_leaders`: the
/// leader's Lease is edited to 1 s. Followers never count the term as
/// shorter than its last version promised; the leader's term ends at once,
/// whether its watch delivers the edit or a later read does.
#[test]
fn a_duration_edit_of_the_leaders_lease() {
    let t0 = Instant::now();
    let mut follower = follower();
    follower.observed(&lease("a_1", 1, 7, 6), t0);
    follower.observed(&lease("a_1", 2, 7, 1), secs(t0, 0.3));
    assert_eq!(held_until(&follower, t0).0, secs(t0, 6.3));
    // A follower whose own duration is shorter still waits out the promise.
    let mut short = LeaseView::default();
    short.campaigning(Duration::from_secs(2));
    short.observed(&lease("a_1", 1, 7, 6), t0);
    short.observed(&lease("a_1", 2, 7, 1), secs(t0, 0.3));
    assert_eq!(held_until(&short, t0).0, secs(t0, 6.0));

    for by_watch in [true, false] {
        let mut leader = LeaseView::default();
        leader.campaigning(TTL);
        leader.elected(&lease("a_1", 1, 7, 6), "a_1".into(), TTL, t0);
        assert!(matches!(
            leader.classify(Some("a_1"), t0),
            Standing::Ours { .. }
        ));
        // Our own renewal echoed by the watch changes nothing.
        assert_eq!(
            leader.observed_while_leading(&lease("a_1", 2, 7, 6), t0),
            None
        );
        let edit = lease("a_1", 3, 7, 1);
        let now = secs(t0, 0.5);
        if by_watch {
            assert!(leader.observed_while_leading(&edit, now).is_some());
        } else {
            // The watch was reset: the renewal's read finds the edit.
            leader.observed(&edit, now);
        }
        assert!(
            matches!(
                leader.classify(Some("a_1"), now),
                Standing::Overwritten { .. }
            ),
            "by watch: {by_watch}"
        );
    }
}

#[test]
fn a_foreign_token_or_holder_edit_ends_our_term() {
    let t0 = Instant::now();
    let mut v = follower();
    v.elected(&lease("a_1", 1, 7, 6), "a_1".into(), TTL, t0);
    v.observed(&lease("a_1", 2, 9, 6), t0);
    assert!(matches!(
        v.classify(Some("a_1"), t0),
        Standing::Overwritten { .. }
    ));
    v.observed(&lease("x_1", 3, 7, 6), t0);
    assert!(matches!(v.classify(Some("a_1"), t0), Standing::Held { .. }));
}

#[test]
fn an_empty_holder_is_free_only_with_its_holders_release_mark() {
    let t0 = Instant::now();
    let mut v = follower();
    v.observed(&lease("a_1", 1, 7, 10), t0);
    let t1 = secs(t0, 1.0);
    v.observed(&lease("", 2, 7, 1), t1);
    assert_eq!(held_until(&v, t1), (secs(t0, 10.0), Hold::Cleared));
    // A mark naming another term is not this holder's release.
    v.observed(&released("b_2", 3, 7), t1);
    assert_eq!(held_until(&v, t1).0, secs(t0, 10.0));
    let mut w = follower();
    w.observed(&lease("a_1", 1, 7, 10), t0);
    w.observed(&released("a_1", 2, 7), t1);
    assert!(matches!(w.classify(None, t1), Standing::Free { .. }));
}

/// The 410 and compaction tests: a watch lost and answered by a LIST that
/// shows the same version moves the resume point, never the silence clock;
/// the leader keeps its term.
#[test]
fn a_lost_watch_and_a_relist_never_make_a_held_lease_free_sooner() {
    let t0 = Instant::now();
    let mut v = follower();
    v.observed(&lease("a_1", 5, 7, 6), t0);
    let before = v.watch_from("a_1").unwrap();
    // 410 at 3 s; the LIST at 4 s shows version 5 again, at list version 9.
    v.observed(&lease("a_1", 5, 7, 6), secs(t0, 4.0));
    v.resume_from("9".into());
    let after = v.watch_from("a_1").unwrap();
    assert_eq!(after.deadline, before.deadline);
    assert_eq!(after.deadline, Some(secs(t0, 6.0)));
    assert_eq!(after.rv, "9");

    let mut leader = LeaseView::default();
    leader.elected(&lease("a_1", 5, 7, 6), "a_1".into(), TTL, t0);
    for round in 0..12 {
        let now = secs(t0, f64::from(round));
        leader.observed(&lease("a_1", 5, 7, 6), now);
        leader.resume_from(format!("{}", 10 + round));
        assert!(matches!(
            leader.classify(Some("a_1"), now),
            Standing::Ours { .. }
        ));
        assert!(leader.watch_from("a_1").unwrap().leading);
    }
}

#[test]
fn a_deleted_lease_is_held_until_first_absence_plus_its_duration() {
    let t0 = Instant::now();
    let mut v = follower();
    v.observed(&lease("a_1", 5, 7, 10), t0);
    v.deleted(Some("8"), secs(t0, 3.0));
    // A later absent read does not move the first absence.
    v.deleted(None, secs(t0, 5.0));
    assert_eq!(held_until(&v, t0), (secs(t0, 13.0), Hold::Deleted));
    assert_eq!(v.absent_from().as_deref(), Some("8"));
    let t = secs(t0, 13.0);
    assert_eq!(
        v.classify(None, t),
        Standing::Absent {
            since: Some(secs(t0, 3.0))
        }
    );
    assert!(matches!(
        v.classify(Some("a_1"), t0),
        Standing::Held {
            how: Hold::Deleted,
            ..
        }
    ));
}

#[test]
fn our_pending_create_waits_and_an_unanswered_acquisition_is_free() {
    let t0 = Instant::now();
    let mut v = follower();
    v.sent("me_1");
    let c = v.created(&lease("me_1", 3, 7, 6), "me_1", t0);
    assert_eq!((c.floor, c.whole), (None, TTL));
    assert_eq!(free_at(&v, t0), t0 + TTL);
    v.pending_until("me_1".into(), secs(t0, 2.0), v.last_holder().unwrap());
    assert!(matches!(
        v.classify(None, secs(t0, 1.0)),
        Standing::Pending { .. }
    ));
    assert!(matches!(
        v.classify(None, secs(t0, 2.0)),
        Standing::Free { .. }
    ));
    // Someone else writes: the pending create is gone.
    v.observed(&lease("x_1", 4, 8, 6), secs(t0, 1.0));
    assert!(matches!(
        v.classify(None, secs(t0, 1.0)),
        Standing::Held { .. }
    ));

    let mut w = follower();
    w.sent("me_2");
    w.observed(&lease("me_2", 5, 9, 6), t0);
    assert!(matches!(w.classify(None, t0), Standing::Free { .. }));
    w.answered("me_2");
    assert!(matches!(w.classify(None, t0), Standing::Held { .. }));
}

/// One random event applied to a follower's view.
#[derive(Debug)]
enum Event {
    /// A new version: holder (index), duration, token, release mark
    /// naming the previous holder.
    Write(usize, i32, u64, bool),
    /// The version seen read again (a relist after a lost watch, a poll).
    Reread,
    /// A bookmark or a LIST's version.
    Resume,
    /// Found absent.
    Deleted,
}

const HOLDERS: [&str; 4] = ["a_1", "b_2", "", "c_3"];

fn random_event(rng: &mut StdRng) -> Event {
    match rng.random_range(0..10) {
        0..=5 => Event::Write(
            rng.random_range(0..HOLDERS.len()),
            [1, 3, 6, 10][rng.random_range(0..4)],
            rng.random_range(1..4),
            rng.random_bool(0.5),
        ),
        6 | 7 => Event::Reread,
        8 => Event::Resume,
        _ => Event::Deleted,
    }
}

/// Random event sequences against a follower: the instant the Lease may
/// be taken never moves earlier, except when its holder releases it; a
/// new version is held at least its duration (at least our own) from its
/// sight; an empty holder without the holder's mark is held. And the
/// twin: with no new version, every wait ends.
#[test]
fn random_sequences_keep_the_followers_rules() {
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let mut v = follower();
        let mut now = t0;
        let mut rv = 0u64;
        let mut last: Option<Lease> = None;
        for step in 0..40 {
            now += Duration::from_millis(rng.random_range(0..4000));
            let before = free_at(&v, now);
            let event = random_event(&mut rng);
            let ctx = || format!("seed {seed} step {step}: {event:?}");
            let previous = last.as_ref().map(|l| super::holder_of(l).to_owned());
            let mut release = false;
            match &event {
                Event::Write(h, d, token, mark) => {
                    rv += 1;
                    let holder = HOLDERS[*h];
                    let mut l = lease(holder, rv, *token, *d);
                    if *mark && holder.is_empty() {
                        let was = previous.clone().unwrap_or_default();
                        l = released(&was, rv, *token);
                        release = !was.is_empty();
                    }
                    v.observed(&l, now);
                    let d = Duration::from_secs(*d as u64).max(TTL);
                    if !holder.is_empty() {
                        assert!(free_at(&v, now) >= now + d, "{}", ctx());
                    } else if !release {
                        let how = held_until(&v, now).1;
                        assert_eq!(how, Hold::Cleared, "{}", ctx());
                    }
                    last = Some(l);
                }
                Event::Reread => match (&last, v.lease().is_some()) {
                    (Some(l), true) => {
                        v.observed(l, now);
                        assert_eq!(free_at(&v, now), before, "{}", ctx());
                    }
                    _ => continue,
                },
                Event::Resume => v.resume_from(format!("{}", rv + 100)),
                Event::Deleted => v.deleted(None, now),
            }
            if !release {
                assert!(free_at(&v, now) >= before, "{}", ctx());
            }
        }
        // Liveness: with no new version, the wait ends.
        let later = free_at(&v, now);
        // Never past the longest duration written after the last sight.
        assert!(later <= now + Duration::from_secs(10), "seed {seed}");
        assert!(
            matches!(
                v.classify(None, later),
                Standing::Free { .. } | Standing::Absent { .. }
            ),
            "seed {seed}: {:?}",
            v.classify(None, later)
        );
    }
}

/// Random writes by others to the leader's Lease: any change of the
/// duration, the token or the holder ends the term at once; other writes
/// (a renewal of ours, a label) leave it ours.
#[test]
fn random_writes_by_others_end_the_leaders_term_at_once() {
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let mut v = LeaseView::default();
        v.campaigning(TTL);
        v.elected(&lease("a_1", 1, 7, 6), "a_1".into(), TTL, t0);
        for rv in 2..20u64 {
            let holder = ["a_1", "a_1", "a_1", "b_2", ""][rng.random_range(0..5)];
            let d = [6, 6, 6, 1, 10][rng.random_range(0..5)];
            let token = [7, 7, 7, 8, 1][rng.random_range(0..5)];
            let l = lease(holder, rv, token, d);
            let now = secs(t0, rv as f64 * 0.1);
            if rng.random_bool(0.5) {
                v.observed_while_leading(&l, now);
            } else {
                v.observed(&l, now);
            }
            let got = v.classify(Some("a_1"), now);
            let ctx = format!("seed {seed} rv {rv}: {holder} {d}s token {token}: {got:?}");
            if holder != "a_1" {
                assert!(
                    matches!(got, Standing::Held { .. } | Standing::Free { .. }),
                    "{ctx}"
                );
                break;
            }
            if d != 6 || token != 7 {
                assert!(matches!(got, Standing::Overwritten { .. }), "{ctx}");
                break;
            }
            assert!(matches!(got, Standing::Ours { .. }), "{ctx}");
        }
    }
}

#[test]
fn only_a_new_version_on_the_watch_is_a_renewal_heard() {
    let t0 = Instant::now();
    let mut v = follower();
    v.observed(&lease("a", 1, 1, 6), t0);
    assert_eq!(v.heard_at("a"), None, "a read is not the watch");
    v.watched(&lease("a", 2, 1, 6), secs(t0, 1.0));
    assert_eq!(v.heard_at("a"), Some(secs(t0, 1.0)));
    // The same version again (a reopened watch, a relist, a read): no move.
    v.watched(&lease("a", 2, 1, 6), secs(t0, 2.0));
    v.observed(&lease("a", 2, 1, 6), secs(t0, 2.5));
    assert_eq!(v.heard_at("a"), Some(secs(t0, 1.0)));
    // A newer version first seen by a read does not count either.
    v.observed(&lease("a", 3, 1, 6), secs(t0, 3.0));
    assert_eq!(v.heard_at("a"), Some(secs(t0, 1.0)));
    v.watched(&lease("a", 4, 1, 6), secs(t0, 4.0));
    assert_eq!(v.heard_at("a"), Some(secs(t0, 4.0)));
    // Another holder's term: nothing heard of either.
    v.watched(&lease("b", 5, 2, 6), secs(t0, 5.0));
    assert_eq!(v.heard_at("a"), None);
    assert_eq!(v.heard_at("b"), Some(secs(t0, 5.0)));
}
