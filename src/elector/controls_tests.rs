//! The operator controls on the in-memory backend (paused tokio clock):
//! switchover by the handle and through the backend, pause, freeze. Every
//! step of the clock checks that at most one candidate claims to lead.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, advance};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::backend::candidates::Candidate;
use crate::backend::memory::MemoryBackend;
use crate::backend::{CandidateRegistry, ControlStore, WaitReason};
use crate::elector::{Elector, ElectorConfig};

const TTL: Duration = Duration::from_secs(3);

struct Member {
    rx: watch::Receiver<LeaderState>,
    handle: ElectorHandle,
    task: tokio::task::JoinHandle<()>,
    _stop: CancellationToken,
}

fn start(backend: &MemoryBackend, identity: &str) -> Member {
    let cfg = ElectorConfig {
        renew_interval: Duration::from_secs(1),
        retry_period: Duration::from_millis(500),
        ..ElectorConfig::new("e", identity, TTL)
    };
    let (elector, rx) = Elector::connected(cfg, &backend.connected(), None);
    let handle = elector.handle();
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    Member {
        rx,
        handle,
        task,
        _stop: stop,
    }
}

fn leaders(ms: &[Member]) -> Vec<String> {
    let now = Instant::now();
    ms.iter()
        .filter(|m| !m.task.is_finished() && m.rx.borrow().is_leader(now))
        .map(|m| m.rx.borrow().identity.clone())
        .collect()
}

/// Advance the paused clock in 5 ms steps, checking that at most one
/// member claims to lead at every step.
async fn run_for(ms: &[Member], d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        advance(Duration::from_millis(5)).await;
        tokio::task::yield_now().await;
        let l = leaders(ms);
        assert!(l.len() <= 1, "two members claim to lead: {l:?}");
    }
}

fn leader(ms: &[Member]) -> Option<String> {
    leaders(ms).pop()
}

fn index(ms: &[Member], id: &str) -> usize {
    ms.iter()
        .position(|m| m.rx.borrow().identity == id)
        .unwrap()
}

async fn three(b: &MemoryBackend) -> Vec<Member> {
    let ms: Vec<Member> = ["a", "b", "c"].iter().map(|id| start(b, id)).collect();
    run_for(&ms, Duration::from_millis(200)).await;
    assert!(leader(&ms).is_some(), "someone leads");
    ms
}

#[tokio::test(start_paused = true)]
async fn a_switchover_hands_over_to_each_named_follower_in_turn() {
    let b = MemoryBackend::new();
    let ms = three(&b).await;
    let first = leader(&ms).unwrap();
    let others: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|s| s.to_string())
        .filter(|s| *s != first)
        .collect();
    let mut from = first;
    for to in others {
        let h = ms[index(&ms, &from)].handle.switchover(&to, false).await;
        assert_eq!(h.as_ref().map(|h| h.to.as_str()), Ok(to.as_str()));
        let t0 = Instant::now();
        while leader(&ms).as_deref() != Some(to.as_str()) {
            run_for(&ms, Duration::from_millis(5)).await;
            let seen: Vec<_> = ms
                .iter()
                .map(|m| {
                    let s = m.rx.borrow();
                    (
                        s.identity.clone(),
                        s.leader.clone(),
                        s.waiting.map(|w| w.what),
                    )
                })
                .collect();
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "{to} leads within 1 s: {seen:?}"
            );
        }
        // The next switchover at once (issue 34, fifth scenario): no
        // wait for every member to name the new leader.
        from = to;
    }
}

#[tokio::test(start_paused = true)]
async fn a_switchover_to_an_ineligible_member_or_by_a_follower_changes_nothing() {
    let b = MemoryBackend::new();
    let zero = Candidate {
        priority: 0,
        ..Candidate::new("zero")
    };
    b.publish_candidate(&zero, Duration::from_secs(60))
        .await
        .unwrap();
    let ms = three(&b).await;
    let l = leader(&ms).unwrap();
    let token = ms[index(&ms, &l)].rx.borrow().fencing_token;
    let h = &ms[index(&ms, &l)].handle;
    use SwitchoverRefusal as R;
    assert_eq!(
        h.switchover("nobody", false).await,
        Err(R::Unknown("nobody".into()))
    );
    assert_eq!(
        h.switchover("zero", false).await,
        Err(R::NeverLeads("zero".into()))
    );
    assert_eq!(h.switchover(&l, false).await, Err(R::Itself(l.clone())));
    let follower = ms.iter().find(|m| m.rx.borrow().identity != l).unwrap();
    let answer = follower.handle.switchover("zero", false).await;
    assert_eq!(
        answer,
        Err(R::NotLeader {
            leader: Some(l.clone())
        })
    );
    run_for(&ms, Duration::from_secs(2)).await;
    assert_eq!(leader(&ms), Some(l.clone()), "nothing changed");
    assert_eq!(ms[index(&ms, &l)].rx.borrow().fencing_token, token);
}

