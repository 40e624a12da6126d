//! The pairwise matrix of the operations' precedence table (issue 34,
//! "Done when") on the real backends: etcd, Redis (one server), Redlock
//! (three servers) and the Kubernetes stand-in. Ordered pairs of {pause,
//! freeze, switchover, forced switchover, revision, priority, unhealthy
//! app, SIGTERM, SIGKILL} are applied to a running election of three sidecar
//! processes (a, b, c: priority 1, revision r1, `--preempt-after 2s`), each
//! cell a new election on the backend's one server, with
//!
//! - the overlap checker ([`Recorder`], 0 overlaps) and, at every poll,
//!   at most one sidecar claiming by its `/leader`;
//! - the liveness twin: once the registry (`status -o json`) shows the
//!   control, the leader the table names (a small model of it,
//!   `leader_elector::elector::TableModel`, which the in-memory matrix in
//!   `src/elector/matrix_tests.rs` uses too) is there within the
//!   control's bound; from a pause on, the leader never changes (a SIGTERM
//!   of it leaves nobody).
//!
//! The normal run: one cell per row per backend, the second control
//! shifted by a different amount on each backend so that every column is
//! hit, plus "pause, priority, revision" (the leader stays for the whole
//! pause). `LE_FULL_MATRIX=1`: all 81 cells per backend. Each cell prints
//! its backend, overlaps, longest leaderless time and time to the named
//! leader per control. `LE_MATRIX_CELL="Pause then Sigterm"` runs only the
//! cells so named; `LE_MATRIX_DUMP=<dir>` keeps the members' logs of a
//! failing cell there.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::ops_controls::Fixture;
use crate::support::recorder::Recorder;
use crate::support::*;
use leader_elector::elector::MatrixOp as Op;
use leader_elector::elector::TableModel;

/// The lease duration of [`FAST`].
const TTL: Duration = Duration::from_secs(2);

/// A generous bound for waits that only keep a broken test from hanging.
const LIMIT: Duration = Duration::from_secs(30);

/// The controls of the matrix, in the table's order.
const OPS: [Op; 9] = Op::ALL;

/// From the instant the registry shows the control: how long the
/// named leader may take, and how long a kept leader must hold.
fn bound(op: Op) -> Duration {
    match op {
        // --preempt-after (2 s) from the leader's first list, a handover.
        Op::Priority => Duration::from_millis(4500),
        // Health checks every 200 ms, a grace of 1 s, a handover.
        Op::Unhealthy | Op::Sigterm => Duration::from_secs(3),
        // One crash failover (the lease and 1.5 s: issue 46), and a poll.
        Op::Sigkill => TTL + Duration::from_secs(2),
        _ => Duration::from_secs(2),
    }
}

/// Cells known to disagree with the table on a backend: (backend, cell
/// name). Each one is a product bug, reported; the cell is skipped.
const KNOWN: &[(&str, &str)] = &[];

/// A candidate health endpoint answering the status it is set to.
struct Hook {
    port: u16,
    status: Arc<AtomicU16>,
    task: JoinHandle<()>,
}

impl Hook {
    async fn start() -> Hook {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let status = Arc::new(AtomicU16::new(200));
        let st = status.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let code = st.load(Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let _ = sock.read(&mut buf).await;
                    let head = format!(
                        "HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                });
            }
        });
        Hook { port, status, task }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.port)
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One cell: a fresh election of three on the backend's server.
struct Cell {
    fx: Arc<Fixture>,
    election: String,
    name: String,
    cs: Vec<Sidecar>,
    hooks: Vec<Hook>,
    rec: Recorder,
    model: TableModel,
    /// From a pause on: the leader it holds (`None` after its SIGTERM).
    held: Option<Option<String>>,
    nobody_since: Option<Instant>,
    leaderless_max: Duration,
    /// Time from each control to its named leader (there for good).
    took: Vec<Duration>,
    joined: u32,
}

impl Cell {
    async fn new(fx: Arc<Fixture>, election: String, name: String) -> Cell {
        let rec = Recorder::new(TTL);
        let model = TableModel {
            paused: false,
            frozen: BTreeSet::new(),
            pinned: None,
            members: vec![],
            leader: BTreeSet::from(["a".to_owned()]),
        };
        let mut cell = Cell {
            fx,
            election,
            name,
            cs: vec![],
            hooks: vec![],
            rec,
            model,
            held: None,
            nobody_since: None,
            leaderless_max: Duration::ZERO,
            took: vec![],
            joined: 0,
        };
        cell.join("a", 1, 1).await;
        one_leader(&cell.cs, LIMIT).await;
        cell.join("b", 1, 1).await;
        cell.join("c", 1, 1).await;
        let start = Instant::now();
        while !cell.settled(Some("a")).await {
            assert!(
                start.elapsed() < LIMIT,
                "{}: b and c never listed",
                cell.name
            );
            sleep(Duration::from_millis(200)).await;
        }
        cell.all_know("a").await;
        cell
    }

