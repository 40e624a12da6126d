//! What this process knows of the election Lease, as a pure state in the
//! shape of kube-runtime's reflector store: the reads, the watch events and
//! the answers to our own writes are applied to it as events, and
//! [`LeaseView::classify`] says what the Lease means at an instant the
//! caller passes in. No I/O, no clock reads, no locks: the verbs own one
//! view behind one lock and act on its answers.
//!
//! Invariants (README "Writes by others" and "Expiry by silence"):
//! - A follower's silence clock restarts only at a `resourceVersion` it had
//!   not seen, unless that version changed only the operator controls
//!   (`view::controls`: not a write of the holder). Reading a version again (a LIST after a 410, a reopened
//!   watch, a poll) never moves it, so losing the watch never makes a held
//!   Lease look free sooner; it only delays our sight of later changes.
//! - The silence counted is the Lease's `leaseDurationSeconds`, never less
//!   than our own TTL (all candidates of one election run with one
//!   configuration; the version we see may be a hand edit of the one its
//!   holder wrote), and never ends before what an earlier version promised
//!   ([`Seen::carry`]), unless that term's holder released it itself.
//! - A renewal heard ([`LeaseView::heard_at`], which spares a follower its
//!   periodic read) is a `resourceVersion` first delivered by the watch,
//!   at its arrival: the same rule as the silence clock, and a version
//!   first seen by a read does not count (the read itself was the check).
//! - An empty holder is free only with the release mark
//!   ([`RELEASED_ANNOTATION`]) that its holder writes when it releases.
//! - A write we did not make to our own term's duration or fencing token,
//!   or to its holder, ends our term at once ([`Standing::Overwritten`]).
//! - A deleted Lease's last holder may run until the first absent read +
//!   its duration (its last renewal came before the deletion).
//! - Cold start (`--max-clock-skew D`, off by default): on the first
//!   version this process sees at all, whose holder is set and whose
//!   `renewTime` + duration (as above, never less than our TTL) + D had
//!   passed by this machine's wall clock when we read it, the term ended
//!   already: it is free at once instead of after a duration of silence.
//!   Why it is safe: a holder claims only until its send instant +
//!   duration − drift margin on its own monotonic clock, and it writes
//!   `renewTime` from its wall clock after it took that send instant, so
//!   its claim ends no later than `renewTime` + duration on its wall
//!   clock. If our wall clock already reads more than that + D, the claim
//!   ended unless the two wall clocks differ by more than D; and any
//!   renewal the holder sent before that makes a newer version, which our
//!   compare-and-swap on the version read cannot overwrite. It is a
//!   trade: a wall clock off by more than D (or a stepped one) can make
//!   two leaders. A Lease without `renewTime` never counts as expired
//!   early (client-go#448), nor does an empty holder (the release mark
//!   rules it), and every later version counts its silence as before: a
//!   version can be a hand edit, and only the first sight has no earlier
//!   observation to count from.
//!
//! Instants are tokio's monotonic clock. It stops while the host is
//! suspended, which only lengthens a follower's wait (the leader's side of
//! the suspend rule is the Elector's).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::{Holder, RELEASED_ANNOTATION, holder_of, lease_duration_secs, token_of};

/// The silence waited for before any campaign set our TTL (client-go's
/// default lease duration).
const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// How many unanswered acquisitions to remember.
const UNANSWERED_KEPT: usize = 8;

/// What this process last observed of the Lease.
#[derive(Clone, Debug)]
pub(super) struct Seen {
    /// The Lease as read or written (its `resourceVersion` is the CAS version).
    pub(super) lease: Lease,
    /// Instant at which this process first saw this version.
    changed_at: Instant,
    /// The Lease no longer exists (deleted after this version).
    pub(super) deleted: bool,
    /// Instant at which this process first found the Lease gone. The
    /// deleted holder's last renewal happened before the deletion, so its
    /// term ends at most its duration after this instant, even when our
    /// view of its renewals was stale (a broken watch).
    absent_since: Option<Instant>,
    /// The latest end of a term promised by an earlier version we saw (its
    /// sight + its duration), unless that term's holder released it itself
    /// ([`RELEASED_ANNOTATION`]). A write by someone else (a shorter
    /// duration, another holder, a cleared holder) can lengthen a
    /// follower's wait but never shorten it below what the holder was
    /// promised, even when the holder's watch is down.
    carry: Option<Instant>,
    /// On the first version this process saw of the Lease, if it came with
    /// our wall clock: how long before that wall-clock instant its holder
    /// last renewed it (`renewTime`). `None` on any later version.
    renewed_before_sight: Option<Duration>,
}

