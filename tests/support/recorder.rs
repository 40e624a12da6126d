//! A recorder of every sidecar's `GET /leader` answers, and the checker that
//! proves from the recording that no two sidecars ever led at once.
//!
//! One task per sidecar process asks `/leader` again a few milliseconds after
//! each answer and keeps every answer with the instant the request was sent
//! and the instant the answer was received (`tokio::time::Instant`, the
//! monotonic clock). The sidecar computed its answer at some instant `c` in
//! `[send, recv]`; we never know where exactly, so every conclusion below is
//! drawn for the worst placement of `c`.
//!
//! The test injects faults and tells the recorder about them ([`Fault`]); the
//! checker ([`Recorder::check`]) then measures, per fault and overall:
//! overlaps (must be 0), stale claims past the claimant's own `valid_until`
//! (must be ≤ 0), fencing tokens that do not grow, recovery times, and the
//! longest time without a leader.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::http::{HTTP_LIMIT, http_request_at};

/// How long a polling task waits between an answer and its next request.
pub const POLL_GAP: Duration = Duration::from_millis(4);

/// What one `/leader` request brought back.
#[derive(Clone, Debug)]
pub struct Answer {
    /// HTTP status (200 leader, 503 otherwise).
    pub status: u16,
    /// `is_leader`.
    pub is_leader: bool,
    /// `leader` (the holder this sidecar observed).
    pub leader: Option<String>,
    /// `fencing_token`.
    pub fencing_token: Option<u64>,
    /// `valid_for_ms`.
    pub valid_for_ms: u64,
    /// `transitions`.
    pub transitions: u64,
    /// `backend_healthy`.
    pub backend_healthy: bool,
    /// `error`.
    pub error: Option<String>,
}

/// One request and what came of it.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The instant the request was sent (before connecting).
    pub send: Instant,
    /// The instant the answer (or the failure) came back.
    pub recv: Instant,
    /// `None` when the sidecar did not answer (refused, timed out, bad body).
    pub answer: Option<Answer>,
}

impl Sample {
    /// Whether this answer claims leadership.
    pub fn is_true(&self) -> bool {
        self.answer.as_ref().is_some_and(|a| a.is_leader)
    }
    fn token(&self) -> Option<u64> {
        self.answer.as_ref().and_then(|a| a.fencing_token)
    }
    /// Which term of this process the answer belongs to: its fencing token and
    /// its `transitions` count. A sidecar that lost its term and won another
    /// between two polls shows a new count even if the token repeats (a Redis
    /// that forgot its counter hands out token 1 again).
    fn term(&self) -> (u64, u64) {
        let a = self.answer.as_ref();
        (
            a.and_then(|a| a.fencing_token).unwrap_or(0),
            a.map_or(0, |a| a.transitions),
        )
    }
}

/// What a fault does to leadership, which decides what the checker expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The sidecar in `slot` is cut off from the backend (connection cut,
    /// backend down, quorum lost, answers delayed past the deadline): from
    /// `start` until `end` it renews nothing, so it must stop claiming by the
    /// `valid_until` it reported, and by `start` + TTL at the latest.
    CutOff,
    /// The process in `slot` is paused (SIGSTOP at `start`, SIGCONT at `end`,
    /// longer than the TTL): every answer it gives to a request sent after
    /// `start` must be false.
    Paused,
    /// The process in `slot` was killed: another sidecar takes over.
    Killed,
    /// A short cut that must not change the leader: the leader in `slot` keeps
    /// its term and answers true throughout.
    NoFailover,
    /// Anything else (key deleted by hand, a backend member killed): only the
    /// global checks and recovery apply.
    Other,
}

/// One injected fault, as the test declares it to the checker.
#[derive(Clone, Debug)]
pub struct Fault {
    /// A short label, e.g. `blackhole leader`.
    pub name: String,
    /// The sidecar slot the fault aims at (the leader, usually), if any.
    pub slot: Option<usize>,
    /// When the fault began.
    pub start: Instant,
    /// When it healed (`None`: it never heals, e.g. a kill, or not yet).
    pub end: Option<Instant>,
    /// What the checker expects.
    pub expect: Expect,
    /// The term (`slot`, fencing token) that the fault should end, if any:
    /// recovery then means a leader of another term.
    pub ends_term: Option<(usize, u64)>,
    /// Recovery is measured from this instant: the fault's start when the
    /// others should take over during the fault, its end when nobody can lead
    /// until it heals.
    pub recover_from: Instant,
    /// The README's bound for that recovery.
    pub recover_within: Duration,
    /// [`Expect::NoFailover`]: the fencing token the leader must keep.
    pub keeps_token: Option<u64>,
    /// The backend is silent to every sidecar (frozen, or without quorum)
    /// from `start` until `end`. Every answer to a request sent at
    /// `start + d` or later and received before `end` must name no leader,
    /// and report `backend_healthy: false` with an `error` (a
    /// follower never vouches for a leader it cannot see).
    pub silent_after: Option<Duration>,
    /// When the silence ended (before the servers were thawed or restarted),
    /// if earlier than `end`; see [`Recorder::end_silence`].
    pub silent_end: Option<Instant>,
}

