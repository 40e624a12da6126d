//! The candidate registry: each sidecar publishes a [`Candidate`] record
//! with a TTL while it runs, so that a releasing leader can name its
//! successor ([`best_candidate`]) although followers send nothing at rest.
//!
//! A backend keeps it by implementing [`CandidateRegistry`](super::CandidateRegistry),
//! delivered as [`Connected::registry`](super::registry::Connected::registry);
//! without one (`None`) nothing is published and a release names nobody:
//! every follower may take the term at once.
//!
//! Invariant: a successor is only a hint written beside a release. Who
//! leads next is still decided by the backend's compare-and-swap and the
//! Elector's safety rule; a wrong, stale or dead successor costs the other
//! candidates at most [`successor_wait`] before they campaign as today.

use std::time::{Duration, SystemTime};

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
    /// Whether it may lead now (its app is healthy: the candidacy gate,
    /// and it is not frozen).
    pub ready: bool,
    /// Until when it is frozen (`POST /resign?freeze=`): not eligible as
    /// successor, preemption or switchover target before then. `None`:
    /// not frozen. Wall-clock time, shown by `status`.
    #[serde(serialize_with = "rfc3339", skip_serializing_if = "Option::is_none")]
    pub frozen_until: Option<SystemTime>,
    /// The candidate's `--preempt-after`, which counts only while it leads
    /// (an election-wide setting: the leader's value decides). `None`: the
    /// record does not say (written by an older version).
    #[serde(skip)]
    pub preempt_after: Option<Duration>,
}

fn rfc3339<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&humantime::format_rfc3339_seconds(*t).to_string()),
        None => s.serialize_none(),
    }
}

impl Candidate {
    /// A ready candidate of [`DEFAULT_PRIORITY`] and no revision.
    pub fn new(identity: impl Into<String>) -> Candidate {
        Candidate {
            identity: identity.into(),
            priority: DEFAULT_PRIORITY,
            revision: String::new(),
            ready: true,
            frozen_until: None,
            preempt_after: None,
        }
    }

    /// Whether the record says it is frozen at `now`.
    pub fn frozen_at(&self, now: SystemTime) -> bool {
        self.frozen_until.is_some_and(|t| t > now)
    }
}

/// `t` in ms since the Unix epoch (0 before it), as records store a freeze.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The time `ms` ms after the Unix epoch.
pub fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
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
    /// its `creationTimestamp`, whole seconds, refined within the second
    /// by the writer's own ms; Redis: the server's `TIME` in ms when
    /// the record was created): larger was created later. `None` when the
    /// backend cannot tell. Decides which revision is the newer.
    pub created: Option<u64>,
    /// How long ago the record's value was last written, by the reader's
    /// wall clock, where the backend renews a record without rewriting it
    /// and keeps no age (etcd: a timestamp in the record; a renewal by
    /// keep-alive does not move it). Shown by `status` as the record's age
    /// when [`Listed::age`] is `None`; never judged (clocks may differ).
    pub written_ago: Option<Duration>,
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

/// When each revision first appeared in the registry: for each non-empty
/// revision, the smallest [`Listed::created`] among its records that have
/// not lapsed (the record of `me`, the reader itself, counts even when
/// lapsed: a leader does not renew its own record). A revision whose first
/// record was created later is the newer one (a rollback's Pods are new
/// records too, so the revision rolled back to is the newer one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revisions {
    first: std::collections::HashMap<String, u64>,
}

impl Revisions {
    /// The revisions of `listed`, read by the candidate whose identity is `me`.
    pub fn of(listed: &[Listed], me: &str) -> Revisions {
        let mut first = std::collections::HashMap::<String, u64>::new();
        let counted = listed
            .iter()
            .filter(|l| l.alive() || l.candidate.identity == me);
        for l in counted {
            if let (Some(created), false) = (l.created, l.candidate.revision.is_empty()) {
                let e = first.entry(l.candidate.revision.clone()).or_insert(created);
                *e = (*e).min(created);
            }
        }
        Revisions { first }
    }

