//! The candidate registry: each sidecar publishes a [`Candidate`] record
//! with a TTL while it runs, so that a releasing leader can name its
//! successor ([`choose_successor`]) although followers send nothing at rest.
//!
//! Backends without a registry keep the defaults of
//! [`LeaseBackend`](super::LeaseBackend)'s registry methods (nothing is
//! published, the list is `None`) and hand over as before: the release
//! names nobody and every follower may take the term at once.
//!
//! Invariant: a successor is only a hint written beside a release. Who
//! leads next is still decided by the backend's compare-and-swap and the
//! Elector's safety rule; a wrong, stale or dead successor costs the other
//! candidates at most [`successor_wait`] before they campaign as today.

use std::time::Duration;

/// Priority of a candidate that publishes none (every candidate may lead). 0 means "never lead": never named a successor.
pub const DEFAULT_PRIORITY: u32 = 1;

/// A record's renewal interval, in lease durations of the election: with
/// the default 15 s lease, a renewal every 60 s (one request per follower
/// per minute, 0.017 requests/s).
pub const RENEW_IN_LEASES: u32 = 4;

/// A record's TTL, in lease durations (3 min at the default 15 s): three
/// renewals may fail before the record lapses.
pub const TTL_IN_LEASES: u32 = 12;

/// The shortest wait of a candidate that is not the named successor
/// ([`successor_wait`]): covers the successor's scheduling on a loaded
/// node, where one request's latency says little.
pub const SUCCESSOR_WAIT_FLOOR: Duration = Duration::from_millis(100);

/// The longest wait of a candidate that is not the named successor: a
/// dead or absent successor never costs more than this.
pub const SUCCESSOR_WAIT_CAP: Duration = Duration::from_secs(1);

/// How many request latencies the named successor needs to take the term
/// after the release reached the others: its watch delivers the release,
/// it reads the term and writes its claim (about three one-way trips and
/// two round trips; four round trips leave room for its scheduling).
pub const SUCCESSOR_ROUND_TRIPS: u32 = 4;

/// One candidate of an election as it publishes itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Candidate {
    /// The candidate's identity (the Elector's, a Pod name usually).
    pub identity: String,
    /// Its priority: higher is preferred as successor; 0 never leads.
    pub priority: u32,
    /// The revision it runs (a Pod template hash, say); empty when unknown.
    pub revision: String,
    /// Whether it may lead now (its app is healthy: the candidacy gate).
    pub ready: bool,
}

impl Candidate {
    /// A ready candidate of [`DEFAULT_PRIORITY`] and no revision.
    pub fn new(identity: impl Into<String>) -> Candidate {
        Candidate {
            identity: identity.into(),
            priority: DEFAULT_PRIORITY,
            revision: String::new(),
            ready: true,
        }
    }
}

/// A candidate as the registry lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The record.
    pub candidate: Candidate,
    /// How long ago the record was last written, by the reader's wall
    /// clock (`None` when the backend stores no time).
    pub age: Option<Duration>,
    /// The record's TTL: it lapses this long after its last renewal.
    pub ttl: Duration,
    /// The record's place in the registry's order of creation, in the
    /// backend's own counter (etcd: the key's `create_revision`; a Lease:
    /// its `creationTimestamp` in ms; Redis: the server's `TIME` in ms when
    /// the record was created): larger was created later. `None` when the
    /// backend cannot tell. Decides which revision is the newer.
    pub created: Option<u64>,
}

impl Listed {
    /// Whether the record has not lapsed (a record without an age counts
    /// as alive: the backend expires it itself).
    pub fn alive(&self) -> bool {
        self.age.is_none_or(|age| age < self.ttl)
    }
}

/// The registry's renewal interval and record TTL for an election whose
/// lease lasts `lease_duration` ([`RENEW_IN_LEASES`], [`TTL_IN_LEASES`]).
pub fn timing(lease_duration: Duration) -> (Duration, Duration) {
    (
        lease_duration * RENEW_IN_LEASES,
        lease_duration * TTL_IN_LEASES,
    )
}