#[tokio::test(start_paused = true)]
async fn the_leader_acts_on_a_request_in_the_backend_and_clears_it() {
    let b = MemoryBackend::new();
    let ms = three(&b).await;
    let l = leader(&ms).unwrap();
    let to = if l == "a" { "b" } else { "a" };
    b.request_switchover(Some(to)).await.unwrap();
    run_for(&ms, Duration::from_secs(1)).await;
    assert_eq!(
        leader(&ms).as_deref(),
        Some(to),
        "the target leads within 1 s"
    );
    assert_eq!(b.controls().await.unwrap().switchover, None, "cleared");
    // Refused: cleared with a warning, nothing changes.
    b.request_switchover(Some("nobody")).await.unwrap();
    run_for(&ms, Duration::from_secs(1)).await;
    assert_eq!(leader(&ms).as_deref(), Some(to));
    assert_eq!(b.controls().await.unwrap().switchover, None, "cleared");
}

#[tokio::test(start_paused = true)]
async fn while_paused_a_dead_leaders_term_stays_free_until_resume() {
    let b = MemoryBackend::new();
    let ms = three(&b).await;
    let l = leader(&ms).unwrap();
    b.set_paused(true).await.unwrap();
    run_for(&ms, Duration::from_secs(5)).await;
    assert!(
        ms.iter().all(|m| m.rx.borrow().paused),
        "every member shows it"
    );
    assert_eq!(leader(&ms), Some(l.clone()), "the leader keeps renewing");
    ms[index(&ms, &l)].task.abort();
    run_for(&ms, Duration::from_secs(10)).await;
    assert_eq!(leader(&ms), None, "nobody takes the expired term");
    let waiting = ms.iter().filter_map(|m| m.rx.borrow().waiting);
    assert!(waiting.clone().count() == 2 && waiting.clone().all(|w| w.what == WaitReason::Paused));
    // Liveness twin: after resume a member leads within one lease duration.
    b.set_paused(false).await.unwrap();
    run_for(&ms, TTL).await;
    assert!(leader(&ms).is_some(), "a leader after resume");
    let live = ms.iter().filter(|m| !m.task.is_finished());
    assert!(live.clone().count() == 2 && live.clone().all(|m| !m.rx.borrow().paused));
}

