//! The pairwise matrix of the operations' precedence table (issue 34,
//! "Done when"), on the in-memory backend under a paused clock: every
//! ordered pair of {pause, freeze, switchover, forced switchover,
//! revision, priority, unhealthy app, SIGTERM, SIGKILL} applied to a running
//! election of three (a, b, c: priority 1, revision r1), with
//!
//! - the overlap checker: at every 10 ms step at most one member claims
//!   to lead (safety);
//! - the liveness twin: after each control has had its bound, the leader
//!   is one the table names, computed by a small model of the table
//!   ([`TableModel`], beside the table in `precedence.rs`); while paused, the leader never changes (only SIGTERM
//!   ends its term, and then nobody leads).
//!
//! One test per row (the first control), nine cells each.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, advance};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::backend::ControlStore;
use crate::backend::memory::MemoryBackend;
use crate::elector::MatrixOp as Op;
use crate::elector::{Elector, ElectorConfig, TableModel};

const TTL: Duration = Duration::from_secs(3);
const STEP: Duration = Duration::from_millis(10);

/// The controls of the matrix, in the table's order.
const OPS: [Op; 9] = Op::ALL;

/// How long the control may take to show its outcome (its bound).
fn bound(op: Op) -> Duration {
    match op {
        // Preemption waits --preempt-after (2 s) from the first list.
        Op::Priority => Duration::from_secs(4),
        // The health grace (1 s), then a handover.
        Op::Unhealthy => Duration::from_millis(2500),
        // One crash failover: the lease, and 1.5 s (issue 46).
        Op::Sigkill => TTL + Duration::from_millis(1500),
        _ => Duration::from_millis(1500),
    }
}

struct Member {
    id: String,
    rx: watch::Receiver<LeaderState>,
    handle: ElectorHandle,
    health: watch::Sender<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(b: &MemoryBackend, id: &str, priority: u32, revision: u32) -> Member {
    let mut cfg = ElectorConfig {
        renew_interval: Duration::from_secs(1),
        retry_period: Duration::from_millis(500),
        health_grace: Duration::from_secs(1),
        ..ElectorConfig::new("e", id, TTL)
    };
    cfg.standing.priority = priority;
    cfg.standing.revision = format!("r{revision}");
    cfg.standing.preempt_after = Duration::from_secs(2);
    let (health, gate) = watch::channel(true);
    let (elector, rx) = Elector::connected(cfg, &b.connected(), None);
    let elector = elector.with_candidacy(gate);
    let handle = elector.handle();
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    Member {
        id: id.into(),
        rx,
        handle,
        health,
        stop,
        task,
    }
}

fn leaders(ms: &[Member]) -> Vec<String> {
    let now = Instant::now();
    ms.iter()
        .filter(|m| !m.task.is_finished() && m.rx.borrow().is_leader(now))
        .map(|m| m.id.clone())
        .collect()
}

fn leader(ms: &[Member]) -> Option<String> {
    leaders(ms).pop()
}

/// What one cell saw: steps, overlaps, the longest time nobody led.
#[derive(Default, Debug)]
struct Seen {
    overlaps: u32,
    leaderless: Duration,
    leaderless_max: Duration,
    /// The leader when the pause was set, while it must hold.
    held: Option<Option<String>>,
}

/// Advance the clock in [`STEP`]s for `d`, checking the overlap and, while
/// a pause holds, that the leader never changes.
async fn run_for(ms: &[Member], d: Duration, seen: &mut Seen, cell: &str) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        advance(STEP).await;
        tokio::task::yield_now().await;
        let l = leaders(ms);
        if l.len() > 1 {
            seen.overlaps += 1;
        }
        if l.is_empty() {
            seen.leaderless += STEP;
            seen.leaderless_max = seen.leaderless_max.max(seen.leaderless);
        } else {
            seen.leaderless = Duration::ZERO;
        }
        if let Some(held) = &seen.held {
            let now = l.first().cloned();
            // A SIGTERM of the leader ends its term; nobody leads then.
            assert!(
                now == *held || now.is_none(),
                "{cell}: the leader changed during the pause: {held:?} -> {now:?}"
            );
            if now.is_none() {
                seen.held = Some(None);
            }
        }
    }
}

struct Cell {
    b: MemoryBackend,
    ms: Vec<Member>,
    model: TableModel,
    seen: Seen,
    name: String,
}