impl Fault {
    /// A fault starting now.
    pub fn new(name: &str, slot: Option<usize>, expect: Expect, within: Duration) -> Fault {
        let now = Instant::now();
        Fault {
            name: name.to_owned(),
            slot,
            start: now,
            end: None,
            expect,
            ends_term: None,
            recover_from: now,
            recover_within: within,
            keeps_token: None,
            silent_after: None,
            silent_end: None,
        }
    }
}

/// One polled process.
struct Target {
    label: String,
    samples: Arc<Mutex<Vec<Sample>>>,
    task: JoinHandle<()>,
}

/// Polls every registered sidecar's `/leader` until dropped.
pub struct Recorder {
    started: Instant,
    targets: Mutex<Vec<Target>>,
    faults: Mutex<Vec<Fault>>,
    ttl: Duration,
}

impl Recorder {
    /// A recorder for sidecars whose lease TTL is `ttl` (used for the absolute
    /// bound of a cut-off leader's claim).
    pub fn new(ttl: Duration) -> Recorder {
        Recorder {
            started: Instant::now(),
            targets: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            ttl,
        }
    }

    /// Start polling `/leader` on `port`; returns the slot number. A restarted
    /// sidecar is a new process and gets a new slot (same `label` is fine).
    pub fn add(&self, label: &str, port: u16) -> usize {
        self.add_at(label, IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    }

    /// [`Recorder::add`] for a sidecar answering on `ip:port` (one in a
    /// network namespace, sampled from the host).
    pub fn add_at(&self, label: &str, ip: IpAddr, port: u16) -> usize {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                let send = Instant::now();
                let answer =
                    match http_request_at(ip, port, "GET", "/leader", None, HTTP_LIMIT).await {
                        Ok((status, body)) => parse(status, &body),
                        Err(_) => None,
                    };
                let recv = Instant::now();
                sink.lock().unwrap().push(Sample { send, recv, answer });
                sleep(POLL_GAP).await;
            }
        });
        let mut t = self.targets.lock().unwrap();
        t.push(Target {
            label: label.to_owned(),
            samples,
            task,
        });
        t.len() - 1
    }

    /// Stop polling `slot` (its process is gone for good).
    pub fn stop_polling(&self, slot: usize) {
        self.targets.lock().unwrap()[slot].task.abort();
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.targets.lock().unwrap().len()
    }

    /// Record a fault (its `end` may be filled in later with [`Recorder::heal`]).
    /// Returns its index.
    pub fn fault(&self, f: Fault) -> usize {
        let mut v = self.faults.lock().unwrap();
        v.push(f);
        v.len() - 1
    }

    /// Fault `i` is in effect now (the command that made it returned): its
    /// start, and the recovery counted from it, move here. A fault is
    /// recorded before it is made (to name the leader it targets), and
    /// making it takes time (nftables rules under load: tens of ms); a
    /// renewal sent meanwhile may still be answered, and its validity
    /// counts from its send, after the recorded start (seen: a cut-off
    /// leader held 8 ms "past" a start taken before the rules).
    pub fn in_effect(&self, i: usize) {
        let now = Instant::now();
        let mut v = self.faults.lock().unwrap();
        v[i].start = now;
        v[i].recover_from = now;
    }

    /// Mark fault `i` healed now; recovery counts from now when `recover_from_end`.
    pub fn heal(&self, i: usize, recover_from_end: bool) {
        let now = Instant::now();
        let mut v = self.faults.lock().unwrap();
        v[i].end = Some(now);
        if recover_from_end {
            v[i].recover_from = now;
        }
    }

    /// The silence of fault `i` ends now (call it just before thawing or
    /// restarting the servers; answers after it are not held to the silence).
    pub fn end_silence(&self, i: usize) {
        self.faults.lock().unwrap()[i].silent_end = Some(Instant::now());
    }

    /// The latest answer of `slot`, if any.
    pub fn last(&self, slot: usize) -> Option<Sample> {
        let t = self.targets.lock().unwrap();
        let s = t[slot].samples.lock().unwrap();
        s.last().cloned()
    }

    /// The slot whose latest answer is a claim, if exactly one such slot was
    /// answered after `since`, with its fencing token.
    pub fn leader_now(&self, since: Instant) -> Option<(usize, u64)> {
        let t = self.targets.lock().unwrap();
        let mut found = None;
        for (i, target) in t.iter().enumerate() {
            if target.task.is_finished() {
                continue;
            }
            let s = target.samples.lock().unwrap();
            let last = s.last()?;
            if last.send < since {
                return None;
            }
            if last.is_true() {
                if found.is_some() {
                    return None;
                }
                found = Some((i, last.token().unwrap_or(0)));
            }
        }
        found
    }

    /// Wait until one slot leads (fresh answers from every polled slot) and
    /// return it with its token; `None` after `limit`.
    pub async fn wait_leader(&self, limit: Duration) -> Option<(usize, u64)> {
        let end = Instant::now() + limit;
        loop {
            let asked = Instant::now();
            sleep(Duration::from_millis(30)).await;
            if let Some(l) = self.leader_now(asked) {
                return Some(l);
            }
            if Instant::now() > end {
                return None;
            }
        }
    }

    /// Wait until a slot other than the term `not` leads (a new term).
    pub async fn wait_new_leader(
        &self,
        not: (usize, u64),
        limit: Duration,
    ) -> Option<(usize, u64)> {
        let end = Instant::now() + limit;
        loop {
            let asked = Instant::now();
            sleep(Duration::from_millis(30)).await;
            if let Some(l) = self.leader_now(asked)
                && l != not
            {
                return Some(l);
            }
            if Instant::now() > end {
                return None;
            }
        }
    }

    /// A copy of everything recorded so far: per slot, label and samples.
    pub fn snapshot(&self) -> Vec<(String, Vec<Sample>)> {
        let t = self.targets.lock().unwrap();
        t.iter()
            .map(|t| (t.label.clone(), t.samples.lock().unwrap().clone()))
            .collect()
    }

    /// Check the recording so far. `scenario` names the summary.
    pub fn check(&self, scenario: &str) -> Report {
        let slots = self.snapshot();
        let faults = self.faults.lock().unwrap().clone();
        check(scenario, self.started, self.ttl, &slots, &faults)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in self.targets.lock().unwrap().iter() {
            t.task.abort();
        }
    }
}