    /// Start member `id` (its own health endpoint, answering 200).
    async fn join(&mut self, id: &str, priority: u32, revision: u32) {
        let hook = Hook::start().await;
        let (url, p, r) = (hook.url(), priority.to_string(), format!("r{revision}"));
        let extra = [
            "--priority",
            &p,
            "--revision",
            &r,
            "--preempt-after",
            "2s",
            "--candidate-health-url",
            &url,
            "--health-interval",
            "200ms",
            "--health-grace",
            "1s",
        ];
        let s = self.fx.sidecar(&self.election, id, &extra);
        self.rec.add(id, s.port);
        self.cs.push(s);
        self.hooks.push(hook);
        self.model
            .members
            .push((id.to_owned(), priority, revision, true));
    }

    fn index(&self, id: &str) -> usize {
        self.cs.iter().position(|s| s.identity == id).unwrap()
    }

    /// POST `path` on the control API of member `id`.
    async fn post(&self, id: &str, path: &str) -> (u16, Value) {
        let port = self.cs[self.index(id)].control();
        http_json(port, "POST", path, None, LIMIT)
            .await
            .expect("the control API answers")
    }

    /// Who leads by one poll of every `/leader`; checks the overlap, the
    /// pause's hold and counts the leaderless time.
    async fn poll(&mut self) -> Option<String> {
        let l = leaders(&self.cs).await;
        assert!(
            l.len() <= 1,
            "{}: two sidecars lead at once: {l:?}",
            self.name
        );
        let now = l.first().map(|&i| self.cs[i].identity.clone());
        match (&now, self.nobody_since) {
            (None, None) => self.nobody_since = Some(Instant::now()),
            (Some(_), Some(t)) => {
                self.leaderless_max = self.leaderless_max.max(t.elapsed());
                self.nobody_since = None;
            }
            _ => {}
        }
        if let Some(held) = &self.held {
            assert!(
                now.is_none() || now == *held,
                "{}: the leader changed during the pause: {held:?} -> {now:?}",
                self.name
            );
        }
        now
    }

    /// Whether the registry (`status -o json`) shows every member but the
    /// leader as the model has it, and every live member the pause.
    async fn settled(&self, leader: Option<&str>) -> bool {
        let (fx, el) = (self.fx.clone(), self.election.clone());
        // Its exit code says who leads (3: nobody, as after a paused SIGTERM).
        let (_, out, _) = block(|| fx.command("status", &el, &["-o", "json"]));
        let v: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
        let rows = v["candidates"].as_array().cloned().unwrap_or_default();
        let listed = |id: &str, ready: bool| {
            rows.iter()
                .any(|r| r["identity"] == id && r["ready"] == ready)
        };
        let m = &self.model;
        let registry = m
            .members
            .iter()
            .filter(|x| Some(x.0.as_str()) != leader)
            .all(|x| listed(&x.0, x.3 && !m.frozen.contains(&x.0)));
        if !registry {
            return false;
        }
        for x in m.members.iter().filter(|_| m.paused) {
            let body = self.cs[self.index(&x.0)].leader().await;
            if body.is_none_or(|(_, b)| b["paused"] != Value::Bool(true)) {
                return false;
            }
        }
        true
    }

    /// Before a failing assertion, with `LE_MATRIX_DUMP=<dir>`: each
    /// member's log (debug level) to `<dir>/mx-<identity>.log`, since the
    /// logs go with the cell's temporary directories.
    fn dump(&self) {
        let Ok(dir) = std::env::var("LE_MATRIX_DUMP") else {
            return;
        };
        for c in &self.cs {
            let path = std::path::Path::new(&dir).join(format!("mx-{}.log", c.identity));
            let _ = std::fs::write(path, c.log());
        }
    }