impl Seen {
    /// When the observed holder's term ends by silence (`None`: free, no
    /// earlier promise). For a deleted Lease the silence counts from when we
    /// found it gone. The duration is the Lease's, never less than `ttl`,
    /// and the end never before [`Seen::carry`]. An empty holder is free
    /// only with the release mark; cleared by anyone else (a hand edit,
    /// client-go's release) it counts as held. With `skew`, a first sight
    /// whose `renewTime` + duration + `skew` had passed ended the term at
    /// that sight (the cold-start rule of the module docs).
    fn silent_until(&self, ttl: Duration, skew: Option<Duration>) -> Option<Instant> {
        if self.ended_before_sight(ttl, skew) {
            return Some(self.changed_at);
        }
        let since = self.absent_since.unwrap_or(self.changed_at);
        let own = since + duration_of(&self.lease, ttl).max(ttl);
        if holder_of(&self.lease).is_empty() && has_release_mark(&self.lease) {
            return self.carry;
        }
        Some(self.carry.map_or(own, |c| c.max(own)))
    }

    /// Whether, by the cold-start rule of the module docs, the holder's term
    /// had ended when we first saw this version: its `renewTime` lay more
    /// than its duration (never less than `ttl`) + `skew` before our wall
    /// clock. Never without `skew`.
    fn ended_before_sight(&self, ttl: Duration, skew: Option<Duration>) -> bool {
        let duration = duration_of(&self.lease, ttl).max(ttl);
        matches!(
            (self.renewed_before_sight, skew),
            (Some(age), Some(skew)) if age > duration + skew
        )
    }
}

/// A Lease this process created whose term it may not claim before
/// `not_before`: between the absence we observed and our create, another
/// term was created (and deleted) that we never saw while it ran, and its
/// holder claims until its last write plus its duration. Its last write was
/// sent before our create was answered, so our create's answer plus that
/// duration is safe. Nobody claims the pending Lease; at `not_before` the
/// next campaign takes it by CAS like any unclaimed Lease.
#[derive(Clone, Debug)]
struct Pending {
    /// Our holder identity written into the Lease.
    holder: String,
    /// The earliest instant at which we may claim it.
    not_before: Instant,
    /// The unseen term that may still run (reported as `Waiting.previous`).
    previous: Holder,
}

/// The term this process holds, as it wrote it.
#[derive(Clone, Debug)]
struct Own {
    /// Our holder identity `<identity>_<term id>`.
    holder: String,
    /// The duration written (whole seconds).
    ttl: Duration,
    /// The fencing token written.
    token: u64,
}

/// How a term we may not take is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Its holder renews it (or did until it fell silent).
    Renewing,
    /// Its holder was cleared by someone other than the holder: the
    /// holder's promise still runs.
    Cleared,
    /// The Lease was deleted by hand while its holder's term may still run.
    Deleted,
}

/// What the Lease means for a candidate at one instant
/// ([`LeaseView::classify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// No Lease, and no term we saw may still run: create it. `since`: when
    /// we first found it gone (`None`: never seen).
    Absent {
        /// First absent read after the last version we saw.
        since: Option<Instant>,
    },
    /// The Lease names the caller's term with the duration and token it
    /// wrote. `until`: our sight of our last write + its duration, the
    /// longest any follower may wait (the leader's own claim ends sooner:
    /// it counts from the send instant, minus the drift margin).
    Ours {
        /// End of the term as followers may count it.
        until: Instant,
    },
    /// The Lease names the caller's term, but someone else changed what it
    /// promises: the term ends at once. `edit` says what changed.
    Overwritten {
        /// The field and its change, for the log.
        edit: String,
    },
    /// Another term (or a cleared or deleted one) may still run: it cannot
    /// be taken before `until`.
    Held {
        /// The term as last seen.
        holder: Holder,
        /// End of its silence, on our clock.
        until: Instant,
        /// How it is held.
        how: Hold,
    },
    /// The Lease exists and no running term holds it (released, silent for
    /// its duration, or an acquisition of ours nobody claims): take it by
    /// CAS.
    Free {
        /// The Lease's last holder.
        previous: Holder,
    },
    /// Free, but the version a campaign would write against is paused
    /// ([`LeaseView::campaign_standing`]): no new term starts.
    Paused {
        /// The Lease's last holder.
        previous: Holder,
    },
    /// Our created Lease, which we may not claim before `until` (a term we
    /// never saw may still run: `previous`).
    Pending {
        /// The unseen term.
        previous: Holder,
        /// The earliest instant we may claim it.
        until: Instant,
    },
}

/// Where a watch of a term resumes and when that term ends by silence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WatchView {
    /// The version to resume from.
    pub(super) rv: String,
    /// When the followed holder's term ends by silence (`None`: never).
    pub(super) deadline: Option<Instant>,
    /// We hold the term being watched.
    pub(super) leading: bool,
    /// RBAC denies `watch`: poll instead.
    pub(super) poll: bool,
}