/// A `/leader` answer's status and body as an [`Answer`] (`None`: not JSON).
pub fn parse(status: u16, body: &str) -> Option<Answer> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(Answer {
        status,
        is_leader: v["is_leader"].as_bool()?,
        leader: v["leader"].as_str().map(str::to_owned),
        fencing_token: v["fencing_token"].as_u64(),
        valid_for_ms: v["valid_for_ms"].as_u64().unwrap_or(0),
        transitions: v["transitions"].as_u64().unwrap_or(0),
        backend_healthy: v["backend_healthy"].as_bool().unwrap_or(false),
        error: v["error"].as_str().map(str::to_owned),
    })
}

/// One leader interval: consecutive `is_leader:true` answers of one slot, with
/// one fencing token, ended by any other answer (false, no answer, or a new
/// token).
#[derive(Clone, Debug)]
pub struct Run {
    /// The slot (process).
    pub slot: usize,
    /// Its label (identity).
    pub label: String,
    /// The term's fencing token.
    pub token: u64,
    /// The `transitions` count of its answers (identifies the term with the token).
    pub transitions: u64,
    /// The first true answer.
    pub first: Sample,
    /// The last true answer.
    pub last: Sample,
    /// How many true answers.
    pub count: usize,
}

impl Run {
    /// Latest possible start of the claim span: the first claim was made by
    /// the time its answer came back.
    pub fn latest_start(&self) -> Instant {
        self.first.recv
    }
    /// Earliest possible end: the last claim was made no earlier than its
    /// request was sent.
    pub fn earliest_end(&self) -> Instant {
        self.last.send
    }
}

