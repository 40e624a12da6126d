//! Shard runs: the handoff holds under every fault, each broken rule makes
//! two owners, and the liveness twins (see [`crate::shards`]).

use crate::explorer::Reach;
use crate::lease::Liveness;
use crate::shards::{Config, Fault, Rule, SSt, ShardModel, claims};
use crate::{fails, holds};

/// Every fault the handoff must survive.
const ALL: &[Fault] = &[
    Fault::Crash,
    Fault::Start,
    Fault::Leave,
    Fault::Lose,
    Fault::LoseAnswer,
];

fn model(rule: Rule, faults: &'static [Fault], budget: u8) -> ShardModel {
    ShardModel(Config {
        faults,
        budget,
        ..Config::base(rule)
    })
}

/// Clocks that drift a tick per interval, margin 2, TTL 3 (a validity of
/// 1 local tick: 1 or 2 real ones).
fn drifting(mut m: ShardModel) -> ShardModel {
    (m.0.drift, m.0.margin, m.0.ttl) = (1, 2, 3);
    m
}

/// One shard in the default runs (two in [`shards_larger_bounds`]: 646k
/// states, about a minute): its owner's session, renewals, pauses and
/// handoffs are the same with more shards; the twins and liveness runs use
/// two and three.
fn one_shard(mut m: ShardModel) -> ShardModel {
    m.0.shards = 1;
    m
}

#[test]
fn shards_never_have_two_owners_under_one_fault() {
    holds(
        "Shards, 2 members, 1 shard, one fault of any kind",
        &one_shard(model(Rule::Safe, ALL, 1)),
    );
}

#[test]
fn shards_never_have_two_owners_with_drifting_clocks() {
    holds(
        "Shards, 2 members, 1 shard, drifting clocks (TTL 3, margin 2)",
        &one_shard(drifting(model(Rule::Safe, &[], 0))),
    );
}

#[test]
fn shards_acquiring_before_the_old_validity_ends_makes_two_owners() {
    let trace = fails(
        "Shards, broken: an acquisition takes a shard bound to another session",
        &model(Rule::TakeOver, &[], 0),
    );
    assert!(trace.reason.contains("own shard"), "{trace}");
    // Releasing before stopping: the store deletes the record, the answer
    // is late (lost here), the old owner still claims when B acquires.
    let trace = fails(
        "Shards, broken: a release sent before its owner stops claiming",
        &model(Rule::ReleaseLate, &[Fault::LoseAnswer], 1),
    );
    assert!(
        trace.has_action("releases shard") && trace.reason.contains("own shard"),
        "{trace}"
    );
}

/// A liveness run: renewals every 2 ticks, every enabled step taken before
/// time passes, `faults` at most `budget`; every shard owned at every quiet
/// instant from t=0, and within `within` ticks of a crash.
fn live(faults: &'static [Fault], budget: u8, within: u8) -> ShardModel {
    let liveness = Some(Liveness {
        elect_within: 0,
        failover_within: within,
        horizon: 12,
    });
    let mut m = model(Rule::Safe, faults, budget);
    m.0.liveness = liveness;
    m
}

#[test]
fn shards_liveness_a_crashed_owners_shards_move_after_the_ttl_and_not_sooner() {
    for drift in [false, true] {
        // TTL 2 (5 with drift, so that a fast clock's renewal, every tick,
        // comes before its validity, 3 local ticks, ends; margin 2): the store forgets
        // the crashed session a TTL after its last renewal; the members'
        // clocks do not matter.
        let ttl = if drift { 5 } else { 2 };
        let run = |within| {
            let mut m = live(&[Fault::Crash], 1, within);
            if drift {
                m = drifting(m);
                m.0.ttl = ttl;
            }
            m
        };
        holds(
            &format!("Shards liveness, drift {drift}: every shard owned within {ttl} of a crash"),
            &run(ttl),
        );
        let trace = fails(
            &format!("Shards liveness, drift {drift}: within {}", ttl - 1),
            &run(ttl - 1),
        );
        assert!(trace.reason.contains("has no owner"), "{trace}");
    }
}

#[test]
fn shards_liveness_joins_and_leaves_leave_no_shard_without_an_owner() {
    let mut m = live(&[Fault::Start, Fault::Leave], 2, 0);
    (m.0.members, m.0.late, m.0.shards) = (3, 1, 3);
    holds(
        "Shards liveness, 3 shards, a join and a leave: every shard owned at every quiet instant",
        &m,
    );
}

#[test]
fn shards_liveness_witness_a_join_moves_a_shard() {
    let mut m = live(&[Fault::Start], 1, 0);
    (m.0.members, m.0.late, m.0.shards) = (3, 1, 3);
    // C joins once every shard is owned: any shard it owns was moved.
    let moved = |s: &SSt| (0..3).any(|i| claims(&s.members[2], i));
    let trace = fails(
        "Shards liveness: a join moves a shard (reachability witness)",
        &Reach(m, moved),
    );
    assert!(
        trace.has_action("a fresh process starts as C") && trace.has_action("releases shard"),
        "{trace}"
    );
}

/// Larger bounds: `cargo test --test election_model shards -- --ignored`
/// (about five minutes in a debug build).
#[test]
#[ignore]
fn shards_larger_bounds() {
    holds(
        "Shards, 2 members, 2 shards, one fault of any kind",
        &model(Rule::Safe, ALL, 1),
    );
    holds(
        "Shards, 2 members, 2 shards, drifting clocks (TTL 3, margin 2)",
        &drifting(model(Rule::Safe, &[], 0)),
    );
    holds(
        "Shards, 2 members, 1 shard, two faults of any kind",
        &one_shard(model(Rule::Safe, ALL, 2)),
    );
}