    /// The creation order of `revision`'s first record; `None` for the
    /// empty revision or one without a known creation (never newer).
    pub fn first_created(&self, revision: &str) -> Option<u64> {
        self.first.get(revision).copied()
    }
}

/// Whether a leader whose identity is `me` may name `l`: not lapsed,
/// ready, not frozen (by the reader's wall clock), a priority above 0, and
/// not `me`.
fn eligible(l: &Listed, me: &str) -> bool {
    eligible_at(l, me, SystemTime::now())
}

fn eligible_at(l: &Listed, me: &str, now: SystemTime) -> bool {
    l.alive()
        && l.candidate.ready
        && !l.candidate.frozen_at(now)
        && l.candidate.priority > 0
        && l.candidate.identity != me
}

/// The order of preference among eligible records: highest priority, then
/// the newest revision ([`Revisions`]), then the most recently renewed (the
/// likeliest to be alive), then the smallest identity (a stable order).
/// `Less` means `a` is preferred.
fn preference(revisions: &Revisions, a: &Listed, b: &Listed) -> std::cmp::Ordering {
    let (ca, cb) = (&a.candidate, &b.candidate);
    let newest = revisions
        .first_created(&cb.revision)
        .cmp(&revisions.first_created(&ca.revision));
    let renewed = a.age.unwrap_or_default().cmp(&b.age.unwrap_or_default());
    cb.priority
        .cmp(&ca.priority)
        .then(newest)
        .then(renewed)
        .then_with(|| ca.identity.cmp(&cb.identity))
}

/// The registry's best candidate for a leader whose identity is `me`, at
/// wall-clock `now`: among the records that have not lapsed, are ready,
/// are not frozen, have a priority above 0 and are not `me`, the highest
/// priority; among equals the newest revision ([`Revisions`]), then the
/// most recently renewed, then the smallest identity. `None`: nobody. The
/// Elector's `successor_for` applies the precedence table over it.
pub fn best_candidate<'a>(
    listed: &'a [Listed],
    me: &str,
    now: SystemTime,
) -> Option<&'a Candidate> {
    let revisions = Revisions::of(listed, me);
    listed
        .iter()
        .filter(|l| eligible_at(l, me, now))
        .min_by(|a, b| preference(&revisions, a, b))
        .map(|l| &l.candidate)
}

/// The best eligible candidate (as [`best_candidate`] orders them) that
/// runs a newer revision than the leader `me` (priority `priority`,
/// revision `revision`, whose first record was created at `mine` as the
/// leader remembers it, if at all) and whose priority is at least the
/// leader's. `None` when there is none, or when the leader's revision is
/// not empty but its creation is unknown (it cannot tell newer from older).
pub fn newer_revision<'a>(
    listed: &'a [Listed],
    me: &str,
    (priority, revision): (u32, &str),
    mine: Option<u64>,
) -> Option<&'a Candidate> {
    let revisions = Revisions::of(listed, me);
    let own = match (revisions.first_created(revision), mine) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if own.is_none() && !revision.is_empty() {
        return None;
    }
    listed
        .iter()
        .filter(|l| eligible(l, me))
        .filter(|l| l.candidate.priority >= priority && l.candidate.revision != revision)
        .filter(|l| revisions.first_created(&l.candidate.revision) > own)
        .min_by(|a, b| preference(&revisions, a, b))
        .map(|l| &l.candidate)
}