/// The leader intervals in `samples` of one slot.
pub fn runs(slot: usize, label: &str, samples: &[Sample]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    let mut open: Option<Run> = None;
    for s in samples {
        if s.is_true() {
            let (token, transitions) = s.term();
            match &mut open {
                Some(r) if (r.token, r.transitions) == (token, transitions) => {
                    r.last = s.clone();
                    r.count += 1;
                }
                _ => {
                    if let Some(r) = open.take() {
                        out.push(r);
                    }
                    open = Some(Run {
                        slot,
                        label: label.to_owned(),
                        token,
                        transitions,
                        first: s.clone(),
                        last: s.clone(),
                        count: 1,
                    });
                }
            }
        } else if let Some(r) = open.take() {
            out.push(r);
        }
    }
    out.extend(open);
    out
}

/// A definite overlap between two leader intervals.
///
/// Why these ends. Run A's first claim was made at some `c` in
/// `[first.send, first.recv]` and its last at some `c'` in
/// `[last.send, last.recv]`; between consecutive answers of one run (a few ms
/// apart, same term) the sidecar claimed throughout. So A certainly claimed
/// over `[c, c']`, and the *shortest* span consistent with the recording is
/// `[first.recv, last.send]` (latest possible start, earliest possible end).
/// Two runs A and B of different processes definitely coexisted iff even
/// those shortest spans intersect:
///
/// `A.last.send > B.first.recv  &&  B.last.send > A.first.recv`.
///
/// If that holds, then for *every* placement of the four claim instants the
/// spans `[cA, cA']` and `[cB, cB']` intersect (each one's earliest end is
/// after the other's latest start), so it is a real overlap, never a polling
/// artifact. If it does not hold, there is a placement where the spans are
/// ordered (one ended, then the other began), which polling cannot tell
/// from a clean handover, so nothing is reported. Every overlap that lasts
/// longer than one poll gap plus two round trips (a few ms here) has samples
/// inside it from both sides and is therefore caught. A run of one answer is
/// handled by the same rule (its span is the point `c` in `[send, recv]`).
#[derive(Clone, Debug)]
pub struct Overlap {
    /// The two intervals.
    pub a: Run,
    /// See `a`.
    pub b: Run,
    /// How long both certainly claimed (lower bound).
    pub at_least: Duration,
}

/// Per-fault findings.
#[derive(Clone, Debug)]
pub struct FaultReport {
    /// The fault's label.
    pub name: String,
    /// Time from `recover_from` to the first claim of an acceptable term
    /// (answer receive instant); `None` when no leader came back.
    pub recovery: Option<Duration>,
    /// The README bound it is held to.
    pub bound: Duration,
    /// Cut-off / paused leaders: the latest claim minus the claimant's own
    /// `valid_until` (negative: it stopped in time). Positive is a violation.
    pub stale: Option<Duration>,
    /// Whether `stale` is positive.
    pub stale_positive: bool,
    /// Problems found (empty when the fault was handled correctly).
    pub problems: Vec<String>,
}

/// Findings over a whole recording.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Leader terms seen (distinct slot + token).
    pub terms: usize,
    /// Changes of leader term seen (terms − 1, at least 0).
    pub transitions: usize,
    /// Faults injected.
    pub faults: usize,
    /// Definite overlaps (must be empty).
    pub overlaps: Vec<Overlap>,
    /// Longest time between two claims (receive instants) of anybody, after
    /// the first claim.
    pub longest_gap: Duration,
    /// Largest stale claim over all cut-off/paused leaders, in signed ms
    /// (must be ≤ 0).
    pub worst_stale_ms: Option<i64>,
    /// Slowest recovery and its fault.
    pub slowest_recovery: Option<(Duration, Duration, String)>,
    /// Fencing tokens that did not grow: (earlier term, later term).
    pub token_regressions: Vec<String>,
    /// Per fault.
    pub per_fault: Vec<FaultReport>,
    /// Samples in all.
    pub samples: usize,
    /// Answers checked against a silent backend's bound (see [`Fault::silent_after`]).
    pub silent_checked: usize,
    /// Of those, answers that named a leader or reported a healthy backend.
    pub silent_violations: usize,
    /// Every problem found, one line each (empty: all good).
    pub problems: Vec<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn signed_ms(a: Instant, b: Instant) -> i64 {
    if a >= b {
        (a - b).as_millis() as i64
    } else {
        -((b - a).as_millis() as i64)
    }
}