impl Cell {
    async fn new(name: String) -> Cell {
        let b = MemoryBackend::new();
        let mut ms = vec![start(&b, "a", 1, 1)];
        let mut seen = Seen::default();
        run_for(&ms, Duration::from_millis(200), &mut seen, &name).await;
        ms.push(start(&b, "b", 1, 1));
        ms.push(start(&b, "c", 1, 1));
        run_for(&ms, Duration::from_millis(300), &mut seen, &name).await;
        assert_eq!(leader(&ms).as_deref(), Some("a"), "{name}: a leads first");
        let model = TableModel {
            paused: false,
            frozen: BTreeSet::new(),
            pinned: None,
            members: ["a", "b", "c"]
                .map(|id| (id.to_owned(), 1, 1, true))
                .to_vec(),
            leader: BTreeSet::from(["a".to_owned()]),
        };
        Cell {
            b,
            ms,
            model,
            seen,
            name,
        }
    }

    fn member(&self, id: &str) -> &Member {
        self.ms.iter().find(|m| m.id == id).unwrap()
    }

    /// Apply `op` to the election and to the model.
    async fn apply(&mut self, op: Op) {
        let current = leader(&self.ms);
        let m = &mut self.model;
        match op {
            Op::Pause => {
                self.b.set_paused(true).await.unwrap();
                m.paused = true;
                self.seen.held = Some(current);
            }
            Op::Freeze => {
                // A follower: "b" unless it leads.
                let who = if current.as_deref() == Some("b") {
                    "c"
                } else {
                    "b"
                };
                let was = self
                    .member(who)
                    .handle
                    .resign(Duration::from_secs(60))
                    .await;
                assert!(!was, "{}: froze a follower", self.name);
                self.model.frozen.insert(who.to_owned());
            }
            Op::Switchover | Op::Forced => self.switchover(current, op == Op::Forced).await,
            Op::Revision | Op::Priority => {
                let (id, p, r) = if op == Op::Revision {
                    ("rev", 1, 2)
                } else {
                    ("pri", 5, 1)
                };
                self.ms.push(start(&self.b, id, p, r));
                self.model.members.push((id.to_owned(), p, r, true));
            }
            Op::Unhealthy => {
                let Some(l) = current else { return };
                self.member(&l).health.send(false).unwrap();
                self.model.loses(&l, false);
            }
            Op::Sigterm => {
                let Some(l) = current else { return };
                self.member(&l).stop.cancel();
                self.model.loses(&l, true);
            }
            Op::Sigkill => {
                // No release; its record stays ready until its TTL.
                let Some(l) = current else { return };
                self.member(&l).task.abort();
                self.model.loses(&l, true);
            }
        }
        self.model.settle();
    }

    /// A switchover by the leader to "b" (or "c" when "b" leads).
    async fn switchover(&mut self, current: Option<String>, force: bool) {
        let Some(l) = current else { return };
        let to = if l == "b" { "c" } else { "b" };
        let answer = self.member(&l).handle.switchover(to, force).await;
        let refused = self.model.refuses(&l, to, force);
        assert_eq!(
            answer.is_err(),
            refused,
            "{}: switchover to {to} (force {force}): {answer:?}",
            self.name
        );
        if !refused {
            self.model.switched(to, force);
        }
    }

    /// After the control's bound, the leader is one the model names (which
    /// one, among ties, the model learns from the election).
    fn check(&mut self, after: &str) {
        let l = leader(&self.ms);
        assert!(
            self.model.allows(l.as_deref()),
            "{}: after {after}: {l:?} leads, the table names {:?}",
            self.name,
            self.model
        );
        self.model.leader = l.into_iter().collect();
    }
}

/// Run every cell of the row of `first`; the cells' numbers on stderr.
async fn row(first: Op) {
    for second in OPS {
        let name = format!("{first:?} then {second:?}");
        let mut cell = Cell::new(name.clone()).await;
        cell.apply(first).await;
        run_for(&cell.ms, bound(first), &mut cell.seen, &name).await;
        cell.check(&format!("{first:?}"));
        cell.apply(second).await;
        run_for(&cell.ms, bound(second), &mut cell.seen, &name).await;
        cell.check(&format!("{second:?}"));
        assert_eq!(cell.seen.overlaps, 0, "{name}: two leaders");
        eprintln!(
            "matrix: {name}: leader {:?}, overlaps 0, leaderless max {:?}",
            leader(&cell.ms),
            cell.seen.leaderless_max
        );
        for m in &cell.ms {
            m.task.abort();
        }
    }
}

#[tokio::test(start_paused = true)]
async fn matrix_row_pause() {
    row(Op::Pause).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_freeze() {
    row(Op::Freeze).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_switchover() {
    row(Op::Switchover).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_forced_switchover() {
    row(Op::Forced).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_revision() {
    row(Op::Revision).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_priority() {
    row(Op::Priority).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_unhealthy() {
    row(Op::Unhealthy).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_sigterm() {
    row(Op::Sigterm).await;
}

#[tokio::test(start_paused = true)]
async fn matrix_row_sigkill() {
    row(Op::Sigkill).await;
}