/// The eligible candidates (see [`best_candidate`]) whose priority is
/// above `priority`, best first.
pub fn higher_priority<'a>(listed: &'a [Listed], me: &str, priority: u32) -> Vec<&'a Candidate> {
    let revisions = Revisions::of(listed, me);
    let mut higher: Vec<&Listed> = listed
        .iter()
        .filter(|l| eligible(l, me))
        .filter(|l| l.candidate.priority > priority)
        .collect();
    higher.sort_by(|a, b| preference(&revisions, a, b));
    higher.into_iter().map(|l| &l.candidate).collect()
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
                frozen_until: None,
                preempt_after: None,
            },
            age: Some(Duration::from_secs(age_s)),
            ttl: Duration::from_secs(180),
            created: None,
            written_ago: None,
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
            let got = best_candidate(list, "me", SystemTime::now()).map(|c| c.identity.as_str());
            assert_eq!(got, *want, "{what}");
        }
    }

    /// A ready record of `id` at priority 1 running `revision`, created
    /// at `created`, renewed `age_s` seconds ago.
    fn of_revision(id: &str, revision: &str, created: u64, age_s: u64) -> Listed {
        let mut l = listed(id, 1, true, age_s);
        l.candidate.revision = revision.into();
        l.created = Some(created);
        l
    }

    #[test]
    fn the_newest_revision_comes_after_priority_and_before_renewal() {
        let cases: &[(&str, Vec<Listed>, Option<&str>)] = &[
            (
                "the revision first seen later wins over a fresher renewal",
                vec![
                    of_revision("old", "a", 10, 1),
                    of_revision("new", "b", 20, 50),
                ],
                Some("new"),
            ),
            (
                "a revision's first record decides, not its latest",
                vec![
                    of_revision("a1", "a", 10, 9),
                    of_revision("a2", "a", 30, 9),
                    of_revision("b1", "b", 20, 9),
                ],
                Some("b1"),
            ),
            (
                "the empty revision is never newer",
                vec![of_revision("x", "", 99, 1), of_revision("a", "a", 10, 9)],
                Some("a"),
            ),
            (
                "priority first",
                vec![
                    {
                        let mut l = of_revision("old", "a", 10, 9);
                        l.candidate.priority = 2;
                        l
                    },
                    of_revision("new", "b", 20, 9),
                ],
                Some("old"),
            ),
            (
                "the leader's lapsed record still dates its revision",
                vec![
                    {
                        let mut l = of_revision("me", "b", 5, 999);
                        l.candidate.ready = false;
                        l
                    },
                    of_revision("a", "a", 10, 9),
                    of_revision("b", "b", 20, 9),
                ],
                Some("a"),
            ),
        ];
        for (what, list, want) in cases {
            let got = best_candidate(list, "me", SystemTime::now()).map(|c| c.identity.as_str());
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn a_newer_revision_is_named_only_when_the_leaders_own_is_dated() {
        let list = vec![
            of_revision("me", "a", 10, 500),
            of_revision("old", "a", 12, 1),
            of_revision("new", "b", 20, 1),
        ];
        let got = |l: &[Listed], own: (u32, &str), mine| {
            newer_revision(l, "me", own, mine).map(|c| c.identity.clone())
        };
        assert_eq!(got(&list, (1, "a"), None), Some("new".into()));
        assert_eq!(got(&list, (1, "b"), None), None, "already the newest");
        assert_eq!(got(&list, (2, "a"), None), None, "lower priority");
        let no_me = &list[1..];
        assert_eq!(got(no_me, (1, "c"), None), None, "own revision undated");
        assert_eq!(got(no_me, (1, "c"), Some(5)), Some("new".into()));
        assert_eq!(
            got(no_me, (1, "b"), Some(5)),
            Some("old".into()),
            "remembered"
        );
        assert_eq!(
            got(no_me, (1, ""), None),
            Some("new".into()),
            "from no revision"
        );
        let unrevised = vec![listed("x", 1, true, 1)];
        assert_eq!(got(&unrevised, (1, ""), None), None, "feature off");
    }

    #[test]
    fn higher_priorities_are_listed_best_first() {
        let list = vec![
            listed("a", 5, true, 1),
            listed("b", 9, true, 1),
            listed("c", 9, false, 1),
            listed("d", 1, true, 1),
        ];
        let ids: Vec<_> = higher_priority(&list, "me", 1)
            .iter()
            .map(|c| c.identity.as_str())
            .collect();
        assert_eq!(ids, ["b", "a"]);
        assert!(higher_priority(&list, "me", 9).is_empty());
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