/// The checker (a free function over a recording, so it can be unit-tested).
pub fn check(
    scenario: &str,
    t0: Instant,
    ttl: Duration,
    slots: &[(String, Vec<Sample>)],
    faults: &[Fault],
) -> Report {
    let checker = Checker { t0, ttl, slots };
    let mut report = Report {
        scenario: scenario.to_owned(),
        faults: faults.len(),
        samples: slots.iter().map(|(_, s)| s.len()).sum(),
        ..Report::default()
    };
    let all_runs: Vec<Run> = slots
        .iter()
        .enumerate()
        .flat_map(|(i, (label, s))| runs(i, label, s))
        .collect();
    checker.overlaps(&all_runs, &mut report);
    checker.fencing(&all_runs, &mut report);
    report.longest_gap = checker.longest_gap();
    // b + d per fault.
    for f in faults {
        let fr = checker.fault(f, &mut report);
        for p in &fr.problems {
            report.problems.push(format!("[{}] {p}", f.name));
        }
        report.per_fault.push(fr);
    }
    // f. A silent backend: nobody vouches for a leader past the bound.
    for f in faults {
        checker.silent(f, &mut report);
    }
    report
}

/// One recording and the constants the checks need, shared by the checks
/// that [`check`] runs one after the other.
struct Checker<'a> {
    t0: Instant,
    ttl: Duration,
    slots: &'a [(String, Vec<Sample>)],
}

