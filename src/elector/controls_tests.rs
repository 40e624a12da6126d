//! The operator controls on the in-memory backend (paused tokio clock):
//! switchover by the handle and through the backend, pause, freeze. Every
//! step of the clock checks that at most one candidate claims to lead.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, advance};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::backend::WaitReason;
use crate::backend::candidates::Candidate;
use crate::backend::memory::MemoryBackend;
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
    let (elector, rx) = Elector::new(cfg, Arc::new(backend.clone()), None);
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
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "{to} leads within 1 s"
            );
        }
        // The next switchover once every member names the new leader (one
        // leaving the named successor its wait names nobody until its next
        // read), as an operator would: the waits are not woken by a release.
        while ms
            .iter()
            .any(|m| m.rx.borrow().leader.as_deref() != Some(to.as_str()))
        {
            run_for(&ms, Duration::from_millis(5)).await;
            assert!(t0.elapsed() < Duration::from_secs(2), "all name {to}");
        }
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