/// The successor a leader whose identity is `me` names when it releases:
/// among the records that have not lapsed, are ready, have a priority
/// above 0 and are not `me`, the highest priority; among equals the most
/// recently renewed (the likeliest to be alive), then the smallest
/// identity (a stable order). `None`: nobody, hand over as before.
pub fn choose_successor<'a>(listed: &'a [Listed], me: &str) -> Option<&'a Candidate> {
    listed
        .iter()
        .filter(|l| l.alive() && l.candidate.ready && l.candidate.priority > 0)
        .filter(|l| l.candidate.identity != me)
        .min_by(|a, b| {
            let newer = a.age.unwrap_or_default().cmp(&b.age.unwrap_or_default());
            b.candidate
                .priority
                .cmp(&a.candidate.priority)
                .then(newer)
                .then_with(|| a.candidate.identity.cmp(&b.candidate.identity))
        })
        .map(|l| &l.candidate)
}

/// How long a candidate that is not the named successor gives it before
/// it campaigns on a release, given the slowest recent request latency it
/// measured itself: [`SUCCESSOR_ROUND_TRIPS`] of them, within
/// [`SUCCESSOR_WAIT_FLOOR`] and [`SUCCESSOR_WAIT_CAP`].
pub fn successor_wait(latency: Duration) -> Duration {
    (latency * SUCCESSOR_ROUND_TRIPS).clamp(SUCCESSOR_WAIT_FLOOR, SUCCESSOR_WAIT_CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(id: &str, priority: u32, ready: bool, age_s: u64) -> Listed {
        Listed {
            candidate: Candidate {
                identity: id.into(),
                priority,
                revision: String::new(),
                ready,
            },
            age: Some(Duration::from_secs(age_s)),
            ttl: Duration::from_secs(180),
            created: None,
        }
    }

    #[test]
    fn the_successor_is_the_best_eligible_other_candidate() {
        let cases: &[(&str, Vec<Listed>, Option<&str>)] = &[
            ("empty registry", vec![], None),
            ("only me", vec![listed("me", 5, true, 1)], None),
            (
                "highest priority wins",
                vec![listed("a", 1, true, 1), listed("b", 3, true, 50)],
                Some("b"),
            ),
            (
                "not ready is skipped",
                vec![listed("a", 1, true, 1), listed("b", 3, false, 1)],
                Some("a"),
            ),
            (
                "priority 0 never leads",
                vec![listed("a", 0, true, 1), listed("me", 1, true, 1)],
                None,
            ),
            (
                "a lapsed record is skipped",
                vec![listed("a", 1, true, 200), listed("b", 1, true, 10)],
                Some("b"),
            ),
            (
                "ties: the most recently renewed",
                vec![listed("a", 2, true, 30), listed("b", 2, true, 5)],
                Some("b"),
            ),
            (
                "ties of age: the smallest identity",
                vec![listed("c", 2, true, 5), listed("b", 2, true, 5)],
                Some("b"),
            ),
            (
                "me excluded even when best",
                vec![listed("me", 9, true, 0), listed("z", 1, true, 9)],
                Some("z"),
            ),
        ];
        for (what, list, want) in cases {
            let got = choose_successor(list, "me").map(|c| c.identity.as_str());
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn the_wait_is_floored_and_capped() {
        assert_eq!(successor_wait(Duration::ZERO), SUCCESSOR_WAIT_FLOOR);
        assert_eq!(
            successor_wait(Duration::from_millis(40)),
            Duration::from_millis(160)
        );
        assert_eq!(successor_wait(Duration::from_secs(5)), SUCCESSOR_WAIT_CAP);
    }

    #[test]
    fn the_registry_stays_within_the_follower_budget_at_the_defaults() {
        let (renew, ttl) = timing(Duration::from_secs(15));
        assert_eq!(renew, Duration::from_secs(60));
        assert_eq!(ttl, Duration::from_secs(180));
        assert!(1.0 / renew.as_secs_f64() <= 0.02);
    }
}