impl Checker<'_> {
    /// Milliseconds from the start of the recording to `t` (for messages).
    fn rel(&self, t: Instant) -> f64 {
        ms(t.saturating_duration_since(self.t0))
    }

    /// The samples of one slot.
    fn samples_of(&self, slot: usize) -> &[Sample] {
        &self.slots[slot].1
    }

    /// a. Safety: no two processes with definitely overlapping intervals.
    fn overlaps(&self, all_runs: &[Run], report: &mut Report) {
        for (i, a) in all_runs.iter().enumerate() {
            for b in &all_runs[i + 1..] {
                if a.slot == b.slot {
                    continue;
                }
                if a.earliest_end() > b.latest_start() && b.earliest_end() > a.latest_start() {
                    let o = self.overlap(a, b);
                    report.problems.push(o.problem(self));
                    report.overlaps.push(o);
                }
            }
        }
    }

    /// The overlap of two runs known to intersect.
    fn overlap(&self, a: &Run, b: &Run) -> Overlap {
        let from = a.latest_start().max(b.latest_start());
        let to = a.earliest_end().min(b.earliest_end());
        Overlap {
            a: a.clone(),
            b: b.clone(),
            at_least: to.saturating_duration_since(from),
        }
    }

    /// c. Fencing tokens strictly grow from term to term, terms ordered by
    /// start.
    fn fencing(&self, all_runs: &[Run], report: &mut Report) {
        let mut terms: BTreeMap<(usize, u64, u64), (Instant, String)> = BTreeMap::new();
        for r in all_runs {
            let e = terms
                .entry((r.slot, r.token, r.transitions))
                .or_insert((r.first.send, r.label.clone()));
            e.0 = e.0.min(r.first.send);
        }
        let mut ordered: Vec<(Instant, usize, u64, String)> = terms
            .iter()
            .map(|((slot, token, _), (start, label))| (*start, *slot, *token, label.clone()))
            .collect();
        ordered.sort_by_key(|t| t.0);
        report.terms = ordered.len();
        report.transitions = ordered.len().saturating_sub(1);
        for w in ordered.windows(2) {
            if w[1].2 <= w[0].2 {
                let line = format!(
                    "FENCING: term of {}#{} (started {:.0} ms) has token {} after {}#{}'s token {} (started {:.0} ms)",
                    w[1].3,
                    w[1].1,
                    self.rel(w[1].0),
                    w[1].2,
                    w[0].3,
                    w[0].1,
                    w[0].2,
                    self.rel(w[0].0)
                );
                report.token_regressions.push(line.clone());
                report.problems.push(line);
            }
        }
    }

    /// Longest leaderless gap (between receive instants of claims by anybody).
    fn longest_gap(&self) -> Duration {
        let mut claims: Vec<Instant> = self
            .slots
            .iter()
            .flat_map(|(_, s)| s.iter().filter(|s| s.is_true()).map(|s| s.recv))
            .collect();
        claims.sort();
        claims
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default()
    }

    /// b + d for one fault: what its kind expects of the targeted slot, then
    /// the recovery after it.
    fn fault(&self, f: &Fault, report: &mut Report) -> FaultReport {
        let mut fr = FaultReport {
            name: f.name.clone(),
            recovery: None,
            bound: f.recover_within,
            stale: None,
            stale_positive: false,
            problems: Vec::new(),
        };
        match (&f.expect, f.slot) {
            (Expect::CutOff, Some(slot)) => {
                self.cut_off(f, slot, &mut fr, &mut report.worst_stale_ms)
            }
            (Expect::Paused, Some(slot)) => {
                self.paused(f, slot, &mut fr, &mut report.worst_stale_ms)
            }
            (Expect::NoFailover, Some(slot)) => self.no_failover(f, slot, &mut fr),
            _ => {}
        }
        if f.expect != Expect::NoFailover {
            self.recovery(f, &mut fr, &mut report.slowest_recovery);
        }
        fr
    }

    /// A cut-off leader stops claiming by its own `valid_until`.
    fn cut_off(&self, f: &Fault, slot: usize, fr: &mut FaultReport, worst: &mut Option<i64>) {
        // Renewals answered before the cut may still be processed a
        // moment after it: only answers to requests sent 100 ms after
        // the cut are taken to show the final valid_until. Only
        // answers received before the heal count (a renewal after the
        // heal legitimately extends the term).
        let settle = f.start + Duration::from_millis(100);
        let end = f.end.unwrap_or(Instant::now() + Duration::from_secs(3600));
        let term_at_cut = self
            .samples_of(slot)
            .iter()
            .rfind(|s| s.is_true() && s.send <= f.start)
            .map(|s| s.term());
        let during: Vec<&Sample> = self
            .samples_of(slot)
            .iter()
            .filter(|s| s.is_true() && s.send >= settle && s.recv < end)
            .filter(|s| Some(s.term()) == term_at_cut)
            .collect();
        if let (Some(first), Some(last)) = (during.first(), during.last()) {
            // valid_until <= c + valid_for_ms + 1 ms <= recv + valid_for_ms + 1 ms
            // for every such answer; the tightest one bounds them all.
            let bound = during.iter().map(|s| valid_until(s)).min().unwrap();
            let absolute = f.start + self.ttl;
            let stale = signed_ms(last.send, bound).max(signed_ms(last.send, absolute));
            record_stale(fr, worst, stale);
            if stale > 0 {
                fr.problems.push(format!(
                    "STALE: {}#{} cut off at {:.0} ms still claimed at {:.0} ms, {stale} ms past its valid_until (first seen {:.0} ms)",
                    self.slots[slot].0, slot, self.rel(f.start), self.rel(last.send), self.rel(first.send)
                ));
            }
        }
    }

    /// A paused leader does not claim its old term after SIGCONT.
    fn paused(&self, f: &Fault, slot: usize, fr: &mut FaultReport, worst: &mut Option<i64>) {
        let cont = f.end.expect("a paused fault is healed by SIGCONT");
        let after: Vec<&Sample> = self
            .samples_of(slot)
            .iter()
            .filter(|s| s.send > f.start + Duration::from_millis(1) && s.answer.is_some())
            .collect();
        // The claim before the pause bounds valid_until; any claim
        // made after SIGCONT is past it (the pause is longer than TTL).
        let before = self
            .samples_of(slot)
            .iter()
            .rfind(|s| s.is_true() && s.recv <= f.start);
        // Only the term it held when paused: after SIGCONT it may
        // legitimately win a new term later.
        let paused_term = before.map(|b| b.term());
        if let Some(first) = after.first() {
            if first.is_true() && Some(first.term()) == paused_term {
                fr.problems.push(format!(
                    "STALE: {}#{}'s first answer after SIGCONT ({:.0} ms) claimed leadership",
                    self.slots[slot].0,
                    slot,
                    self.rel(first.recv)
                ));
            }
        } else {
            fr.problems.push(format!(
                "{}#{} never answered after SIGCONT",
                self.slots[slot].0, slot
            ));
        }
        let stale_claims: Vec<&&Sample> = after
            .iter()
            .filter(|s| s.is_true() && Some(s.term()) == paused_term)
            .collect();
        let stale = if let Some(s) = stale_claims.last() {
            signed_ms(s.send.max(cont), f.start + self.ttl)
        } else if let Some(b) = before {
            // How long before SIGCONT its validity ran out (≤ 0).
            signed_ms(valid_until(b), cont).min(0)
        } else {
            0
        };
        record_stale(fr, worst, stale);
        if stale > 0 {
            fr.problems.push(format!(
                "STALE: {}#{} claimed after SIGCONT, {stale} ms past start + TTL",
                self.slots[slot].0, slot
            ));
        }
    }

    /// A blip shorter than the lease: no failover, and the leader keeps its
    /// term.
    fn no_failover(&self, f: &Fault, slot: usize, fr: &mut FaultReport) {
        // From the cut until 1 s after it healed: nobody else claims,
        // and the leader answers true with the same token every time.
        let until = f.end.unwrap_or(f.start) + Duration::from_secs(1);
        let in_window = |s: &Sample| s.send >= f.start && s.recv <= until;
        let others: usize = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != slot)
            .map(|(_, (_, s))| s.iter().filter(|s| in_window(s) && s.is_true()).count())
            .sum();
        if others > 0 {
            fr.problems.push(format!(
                "FAILOVER: another sidecar claimed {others} time(s) during or within 1 s after the blip"
            ));
        }
        let bad: Vec<&Sample> = self
            .samples_of(slot)
            .iter()
            .filter(|s| in_window(s))
            .filter(|s| !s.is_true() || f.keeps_token.is_some_and(|t| s.token() != Some(t)))
            .collect();
        if let Some(b) = bad.first() {
            fr.problems.push(format!(
                "BLIP: the leader {}#{} answered {} time(s) not-leader or with another token during or within 1 s after the blip (first at {:.0} ms: {:?})",
                self.slots[slot].0, slot, bad.len(), self.rel(b.send), b.answer
            ));
        }
        fr.recovery = Some(Duration::ZERO);
    }

    /// d. Recovery: how long until a leader of another term claimed, held to
    /// the fault's bound.
    fn recovery(
        &self,
        f: &Fault,
        fr: &mut FaultReport,
        slowest: &mut Option<(Duration, Duration, String)>,
    ) {
        fr.recovery = self.first_new_claim(f).map(|t| t - f.recover_from);
        match fr.recovery {
            None => fr.problems.push(format!(
                "LIVENESS: no leader after '{}' (from {:.0} ms)",
                f.name,
                self.rel(f.recover_from)
            )),
            Some(r) if r > f.recover_within => fr.problems.push(format!(
                "LIVENESS: '{}' recovered in {:.0} ms, over its bound of {:.0} ms",
                f.name,
                ms(r),
                ms(f.recover_within)
            )),
            Some(_) => {}
        }
        if let Some(r) = fr.recovery
            && slowest.as_ref().is_none_or(|(worst, _, _)| r > *worst)
        {
            *slowest = Some((r, f.recover_within, f.name.clone()));
        }
    }

    /// The first claim, sent after `recover_from`, of a term other than the
    /// one the fault ends (answer receive instant).
    fn first_new_claim(&self, f: &Fault) -> Option<Instant> {
        // The ended term is identified by its transitions count too
        // (tokens can repeat after a backend forgot its data).
        let ended: Option<(usize, (u64, u64))> = f.ends_term.map(|(slot, token)| {
            let tr = self.slots[slot]
                .1
                .iter()
                .rfind(|s| s.is_true() && s.token() == Some(token) && s.send <= f.start)
                .map_or(u64::MAX, |s| s.term().1);
            (slot, (token, tr))
        });
        let mut first: Option<Instant> = None;
        for (i, (_, s)) in self.slots.iter().enumerate() {
            for s in s.iter().filter(|s| s.is_true() && s.send >= f.recover_from) {
                if let Some((slot, (token, tr))) = ended
                    && slot == i
                    && s.token() == Some(token)
                    && (tr == u64::MAX || s.term().1 == tr)
                {
                    continue;
                }
                if matches!(f.expect, Expect::Killed | Expect::Paused | Expect::CutOff)
                    && f.slot == Some(i)
                    && f.end.is_none_or(|e| s.send < e)
                {
                    continue;
                }
                first = Some(first.map_or(s.recv, |f: Instant| f.min(s.recv)));
                break;
            }
        }
        first
    }

    /// f. A silent backend: no answer sent past the fault's bound names a
    /// leader or a healthy backend.
    fn silent(&self, f: &Fault, report: &mut Report) {
        let Some(after) = f.silent_after else {
            return;
        };
        let from = f.start + after;
        let until = match (f.silent_end, f.end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for (label, samples) in self.slots {
            let mut bad = Vec::new();
            for s in samples
                .iter()
                .filter(|s| s.send >= from && until.is_none_or(|e| s.recv < e))
            {
                let Some(a) = &s.answer else { continue };
                report.silent_checked += 1;
                if a.leader.is_some() || a.backend_healthy || a.error.is_none() {
                    report.silent_violations += 1;
                    bad.push(s.clone());
                }
            }
            if let Some(first) = bad.first() {
                let a = first.answer.as_ref().unwrap();
                report.problems.push(format!(
                    "[{}] SILENT: {label}: {} answer(s) sent more than {:.0} ms into the silence named a leader or a healthy backend (first at {:.0} ms: leader {:?}, backend_healthy {}, error {})",
                    f.name,
                    bad.len(),
                    ms(after),
                    self.rel(first.send),
                    a.leader,
                    a.backend_healthy,
                    a.error.is_some()
                ));
            }
        }
    }
}

