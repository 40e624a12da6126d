//! A model of the election's safety rule, checked exhaustively (issue 24,
//! item 1).
//!
//! This models the *rule*, not the code: candidates with their own clocks,
//! a backend, a network that delays and loses, and someone else writing to
//! the backend. An explorer of our own ([`explorer`]) visits every state
//! reachable within small bounds (discrete ticks, 2–3 candidates, durations
//! of 3–4 ticks, fault budgets of one or two of each kind) and checks in each
//! one that no two candidates answer `is_leader=true` at once and that every
//! claim carries a fencing token larger than every earlier one. The first
//! violation found is a shortest one and is printed as a trace.
//!
//! - [`lease`] and [`lease_rules`]: the Kubernetes Lease backend, under the
//!   rule on main before issue 24 ([`lease::Rule::Old`]), the fixed rule
//!   ([`lease::Rule::Fixed`]) and a stronger variant
//!   ([`lease::Rule::FixedFloor`]).
//!
//! Each safety test has a twin that must fail (the old rule, or a fault
//! outside what the rule can handle), so the checker is shown able to find
//! what it looks for, and liveness twins (a leader within a bound, a new one
//! within a bound after the leader crashes) show the safe rules are not safe
//! by electing nobody. Every run prints the states explored and its time.
//! What the model covers and what it does not: README.md, "What the election
//! model covers and what it does not".

mod canon;
mod explorer;
mod lease;
mod lease_rules;

use explorer::{Model, Outcome, explore};
use lease::{Config, Fault, Foreign, LeaseModel, Observe, Rule};

/// Enough for every configuration here (the largest explores well under it).
const LIMIT: usize = 3_000_000;

/// Every kind of foreign write.
const ALL_FOREIGN: &[Fault] = &[
    Fault::Foreign(Foreign::Duration),
    Fault::Foreign(Foreign::Holder),
    Fault::Foreign(Foreign::Empty),
    Fault::Foreign(Foreign::Delete),
    Fault::Foreign(Foreign::Touch),
];

/// Explores `model`, prints what was found and how long it took.
fn run<M: Model>(what: &str, model: &M) -> Outcome {
    let start = tokio::time::Instant::now();
    let out = explore(model, LIMIT);
    let verdict = match &out.counterexample {
        Some(_) => "COUNTEREXAMPLE",
        None if out.truncated => "TRUNCATED",
        None => "holds",
    };
    println!(
        "{what}: {verdict}; {} states, {} transitions explored in {:.2?}",
        out.states,
        out.transitions,
        start.elapsed()
    );
    if let Some(trace) = &out.counterexample {
        println!("{trace}");
    }
    out
}

/// Asserts that the invariant holds over the whole bounded state space.
fn holds<M: Model>(what: &str, model: &M) -> Outcome {
    let out = run(what, model);
    assert!(
        out.counterexample.is_none(),
        "{what}: the model found a counterexample (trace above)"
    );
    assert!(
        !out.truncated,
        "{what}: the state limit was reached before the end"
    );
    out
}

/// Asserts that the checker finds a counterexample, and returns it.
fn fails<M: Model>(what: &str, model: &M) -> explorer::Trace {
    let out = run(what, model);
    out.counterexample
        .unwrap_or_else(|| panic!("{what}: the checker found no counterexample"))
}

/// A safety run of the Lease model with `faults`, at most `budget` of them.
fn faulty(rule: Rule, observe: Observe, faults: &'static [Fault], budget: u8) -> Config {
    Config {
        faults,
        budget,
        ..Config::base(rule, observe)
    }
}

#[test]
fn old_lease_rule_lets_a_duration_edit_make_two_leaders() {
    let cfg = faulty(
        Rule::Old,
        Observe::Watch,
        &[Fault::Foreign(Foreign::Duration), Fault::LoseWatch],
        2,
    );
    let trace = fails("Lease, old rule, duration edits", &LeaseModel(cfg));
    assert!(trace.has_action("leaseDurationSeconds set to 1"), "{trace}");
    assert!(trace.reason.contains("is_leader=true"), "{trace}");
}

#[test]
fn fixed_lease_rule_holds_when_followers_see_every_version() {
    let cfg = faulty(Rule::Fixed, Observe::Watch, ALL_FOREIGN, 2);
    holds(
        "Lease, fixed rule, watching followers, every foreign write",
        &LeaseModel(cfg),
    );
}

#[test]
#[ignore]
fn scratch_sizes() {
    use Fault::*;
    use lease::Foreign as F;
    let f = |rule, obs, faults: &'static [Fault], budget, d| {
        LeaseModel(Config {
            duration: d,
            ..faulty(rule, obs, faults, budget)
        })
    };
    run(
        "floor reads d2 all+restart 2",
        &f(
            Rule::FixedFloor,
            Observe::Reads,
            &[
                Foreign(F::Duration),
                Foreign(F::Holder),
                Foreign(F::Empty),
                Foreign(F::Delete),
                Restart,
            ],
            2,
            2,
        ),
    );
}