/// Everything this process knows of the Lease (see the module docs).
#[derive(Debug, Default)]
pub(super) struct LeaseView {
    /// The last version read, written or delivered (and whether it was
    /// deleted since); `None` before the first read.
    seen: Option<Seen>,
    /// Highest fencing token this process has observed or written.
    max_token: u64,
    /// The term we hold, from its acquisition to its release: a write of
    /// our holder that changes its duration or token ends it.
    own: Option<Own>,
    /// Where a reopened watch resumes (a bookmark or a LIST may move it
    /// past `seen`).
    resume_rv: Option<String>,
    /// Our configured TTL (from the last campaign).
    ttl: Option<Duration>,
    /// Where a replay of the Lease's changes since this process last found
    /// it absent starts: the deletion's `resourceVersion` (watch), the
    /// version of our last complete view before a read found it gone, or
    /// the version of a LIST that found it absent. `None` while it exists.
    absent_rv: Option<String>,
    /// A Lease we created but may not claim yet.
    pending: Option<Pending>,
    /// Holder identities of acquisitions we sent whose answers never came
    /// back (the Elector's deadline dropped the call). If the server applied
    /// one, that term was granted but never claimed by anybody, so it may be
    /// replaced at once (by CAS). The last few only.
    unanswered: Vec<String>,
    /// RBAC denies `watch` on leases: follow by polling.
    no_watch: bool,
    /// RBAC denies `list` on leases: no absence point for a fresh process.
    no_list: bool,
    /// `--max-clock-skew`: the most any two candidates' wall clocks (and
    /// the API server's) may differ; `None`: no cold-start rule.
    max_skew: Option<Duration>,
    /// The holder and arrival instant of the last version our watch
    /// delivered that this process had not seen before (a renewal heard).
    watched: Option<(String, Instant)>,
    /// The slowest recent latency of our own requests (decaying).
    slowest: Duration,
    /// The term id of our last release that named a successor: we wrote
    /// that release, so we saw it before anyone (no watch delay of ours),
    /// and our head start for the successor counts the longest wait
    /// (`LeaseView::yield_until`).
    handed_over: Option<String>,
    /// Bumped at every version seen or deletion found, by any path: the
    /// controls follow wakes on it (`KubeLeaseBackend::view`).
    sightings: u64,
}

impl LeaseView {
    /// An empty view whose cold-start rule allows wall clocks to differ by
    /// at most `skew` (`--max-clock-skew`; `None`: the rule is off).
    pub(super) fn with_max_clock_skew(skew: Option<Duration>) -> LeaseView {
        LeaseView {
            max_skew: skew,
            ..LeaseView::default()
        }
    }
}

/// How long before `wall` the holder of `lease` last renewed it, by its
/// `renewTime`: `None` without a holder or a `renewTime`, or when the
/// `renewTime` is not before `wall`. An absent `renewTime` never makes a
/// Lease look old (client-go#448: a Lease written without it is not
/// expired).
fn renewed_before(lease: &Lease, wall: Timestamp) -> Option<Duration> {
    let renewed = lease.spec.as_ref()?.renew_time.as_ref()?.0;
    if holder_of(lease).is_empty() {
        return None;
    }
    Duration::try_from(wall.duration_since(renewed)).ok()
}

/// The Lease's own duration (never our local setting); `fallback` when the
/// field is missing or not positive.
pub(super) fn duration_of(lease: &Lease, fallback: Duration) -> Duration {
    match lease.spec.as_ref().and_then(|s| s.lease_duration_seconds) {
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        _ => fallback,
    }
}

/// How `lease` differs from the duration and fencing token its holder
/// wrote (what followers and fencing rely on), if it does.
fn edit_of(lease: &Lease, ttl: Duration, token: u64) -> Option<String> {
    let duration = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
    let ours = lease_duration_secs(ttl);
    if duration != Some(ours) {
        return Some(format!(
            "leaseDurationSeconds {ours} -> {}",
            duration.map_or("(none)".to_owned(), |d| d.to_string())
        ));
    }
    let seen = token_of(lease);
    (seen != token).then(|| format!("fencing token {token} -> {seen}"))
}

/// Whether `lease` carries a release mark (its holder released it; every
/// acquisition removes the mark).
fn has_release_mark(lease: &Lease) -> bool {
    lease
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(RELEASED_ANNOTATION).is_some_and(|v| !v.is_empty()))
}

/// Whether `lease` is a release of `previous` written by its holder: the
/// holder cleared, with [`RELEASED_ANNOTATION`] naming `previous`.
fn released_by_holder(lease: &Lease, previous: &str) -> bool {
    !previous.is_empty()
        && holder_of(lease).is_empty()
        && lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RELEASED_ANNOTATION))
            .is_some_and(|v| v == previous)
}

mod apply;
mod controls;
mod successor;
pub(super) use apply::Created;
pub(super) use controls::{controls_of, with_note};

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "view_cold_tests.rs"]
mod cold_tests;