impl Overlap {
    /// The problem line that reports this overlap.
    fn problem(&self, c: &Checker) -> String {
        let (a, b) = (&self.a, &self.b);
        format!(
            "OVERLAP: {}#{} (token {}, claimed {:.0}–{:.0} ms) and {}#{} (token {}, claimed {:.0}–{:.0} ms) both led for at least {:.0} ms",
            a.label,
            a.slot,
            a.token,
            c.rel(a.latest_start()),
            c.rel(a.earliest_end()),
            b.label,
            b.slot,
            b.token,
            c.rel(b.latest_start()),
            c.rel(b.earliest_end()),
            ms(self.at_least)
        )
    }
}

/// The latest `valid_until` a claim can carry: the sidecar computed it at
/// some instant before `recv`, plus `valid_for_ms` and 1 ms of rounding.
fn valid_until(s: &Sample) -> Instant {
    s.recv + Duration::from_millis(s.answer.as_ref().unwrap().valid_for_ms + 1)
}

/// Stores a stale measure in the fault's report and the running worst.
fn record_stale(fr: &mut FaultReport, worst: &mut Option<i64>, stale: i64) {
    fr.stale = Some(Duration::from_millis(stale.unsigned_abs()));
    fr.stale_positive = stale > 0;
    update_stale(worst, stale);
}

