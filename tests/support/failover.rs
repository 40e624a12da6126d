//! One failover run of a replicated Redis platform (Cluster's slot primary,
//! Sentinel's primary), written once for `tests/suite/cluster.rs` and
//! `tests/suite/sentinel.rs`: three sidecars under the recorder, the fault
//! recorded and healed, then the judgement. Safety (the recorder's
//! checker): no two leaders at once, fencing tokens that grow from term to
//! term. Liveness twin: a leader again within one lease duration + the
//! platform's failover time + 1 s (the promotion hold-off's second) + one
//! retry period. Each run prints its figures (`--nocapture`).

use std::fmt::Debug;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::recorder::{Expect, Fault, Recorder};
use super::{FAST, Sidecar, assert_token_grew};

/// The lease duration of [`FAST`].
pub const TTL: Duration = Duration::from_secs(2);
/// The retry period of [`FAST`].
pub const RETRY: Duration = Duration::from_millis(500);
/// A failover of a test platform is agreed and done well within this.
pub const FAILOVER_LIMIT: Duration = Duration::from_secs(20);

/// How the primary is made to go away.
#[derive(Clone, Copy, Debug)]
pub enum Fault3 {
    /// The platform's own failover (`CLUSTER FAILOVER` on the replica,
    /// `SENTINEL FAILOVER`): the primary is healthy and demoted.
    Manual,
    /// SIGKILL of the primary.
    Kill,
    /// SIGSTOP of the primary past the platform's failure timeout, then
    /// SIGCONT.
    Stop,
}

/// Three sidecars (a, b, c) of election `name` with `args` (the platform's
/// flags) and [`FAST`] then `extra`, the recorder polling them, and the
/// first leader; `on` names the platform for the panic.
pub async fn three_on(
    name: &str,
    mut args: Vec<String>,
    extra: &[&str],
    on: &str,
) -> (Vec<Sidecar>, Recorder, (usize, u64)) {
    args.extend(FAST.iter().chain(extra).map(|s| s.to_string()));
    let cs: Vec<Sidecar> = ["a", "b", "c"]
        .iter()
        .map(|id| Sidecar::start_raw(name, id, &args))
        .collect();
    let rec = Recorder::new(TTL);
    for s in &cs {
        rec.add(&s.identity, s.port);
    }
    let first = rec
        .wait_leader(Duration::from_secs(15))
        .await
        .unwrap_or_else(|| panic!("no leader on the {on} within 15 s"));
    (cs, rec, first)
}

/// Record `fault` of the primary (`what`: "the primary", "the slot's
/// primary") against leader `l`, and the instant it starts.
pub fn record(rec: &Recorder, fault: Fault3, what: &str, l: usize) -> (usize, Instant) {
    let f = rec.fault(Fault::new(
        &format!("{fault:?} of {what}"),
        Some(l),
        Expect::Other,
        FAILOVER_LIMIT + TTL + Duration::from_secs(2),
    ));
    (f, Instant::now())
}

/// What a failover run saw, for [`judge`].
pub struct Seen<'a, F> {
    /// The platform, as the recording's label and the line start
    /// ("cluster", "sentinel").
    pub platform: &'a str,
    /// The fault.
    pub fault: F,
    /// The first leader and its token.
    pub first: (usize, u64),
    /// When the fault started.
    pub start: Instant,
    /// From `start`: when a new term could be granted (the failover done,
    /// or later when a replica had to connect).
    pub ready: Duration,
    /// How the platform moved, e.g. "slot 5 node 1 -> 4 in 3s (cluster)".
    pub moved: String,
}

/// After the healed fault: wait for a leader again, hold it a lease under
/// the checker, print the figures, and assert safety (no overlap, tokens
/// grow) and liveness (the longest gap within the bound). Stops the
/// sidecars `cs`.
pub async fn judge<F: Debug>(cs: Vec<Sidecar>, rec: &Recorder, seen: Seen<'_, F>) {
    let Seen {
        platform,
        fault,
        first: (l, tok),
        start,
        ready,
        moved,
    } = seen;
    let bound = ready + TTL + Duration::from_secs(1) + RETRY;
    let again = rec
        .wait_leader(bound.saturating_sub(start.elapsed()) + Duration::from_secs(5))
        .await
        .expect("a leader again after the failover");
    let leader_after = start.elapsed();
    // Hold the leader a little longer under the checker.
    sleep(TTL).await;
    let report = rec.check(&format!("{platform}: {fault:?}"));
    eprintln!("{}", report.summary());
    eprintln!(
        "{platform} {fault:?}: {moved}; leader {:?} (token {tok}) -> {:?} (token {}); a leader again {leader_after:?} after the fault; longest time without a leader {:?}",
        cs[l].identity, cs[again.0].identity, again.1, report.longest_gap
    );
    assert!(
        report.overlaps.is_empty(),
        "two leaders at once: {:?}",
        report.overlaps
    );
    assert!(
        report.token_regressions.is_empty(),
        "fencing tokens went back: {:?}",
        report.token_regressions
    );
    if again != (l, tok) {
        assert_token_grew(tok, again.1, "the term after the failover");
    }
    assert!(
        report.longest_gap <= bound,
        "no leader for {:?}, more than one lease + the failover ({moved}) + 1 s + a retry period = {bound:?}",
        report.longest_gap
    );
    drop(cs);
}
