//! The precedence table as pure decisions over a registry list.

use std::time::{Duration, SystemTime};

use super::*;
use crate::backend::candidates::{Candidate, Listed};

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
        ttl: Duration::from_secs(36),
        created: None,
        written_ago: None,
    }
}

fn frozen(mut l: Listed, now: SystemTime) -> Listed {
    l.candidate.frozen_until = Some(now + Duration::from_secs(30));
    l
}

fn rules(now: SystemTime) -> Rules<'static> {
    Rules {
        me: "me",
        paused: false,
        pinned: None,
        now,
    }
}

#[test]
fn a_target_must_be_a_live_ready_unfrozen_candidate_that_may_lead() {
    use SwitchoverRefusal as R;
    let now = SystemTime::now();
    let list = [
        listed("me", 1, true, 99),
        listed("ok", 1, true, 1),
        listed("gone", 1, true, 99),
        listed("sick", 1, false, 1),
        listed("zero", 0, true, 1),
        frozen(listed("cold", 1, false, 1), now),
    ];
    let cases = [
        ("ok", Ok(())),
        ("me", Err(R::Itself("me".into()))),
        ("nobody", Err(R::Unknown("nobody".into()))),
        ("gone", Err(R::Lapsed("gone".into()))),
        ("sick", Err(R::NotReady("sick".into()))),
        ("zero", Err(R::NeverLeads("zero".into()))),
    ];
    for (to, want) in cases {
        assert_eq!(
            check_target(&list, ("me", None, false), to, (false, now)),
            want,
            "{to}"
        );
    }
    let cold = check_target(&list, ("me", None, false), "cold", (true, now));
    assert!(
        matches!(&cold, Err(R::Frozen(who, _)) if who == "cold"),
        "a freeze is refused even when forced: {cold:?}"
    );
    assert!(cold.unwrap_err().to_string().contains("frozen until"));
    assert_eq!(
        check_target(&list, ("me", None, true), "ok", (true, now)),
        Err(R::Paused),
        "the pause comes first, even when forced"
    );
}

#[test]
fn a_switchover_that_preemption_would_undo_needs_force() {
    let now = SystemTime::now();
    // The leader (priority 5) is the best ready candidate: its own lapsed
    // record counts.
    let list = [listed("me", 5, true, 999), listed("low", 1, true, 1)];
    let got = check_target(&list, ("me", None, false), "low", (false, now));
    let why = got.clone().unwrap_err().to_string();
    assert!(
        why.contains("priority 1") && why.contains("priority 5"),
        "{why}"
    );
    assert!(why.contains("force=true"), "{why}");
    assert_eq!(
        check_target(&list, ("me", None, false), "low", (true, now)),
        Ok(())
    );
    // A frozen better candidate does not count.
    let list = [
        listed("me", 1, true, 999),
        listed("low", 1, true, 1),
        frozen(listed("high", 9, false, 1), now),
    ];
    assert_eq!(
        check_target(&list, ("me", None, false), "low", (false, now)),
        Ok(())
    );
}

#[test]
fn the_successor_is_the_pinned_member_then_the_best_unfrozen_one() {
    let now = SystemTime::now();
    let list = [
        listed("a", 1, true, 1),
        listed("b", 5, true, 1),
        frozen(listed("c", 9, true, 1), now),
    ];
    let id = |r: &Rules| successor_for(&list, r).map(|c| c.identity.clone());
    assert_eq!(id(&rules(now)).as_deref(), Some("b"), "c is frozen");
    let pinned = Rules {
        pinned: Some("a"),
        ..rules(now)
    };
    assert_eq!(id(&pinned).as_deref(), Some("a"), "the pin first");
    let pinned_frozen = Rules {
        pinned: Some("c"),
        ..rules(now)
    };
    assert_eq!(
        id(&pinned_frozen).as_deref(),
        Some("b"),
        "never a frozen pin"
    );
    let later = rules(now + Duration::from_secs(60));
    assert_eq!(id(&later).as_deref(), Some("c"), "the freeze ended");
}

#[test]
fn pause_and_pin_stop_voluntary_handovers() {
    let now = SystemTime::now();
    let r = rules(now);
    assert!(r.may_hand_over() && r.may_step_down());
    let paused = Rules {
        paused: true,
        ..rules(now)
    };
    assert!(!paused.may_hand_over() && !paused.may_step_down());
    let pinned = Rules {
        pinned: Some("me"),
        ..rules(now)
    };
    assert!(!pinned.may_hand_over() && pinned.may_step_down());
    let other = Rules {
        pinned: Some("x"),
        ..rules(now)
    };
    assert!(other.may_hand_over());
}
