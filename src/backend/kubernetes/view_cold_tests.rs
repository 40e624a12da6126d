//! The cold-start rule as event sequences: a Lease whose `renewTime` +
//! duration + the allowed clock skew already lies in the past when this
//! process first sees it is free at once; everything else waits out a
//! duration of silence as before.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;

use super::{Hold, LeaseView, Standing};

const TTL: Duration = Duration::from_secs(6);
const SKEW: Duration = Duration::from_secs(2);

/// `holder`'s Lease at version `rv`, `secs` long, renewed at `renewed`.
fn lease(holder: &str, rv: u64, secs: i32, renewed: Option<Timestamp>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("e".into()),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(secs),
            renew_time: renewed.map(MicroTime),
            ..LeaseSpec::default()
        }),
    }
}

/// A wall-clock instant `s` seconds before `wall`.
fn ago(wall: Timestamp, s: i64) -> Timestamp {
    wall - SignedDuration::from_secs(s)
}

fn view(skew: Option<Duration>) -> LeaseView {
    let mut v = LeaseView::with_max_clock_skew(skew);
    v.campaigning(TTL);
    v
}

fn held_until(v: &LeaseView, now: Instant) -> Option<Instant> {
    match v.classify(None, now) {
        Standing::Held {
            until,
            how: Hold::Renewing,
            ..
        } => Some(until),
        Standing::Free { .. } => None,
        other => panic!("expected a held or free Lease, got {other:?}"),
    }
}

#[test]
fn a_lease_dead_for_an_hour_at_first_sight_is_free_at_once_with_the_skew() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = view(Some(SKEW));
    let dead = lease("dead_x", 1, 15, Some(ago(wall, 3600)));
    let said = v.observed_with_wall(&dead, t0, wall);
    assert_eq!(said, Some(Duration::from_secs(3600)));
    assert_eq!(held_until(&v, t0), None);
    assert_eq!(v.silent_until(), Some(t0));
    // Reading the same version again keeps the verdict (said once).
    let later = t0 + Duration::from_secs(1);
    assert_eq!(v.observed_with_wall(&dead, later, wall), None);
    assert_eq!(held_until(&v, later), None);
}

#[test]
fn without_the_skew_a_dead_lease_waits_a_duration() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = view(None);
    v.observed_with_wall(&lease("dead_x", 1, 15, Some(ago(wall, 3600))), t0, wall);
    assert_eq!(held_until(&v, t0), Some(t0 + Duration::from_secs(15)));
}

#[test]
fn a_lease_without_renew_time_waits_a_duration() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = view(Some(SKEW));
    v.observed_with_wall(&lease("dead_x", 1, 15, None), t0, wall);
    assert_eq!(held_until(&v, t0), Some(t0 + Duration::from_secs(15)));
}

#[test]
fn a_recently_renewed_lease_waits_a_duration() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = view(Some(SKEW));
    // Renewed 1 s ago, and 16 s ago: within duration + skew (15 + 2).
    for age in [1, 16] {
        v.observed_with_wall(&lease("a_1", 1, 15, Some(ago(wall, age))), t0, wall);
        assert_eq!(
            held_until(&v, t0),
            Some(t0 + Duration::from_secs(15)),
            "{age}"
        );
        v = view(Some(SKEW));
    }
    // Just past it: free.
    v.observed_with_wall(&lease("a_1", 1, 15, Some(ago(wall, 18))), t0, wall);
    assert_eq!(held_until(&v, t0), None);
}

#[test]
fn the_duration_counted_is_never_less_than_our_own() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = LeaseView::with_max_clock_skew(Some(SKEW));
    v.campaigning(Duration::from_secs(60));
    // A 1 s Lease renewed 30 s ago: 30 < 60 + 2, so it waits our 60 s.
    v.observed_with_wall(&lease("a_1", 1, 1, Some(ago(wall, 30))), t0, wall);
    assert_eq!(held_until(&v, t0), Some(t0 + Duration::from_secs(60)));
}

#[test]
fn a_later_version_follows_the_silence_rule() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = view(Some(SKEW));
    v.observed_with_wall(&lease("a_1", 1, 15, Some(ago(wall, 5))), t0, wall);
    // A second version whose renewTime is an hour old (a clock an hour
    // behind, or a hand edit): seen after our first sight, so it counts
    // from its sight.
    let later = t0 + Duration::from_secs(3);
    let wall = wall + SignedDuration::from_secs(3);
    v.observed_with_wall(&lease("a_1", 2, 15, Some(ago(wall, 3600))), later, wall);
    assert_eq!(held_until(&v, later), Some(later + Duration::from_secs(15)));
}

#[test]
fn a_first_sight_dead_lease_then_renewed_follows_the_silence_rule() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = view(Some(SKEW));
    v.observed_with_wall(&lease("dead_x", 1, 15, Some(ago(wall, 3600))), t0, wall);
    assert_eq!(held_until(&v, t0), None);
    // Someone took it meanwhile (a new version): a full duration of silence.
    let later = t0 + Duration::from_secs(1);
    v.observed(&lease("b_2", 2, 15, Some(wall)), later);
    assert_eq!(held_until(&v, later), Some(later + Duration::from_secs(15)));
}

#[test]
fn an_empty_holder_is_never_free_early() {
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let mut v = view(Some(SKEW));
    v.observed_with_wall(&lease("", 1, 15, Some(ago(wall, 3600))), t0, wall);
    assert!(matches!(
        v.classify(None, t0),
        Standing::Held {
            how: Hold::Cleared,
            ..
        }
    ));
}