#[tokio::test(start_paused = true)]
async fn a_frozen_sole_candidate_stays_out_for_the_freeze_then_leads() {
    let b = MemoryBackend::new();
    let ms = vec![start(&b, "a")];
    run_for(&ms, Duration::from_millis(100)).await;
    assert_eq!(leader(&ms).as_deref(), Some("a"));
    let freeze = Duration::from_secs(60);
    assert!(ms[0].handle.resign(freeze).await, "was leading");
    run_for(&ms, Duration::from_millis(100)).await;
    let w = ms[0].rx.borrow().waiting.expect("the freeze is shown");
    assert_eq!(w.what, WaitReason::Frozen);
    let left = w
        .until
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(left > Duration::from_secs(55), "{left:?}");
    run_for(&ms, freeze - Duration::from_millis(300)).await;
    assert_eq!(leader(&ms), None, "frozen even when alone");
    // Liveness twin: it leads again once the freeze ends.
    run_for(&ms, Duration::from_secs(1)).await;
    assert_eq!(leader(&ms).as_deref(), Some("a"));
    assert!(ms[0].rx.borrow().waiting.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_request_pending_while_nobody_leads_is_acted_on_by_the_next_leader() {
    let b = MemoryBackend::new();
    let ms = three(&b).await;
    let l = leader(&ms).unwrap();
    ms[index(&ms, &l)].task.abort();
    let to = ["a", "b", "c"].into_iter().find(|id| *id != l).unwrap();
    b.request_switchover(Some(to)).await.unwrap();
    // The dead leader's term runs out; whoever leads next hands over to
    // the target (or, being the target, just clears the request).
    run_for(&ms, TTL * 2).await;
    assert_eq!(leader(&ms).as_deref(), Some(to));
    assert_eq!(b.controls().await.unwrap().switchover, None, "cleared");
}

/// A member of priority `priority` running `revision`, preempting after
/// 2 s, with a candidacy gate (its app's health) the test holds.
fn start_standing(
    backend: &MemoryBackend,
    identity: &str,
    (priority, revision): (u32, &str),
) -> (Member, watch::Sender<bool>) {
    let mut cfg = ElectorConfig {
        renew_interval: Duration::from_secs(1),
        retry_period: Duration::from_millis(500),
        health_grace: Duration::from_secs(1),
        ..ElectorConfig::new("e", identity, TTL)
    };
    cfg.standing.priority = priority;
    cfg.standing.revision = revision.into();
    cfg.standing.preempt_after = Duration::from_secs(2);
    let (healthy, gate) = watch::channel(true);
    let (elector, rx) = Elector::connected(cfg, &backend.connected(), None);
    let elector = elector.with_candidacy(gate);
    let handle = elector.handle();
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    let m = Member {
        rx,
        handle,
        task,
        _stop: stop,
    };
    (m, healthy)
}

/// Regression (issue 34, first scenario): a pause, then a candidate of a
/// higher priority and one of a newer revision, then the leader's app
/// turns unhealthy: the same leader leads for the whole pause, with the
/// same term. The liveness twin: after resume the leader hands over.
#[tokio::test(start_paused = true)]
async fn a_pause_keeps_the_leader_through_priority_revision_and_health() {
    let b = MemoryBackend::new();
    let (a, a_health) = start_standing(&b, "a", (1, "r1"));
    let mut ms = vec![a];
    run_for(&ms, Duration::from_millis(300)).await;
    assert_eq!(leader(&ms).as_deref(), Some("a"));
    let token = ms[0].rx.borrow().fencing_token;
    b.set_paused(true).await.unwrap();
    run_for(&ms, Duration::from_millis(100)).await;
    ms.push(start_standing(&b, "high", (9, "r1")).0);
    run_for(&ms, Duration::from_millis(100)).await;
    ms.push(start_standing(&b, "new", (1, "r2")).0);
    a_health.send(false).unwrap();
    run_for(&ms, Duration::from_secs(20)).await;
    assert_eq!(leader(&ms).as_deref(), Some("a"), "the leader stays");
    assert_eq!(ms[0].rx.borrow().fencing_token, token, "the same term");
    // Liveness twin: after resume the table's next rule acts (the app is
    // unhealthy: the leader steps down; a healthy member leads).
    b.set_paused(false).await.unwrap();
    run_for(&ms, TTL * 2).await;
    let l = leader(&ms);
    assert!(matches!(l.as_deref(), Some("high" | "new")), "{l:?}");
}

/// Regression (issue 34, second scenario): a frozen member of a higher
/// priority is not eligible: its record says so, the leader never hands
/// over to it, and a switchover to it is refused naming the freeze. The
/// twin: once the freeze ends, preemption hands over to it.
#[tokio::test(start_paused = true)]
async fn a_frozen_member_is_never_named() {
    let b = MemoryBackend::new();
    let ms = vec![start_standing(&b, "a", (1, "")).0];
    run_for(&ms, Duration::from_millis(300)).await;
    let mut ms = ms;
    ms.push(start_standing(&b, "hi", (5, "")).0);
    run_for(&ms, Duration::from_millis(300)).await;
    let freeze = Duration::from_secs(30);
    assert!(!ms[1].handle.resign(freeze).await, "a follower");
    run_for(&ms, Duration::from_millis(100)).await;
    let rec = b.candidates().await.unwrap();
    let hi = rec.iter().find(|l| l.candidate.identity == "hi").unwrap();
    assert!(!hi.candidate.ready && hi.candidate.frozen_until.is_some());
    let refused = ms[0].handle.switchover("hi", true).await;
    assert!(
        matches!(&refused, Err(SwitchoverRefusal::Frozen(who, _)) if who == "hi"),
        "{refused:?}"
    );
    let token = ms[0].rx.borrow().fencing_token;
    run_for(&ms, Duration::from_secs(20)).await;
    assert_eq!(
        leader(&ms).as_deref(),
        Some("a"),
        "no handover to a frozen member"
    );
    assert_eq!(ms[0].rx.borrow().fencing_token, token, "no new term");
    // Liveness twin: the freeze ends, the record says so at once, and
    // preemption hands over after --preempt-after.
    run_for(&ms, Duration::from_secs(13)).await;
    assert_eq!(leader(&ms).as_deref(), Some("hi"));
}

/// Regression (issue 34, third scenario): a switchover to a lower
/// priority is refused naming the priority; a forced one pins its target,
/// which preemption does not undo; a new switchover ends the pin.
#[tokio::test(start_paused = true)]
async fn a_forced_switchover_is_not_undone_by_preemption() {
    let b = MemoryBackend::new();
    let mut ms = vec![start_standing(&b, "hi", (5, "")).0];
    run_for(&ms, Duration::from_millis(300)).await;
    ms.push(start_standing(&b, "lo", (1, "")).0);
    run_for(&ms, Duration::from_millis(300)).await;
    assert_eq!(leader(&ms).as_deref(), Some("hi"));
    let refused = ms[0].handle.switchover("lo", false).await;
    let why = refused.unwrap_err().to_string();
    assert!(why.contains("priority 1") && why.contains("force"), "{why}");
    ms[0].handle.switchover("lo", true).await.expect("forced");
    run_for(&ms, Duration::from_secs(10)).await;
    assert_eq!(leader(&ms).as_deref(), Some("lo"), "pinned: not undone");
    assert!(
        ms.iter()
            .all(|m| m.rx.borrow().pinned.as_deref() == Some("lo"))
    );
    // Liveness twin: a new switchover ends the pin.
    ms[1].handle.switchover("hi", false).await.expect("back");
    run_for(&ms, Duration::from_secs(1)).await;
    assert_eq!(leader(&ms).as_deref(), Some("hi"));
    run_for(&ms, Duration::from_secs(1)).await;
    assert!(
        ms.iter().all(|m| m.rx.borrow().pinned.is_none()),
        "pin cleared"
    );
}