    /// Wait until every live member's `/leader` names `l`.
    async fn all_know(&self, l: &str) {
        let start = Instant::now();
        loop {
            let mut known = true;
            for x in &self.model.members {
                let body = self.cs[self.index(&x.0)].leader().await;
                known &= body.is_some_and(|(_, b)| b["leader"] == l);
            }
            if known {
                return;
            }
            assert!(start.elapsed() < LIMIT, "{}: not all name {l}", self.name);
            sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Cell {
    /// Apply `op` to the election and to the model.
    async fn apply(&mut self, op: Op) {
        let current = self.model.the_leader();
        match op {
            Op::Pause => {
                let (fx, el) = (self.fx.clone(), self.election.clone());
                let (code, out, err) = block(|| fx.command("pause", &el, &[]));
                assert_eq!(code, 0, "{}: pause: {out}{err}", self.name);
                self.model.paused = true;
                self.held = Some(current);
            }
            Op::Freeze => self.freeze(current).await,
            Op::Switchover | Op::Forced => self.switchover(current, op == Op::Forced).await,
            Op::Revision | Op::Priority => {
                self.joined += 1;
                let newest = self.model.members.iter().map(|m| m.2).max().unwrap_or(1);
                let (id, p, r) = if op == Op::Revision {
                    (format!("rev{}", self.joined), 1, newest + 1)
                } else {
                    (format!("pri{}", self.joined), 4 + self.joined, 1)
                };
                self.join(&id, p, r).await;
            }
            Op::Unhealthy => {
                let Some(l) = current else { return };
                self.hooks[self.index(&l)]
                    .status
                    .store(503, Ordering::Relaxed);
                self.model.loses(&l, false);
            }
            Op::Sigterm | Op::Sigkill => {
                let Some(l) = current else { return };
                let i = self.index(&l);
                let kill = op == Op::Sigkill;
                self.cs[i].signal(if kill {
                    Signal::SIGKILL
                } else {
                    Signal::SIGTERM
                });
                // A SIGTERM: it leads until it has released (a graceful
                // stop); a SIGKILL: its term ends by its lease alone.
                let exited = self.cs[i].wait_exit(LIMIT).await;
                assert!(exited.is_some(), "{}: {l} did not stop", self.name);
                self.model.loses(&l, true);
                if self.model.paused {
                    self.held = Some(None);
                }
            }
        }
        self.model.settle();
    }

    /// Freeze a follower for 60 s: b, else c (not the leader, not frozen).
    async fn freeze(&mut self, current: Option<String>) {
        let who = ["b", "c"].into_iter().find(|w| {
            current.as_deref() != Some(*w)
                && !self.model.frozen.contains(*w)
                && self.model.of(w).is_some()
        });
        let Some(who) = who else { return };
        let (status, body) = self.post(who, "/resign?freeze=60s").await;
        assert_eq!(status, 200, "{}: freeze {who}: {body}", self.name);
        assert_eq!(
            body["resigned"],
            Value::Bool(false),
            "{}: {body}",
            self.name
        );
        self.model.frozen.insert(who.to_owned());
    }

    /// A switchover by the leader to b (c when b leads): refused or done
    /// as the table says.
    async fn switchover(&mut self, current: Option<String>, force: bool) {
        let Some(l) = current else { return };
        let to = if l == "b" { "c" } else { "b" };
        let path = format!("/switchover?to={to}&force={force}");
        let (status, body) = self.post(&l, &path).await;
        let refused = self.model.refuses(&l, to, force);
        if (status != 200) != refused {
            self.dump();
        }
        assert_eq!(
            status != 200,
            refused,
            "{}: switchover to {to} (force {force}): {status} {body}",
            self.name
        );
        if !refused {
            self.model.switched(to, force);
        }
    }

    /// After `op` (applied at `from`): wait until the registry shows it,
    /// then until the named leader is there for good (a change) or for the
    /// control's bound (a leader kept, or nobody); the model then learns
    /// which leader among ties.
    async fn watch(&mut self, op: Op, from: Instant, before: Option<String>, last: bool) {
        let change = !self.model.leader.is_empty()
            && self.model.leader != before.clone().into_iter().collect();
        let stable = Duration::from_millis(if last { 1000 } else { 300 });
        let (mut settled_at, mut named_since, mut asked) = (None, None, from);
        let mut now;
        loop {
            now = self.poll().await;
            let named = self.model.allows(now.as_deref());
            named_since = if named {
                named_since.or(Some(Instant::now()))
            } else {
                None
            };
            if settled_at.is_none() && asked.elapsed() > Duration::from_millis(200) {
                asked = Instant::now();
                if self.settled(now.as_deref()).await {
                    settled_at = Some(Instant::now());
                }
            }
            match settled_at {
                Some(t) if t.elapsed() > bound(op) => break,
                Some(_) if change && named_since.is_some_and(|s| s.elapsed() > stable) => break,
                Some(_) => {}
                None => assert!(
                    from.elapsed() < LIMIT,
                    "{}: after {op:?} the registry never showed {:?}",
                    self.name,
                    self.model
                ),
            }
            sleep(Duration::from_millis(10)).await;
        }
        if named_since.is_none() {
            self.dump();
        }
        assert!(
            named_since.is_some(),
            "{}: after {op:?}: {now:?} leads, the table names {:?}",
            self.name,
            self.model
        );
        self.took
            .push(named_since.unwrap().saturating_duration_since(from));
        self.model.leader = now.clone().into_iter().collect();
        if let Some(l) = now {
            self.all_know(&l).await;
        }
    }
}

/// The cell's name: its controls in order.
fn cell_name(ops: &[Op]) -> String {
    let names: Vec<String> = ops.iter().map(|o| format!("{o:?}")).collect();
    names.join(" then ")
}

/// Run one cell; its line of numbers.
async fn run_cell(fx: Arc<Fixture>, backend: &'static str, ops: Vec<Op>) -> String {
    let name = cell_name(&ops);
    let code: String = ops
        .iter()
        .map(|o| OPS.iter().position(|x| x == o).unwrap().to_string())
        .collect();
    let el = election(&format!("mx-{}-{code}", &backend[..2]));
    let mut cell = Cell::new(fx, el, format!("{backend}: {name}")).await;
    for (i, &op) in ops.iter().enumerate() {
        let from = Instant::now();
        let before = cell.model.the_leader();
        cell.apply(op).await;
        cell.watch(op, from, before, i + 1 == ops.len()).await;
    }
    if let Some(t) = cell.nobody_since {
        cell.leaderless_max = cell.leaderless_max.max(t.elapsed());
    }
    let report = cell.rec.check(&cell.name);
    assert!(report.overlaps.is_empty(), "{}", report.summary());
    // The recorder's longest gap between two claims sees a SIGTERM's
    // handover, which the cell's own polls wait out.
    cell.leaderless_max = cell.leaderless_max.max(report.longest_gap);
    let took: Vec<String> = cell.took.iter().map(|d| format!("{d:.2?}")).collect();
    format!(
        "matrix {backend}: {name}: overlaps {}, leaderless max {:.2?}, to the named leader [{}], leader {:?}",
        report.overlaps.len(),
        cell.leaderless_max,
        took.join(", "),
        cell.model.the_leader()
    )
}

/// The cells of a backend: row i against column i + `shift`, and pause,
/// priority, revision; every ordered pair with `LE_FULL_MATRIX=1`.
fn cells(shift: usize) -> Vec<Vec<Op>> {
    let mut all: Vec<Vec<Op>> = if std::env::var("LE_FULL_MATRIX").as_deref() == Ok("1") {
        OPS.iter()
            .flat_map(|&a| OPS.iter().map(move |&b| vec![a, b]))
            .collect()
    } else {
        let n = OPS.len();
        (0..n).map(|i| vec![OPS[i], OPS[(i + shift) % n]]).collect()
    };
    all.push(vec![Op::Pause, Op::Priority, Op::Revision]);
    // `LE_MATRIX_CELL="Pause then Sigterm"`: only the cells so named.
    if let Ok(only) = std::env::var("LE_MATRIX_CELL") {
        all.retain(|ops| cell_name(ops) == only);
    }
    all
}

/// Every cell of `backend` in turn (a failing cell does not stop the
/// others; the test fails naming them all).
async fn matrix(fx: Fixture, backend: &'static str, shift: usize) {
    let fx = Arc::new(fx);
    let start = Instant::now();
    let (mut passed, mut failed) = (0, vec![]);
    for ops in cells(shift) {
        let name = cell_name(&ops);
        if KNOWN.contains(&(backend, name.as_str())) {
            println!("matrix {backend}: {name}: skipped (known failure, see KNOWN)");
            continue;
        }
        match tokio::spawn(run_cell(fx.clone(), backend, ops)).await {
            Ok(line) => {
                println!("{line}");
                passed += 1;
            }
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    println!(
        "matrix {backend}: {passed} cells passed, {} failed, in {:.1?}",
        failed.len(),
        start.elapsed()
    );
    assert!(
        failed.is_empty(),
        "matrix {backend}: failed cells: {failed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_matrix() {
    matrix(Fixture::etcd().await, "etcd", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_matrix() {
    matrix(Fixture::redis().await, "redis", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_matrix() {
    matrix(Fixture::redlock().await, "redlock", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_matrix() {
    matrix(Fixture::kubernetes().await, "kubernetes", 5).await;
}
