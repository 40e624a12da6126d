//! A dead preferred member leaves every choice (issue 46), on the
//! in-memory backend under a paused clock: three members of priority 1 and
//! revision r1, then a preferred one (a newer revision, or a higher
//! priority) that takes over as the table says (the liveness twin) and is
//! killed while it leads (its task aborted: no release, its record stays
//! ready until its TTL of twelve lease durations). Safety: never two
//! leaders. Liveness: the longest time nobody leads is one crash failover
//! (≤ lease + 1.5 s), and the term is handed toward the dead member at
//! most once; restarted, it is preferred again.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, advance};
use tokio_util::sync::CancellationToken;

use crate::backend::memory::MemoryBackend;
use crate::elector::{Elector, ElectorConfig, LeaderState};

const TTL: Duration = Duration::from_secs(3);
const STEP: Duration = Duration::from_millis(10);

struct Member {
    id: String,
    rx: watch::Receiver<LeaderState>,
    task: JoinHandle<()>,
}

fn start(b: &MemoryBackend, id: &str, priority: u32, revision: &str) -> Member {
    let mut cfg = ElectorConfig {
        renew_interval: Duration::from_secs(1),
        retry_period: Duration::from_millis(500),
        ..ElectorConfig::new("e", id, TTL)
    };
    cfg.standing.priority = priority;
    cfg.standing.revision = revision.into();
    cfg.standing.preempt_after = Duration::from_secs(2);
    let (elector, rx) = Elector::connected(cfg, &b.connected(), None);
    let task = tokio::spawn(elector.run(CancellationToken::new()));
    Member {
        id: id.into(),
        rx,
        task,
    }
}

/// Who leads now, with the fencing token of its term.
fn leaders(ms: &[Member]) -> Vec<(String, u64)> {
    let now = Instant::now();
    ms.iter()
        .filter(|m| !m.task.is_finished())
        .filter_map(|m| {
            let s = m.rx.borrow();
            s.is_leader(now)
                .then(|| (m.id.clone(), s.fencing_token.unwrap_or(0)))
        })
        .collect()
}

/// What the election did over a stretch.
#[derive(Default, Debug)]
struct Seen {
    overlaps: u32,
    gap: Duration,
    longest_gap: Duration,
    /// The leader of each new term, in order.
    terms: Vec<String>,
    token: Option<u64>,
}

/// Advance the clock in [`STEP`]s for `d`, or until `until` holds.
async fn run_for(ms: &[Member], d: Duration, seen: &mut Seen, until: impl Fn(&Seen) -> bool) {
    let end = Instant::now() + d;
    while Instant::now() < end && !until(seen) {
        advance(STEP).await;
        tokio::task::yield_now().await;
        let l = leaders(ms);
        seen.overlaps += u32::from(l.len() > 1);
        match l.first() {
            None => {
                seen.gap += STEP;
                seen.longest_gap = seen.longest_gap.max(seen.gap);
            }
            Some((id, token)) => {
                seen.gap = Duration::ZERO;
                if seen.token != Some(*token) {
                    seen.token = Some(*token);
                    seen.terms.push(id.clone());
                }
            }
        }
    }
}

fn leads(id: &'static str) -> impl Fn(&Seen) -> bool {
    move |s| s.gap.is_zero() && s.terms.last().is_some_and(|l| l == id)
}

/// The preferred member `b` (`priority`, `revision`) takes over within
/// `bound`, is killed, and is preferred again once restarted.
async fn a_dead_preferred_member_costs_one_failover(
    priority: u32,
    revision: &str,
    bound: Duration,
) {
    let b = MemoryBackend::new();
    let mut ms: Vec<Member> = ["a0", "a1", "a2"]
        .iter()
        .map(|id| start(&b, id, 1, "r1"))
        .collect();
    let mut seen = Seen::default();
    run_for(&ms, Duration::from_secs(1), &mut seen, |_| false).await;
    let joined = Instant::now();
    ms.push(start(&b, "b", priority, revision));
    run_for(&ms, bound, &mut seen, leads("b")).await;
    assert!(leads("b")(&seen), "the preferred member leads: {seen:?}");
    eprintln!("alive: b took over after {:?}", joined.elapsed());

    ms.pop().unwrap().task.abort();
    let mut after = Seen::default();
    run_for(&ms, 10 * TTL, &mut after, |_| false).await;
    eprintln!("alive: after the kill: {after:?}");
    assert_eq!(seen.overlaps + after.overlaps, 0, "two leaders");
    let one_failover = TTL + Duration::from_millis(1500);
    assert!(after.longest_gap <= one_failover, "{after:?}");
    assert!(!after.terms.is_empty(), "nobody leads after the kill");
    assert!(
        after.terms.len() <= 2,
        "the term went toward the dead member more than once: {after:?}"
    );

    let restarted = Instant::now();
    ms.push(start(&b, "b", priority, revision));
    run_for(&ms, bound, &mut after, leads("b")).await;
    assert!(leads("b")(&after), "restarted, b leads again: {after:?}");
    eprintln!("alive: restarted b leads after {:?}", restarted.elapsed());
    assert_eq!(after.overlaps, 0, "two leaders");
    for m in &ms {
        m.task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_member_of_a_newer_revision_costs_one_failover() {
    a_dead_preferred_member_costs_one_failover(1, "r2", Duration::from_millis(1500)).await;
}

#[tokio::test(start_paused = true)]
async fn a_dead_member_of_a_higher_priority_costs_one_failover() {
    a_dead_preferred_member_costs_one_failover(5, "r1", Duration::from_secs(4)).await;
}