fn update_stale(worst: &mut Option<i64>, v: i64) {
    *worst = Some(worst.map_or(v, |w| w.max(v)));
}

impl Report {
    /// A multi-line summary for `--nocapture`.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let stale = self
            .worst_stale_ms
            .map_or("n/a".to_owned(), |v| format!("{v} ms"));
        let slowest = self
            .slowest_recovery
            .as_ref()
            .map_or("n/a".to_owned(), |(r, b, n)| {
                format!("{:.0} ms (bound {:.0} ms, {n})", ms(*r), ms(*b))
            });
        let _ = writeln!(
            s,
            "== fault summary [{}]: terms {} (transitions {}), faults {}, overlaps {}, longest leaderless gap {:.0} ms, worst stale claim {}, slowest recovery {}, token regressions {}, silent-backend answers vouching {} of {}, samples {}",
            self.scenario,
            self.terms,
            self.transitions,
            self.faults,
            self.overlaps.len(),
            ms(self.longest_gap),
            stale,
            slowest,
            self.token_regressions.len(),
            self.silent_violations,
            self.silent_checked,
            self.samples
        );
        for f in &self.per_fault {
            let _ = writeln!(
                s,
                "   - {}: recovery {} (bound {:.0} ms), stale {}",
                f.name,
                f.recovery
                    .map_or("none".to_owned(), |r| format!("{:.0} ms", ms(r))),
                ms(f.bound),
                f.stale.map_or("n/a".to_owned(), |d| format!(
                    "{}{} ms",
                    if f.stale_positive { "+" } else { "-" },
                    d.as_millis()
                )),
            );
        }
        for p in &self.problems {
            let _ = writeln!(s, "   ! {p}");
        }
        s
    }

    /// One tab-separated line for the totals file.
    pub fn line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.scenario,
            self.transitions,
            self.faults,
            self.overlaps.len(),
            ms(self.longest_gap) as u64,
            self.worst_stale_ms.map_or("n/a".into(), |v| v.to_string()),
            self.slowest_recovery
                .as_ref()
                .map_or("n/a".into(), |(r, _, _)| (ms(*r) as u64).to_string()),
            self.problems.len()
        )
    }
}
