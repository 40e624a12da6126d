//! Failsafe runs: the protocol holds with every rule, each rule's twin is
//! refuted by a counterexample, and the liveness twins (see
//! [`crate::failsafe`]).

use crate::failsafe::{Config, FLive, FailsafeModel, Fault, Rules, SAFE};
use crate::lease::Liveness;
use crate::{fails, holds};

/// Every fault the protocol must survive.
const ALL: &[Fault] = &[
    Fault::Outage,
    Fault::CutBackend,
    Fault::CutPeer,
    Fault::LoseMsg,
    Fault::Lose,
    Fault::LoseAnswer,
    Fault::Crash,
    Fault::Restart,
];

fn model(faults: &'static [Fault], budget: u8) -> FailsafeModel {
    FailsafeModel(Config::base(faults, budget))
}

fn with(rules: Rules, faults: &'static [Fault], budget: u8) -> FailsafeModel {
    let mut m = model(faults, budget);
    m.0.rules = rules;
    m
}

#[test]
fn failsafe_holds_with_two_faults_of_any_kind() {
    let mut m = model(ALL, 2);
    (m.0.candidates, m.0.joining) = (2, 0);
    holds("Failsafe, 2 candidates, two faults of any kind", &m);
}

#[test]
fn failsafe_holds_with_drifting_clocks() {
    let mut m = model(ALL, 1);
    (m.0.candidates, m.0.joining) = (2, 0);
    (m.0.drift, m.0.margin, m.0.ttl, m.0.promise) = (1, 2, 3, 3);
    holds("Failsafe, drifting clocks (margin 2), one fault", &m);
}

#[test]
fn failsafe_holds_a_partial_outage_and_a_newcomer() {
    // The leader cut from the backend while members reach it; C joins.
    holds(
        "Failsafe, 3 candidates (C joins later), one backend link cut",
        &model(&[Fault::CutBackend], 1),
    );
    holds(
        "Failsafe, 3 candidates (C joins later), a crash or a restart",
        &model(&[Fault::Crash, Fault::Restart], 1),
    );
}

#[test]
fn failsafe_off_holds_too() {
    let mut m = model(ALL, 1);
    m.0.failsafe = false;
    holds("Without failsafe, one fault of any kind", &m);
}

/// Larger bounds: `cargo test --test election_model -- --ignored`.
#[test]
#[ignore]
fn failsafe_deeper() {
    holds(
        "Failsafe, 3 candidates (C joins later), one fault of any kind",
        &model(ALL, 1),
    );
}

/// The roster kept in the key (etcd: the value of the key bound to the
/// lease; Redis: the key with `PX`) expires with the term: a candidate
/// that was never admitted finds no roster and campaigns while the leader
/// still claims on its members' promises.
#[test]
fn failsafe_counterexample_a_roster_that_expires_with_the_key() {
    let rules = Rules {
        roster_permanent: false,
        ..SAFE
    };
    let trace = fails(
        "Failsafe, the roster expires with the key",
        &with(rules, &[Fault::CutBackend], 1),
    );
    assert!(trace.has_action("C registers"), "{trace}");
    assert!(trace.has_action("C campaigns"), "{trace}");
    assert!(trace.reason.contains("is_leader=true"), "{trace}");
}

/// The leader counts only the roster the backend acknowledged: a renewal
/// that admitted C was applied but its answer lost, so C is on the roster
/// without the leader heartbeating it; C sees the key expire and campaigns.
#[test]
fn failsafe_counterexample_a_member_admitted_by_a_lost_answer() {
    let rules = Rules {
        required_union: false,
        ..SAFE
    };
    let trace = fails(
        "Failsafe, only the acknowledged roster is required",
        &with(rules, &[Fault::LoseAnswer, Fault::CutBackend], 2),
    );
    assert!(trace.has_action("the answer is lost"), "{trace}");
    assert!(trace.has_action("C campaigns"), "{trace}");
    assert!(trace.reason.contains("is_leader=true"), "{trace}");
}

/// A member that acknowledges a heartbeat while its own campaign is on the
/// wire. The model shows the refusal is implied by the rest: a campaign is
/// sent only when the key is gone and the member's promise has run out, and
/// then the leader's bound from that member has run out too, so the leader
/// has already stepped down for good (late acknowledgements are ignored).
/// The code refuses anyway (defence in depth).
#[test]
fn failsafe_a_promise_given_while_campaigning_is_harmless_to_a_leader_that_stepped_down() {
    let rules = Rules {
        refuse_while_campaigning: false,
        ..SAFE
    };
    let mut m = with(rules, &[Fault::CutBackend, Fault::LoseMsg], 2);
    (m.0.candidates, m.0.joining) = (2, 0);
    holds("Failsafe, members acknowledge while campaigning", &m);
}

/// A member restarted during the outage forgets its promise: without a
/// wait of one promise after a start, it campaigns while the leader still
/// counts that promise.
#[test]
fn failsafe_counterexample_a_restart_forgets_the_promise() {
    let rules = Rules {
        restart_wait: false,
        ..SAFE
    };
    let trace = fails(
        "Failsafe, a restarted member campaigns at once",
        &with(rules, &[Fault::CutBackend, Fault::Restart], 2),
    );
    assert!(trace.has_action("restarts"), "{trace}");
    assert!(trace.reason.contains("is_leader=true"), "{trace}");
}

/// A liveness run: A, B and C registered, every backend link cut from t=3
/// to t=`back`.
fn live(failsafe: bool, back: u8, cut_peer: Option<(u8, u8)>, crash: Option<u8>) -> FailsafeModel {
    let mut m = model(&[], u8::from(crash.is_some()));
    m.0.failsafe = failsafe;
    (m.0.joining, m.0.ttl, m.0.promise) = (0, 3, 3);
    m.0.live = Some(FLive {
        base: Liveness {
            elect_within: if cut_peer.is_some() { 255 } else { 0 },
            failover_within: crash.unwrap_or(255),
            horizon: back + 6,
        },
        outage: (3, back),
        cut_peer,
        crash_from: back + 1,
    });
    m
}

#[test]
fn failsafe_liveness_the_leader_leads_through_a_whole_outage() {
    holds(
        "Failsafe liveness: a leader at every quiet instant, outage t=3..12",
        &live(true, 12, None, None),
    );
    let trace = fails(
        "Without failsafe: the leader steps down during the outage",
        &live(false, 12, None, None),
    );
    assert!(trace.reason.contains("no leader"), "{trace}");
}

#[test]
fn failsafe_liveness_a_member_that_stops_confirming_ends_it_by_the_bound() {
    // The peer link A-B is cut at t=7 in the outage, a tick after a round
    // of heartbeats: A stops claiming when B's last bound (3 from t=6)
    // runs out, and not one tick sooner.
    holds(
        "Failsafe liveness: A steps down within 2 ticks of losing B",
        &live(true, 12, Some((7, 2)), None),
    );
    fails(
        "Failsafe liveness: A steps down within 1 tick of losing B",
        &live(true, 12, Some((7, 1)), None),
    );
}

#[test]
fn failsafe_liveness_failover_after_the_backend_is_back() {
    holds(
        "Failsafe liveness: after the backend is back, failover within the TTL (3)",
        &live(true, 8, None, Some(3)),
    );
    fails(
        "Failsafe liveness: failover within 2",
        &live(true, 8, None, Some(2)),
    );
}
