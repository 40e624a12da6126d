//! The Kubernetes Lease election as a [`Model`]: the rule, not the code.
//!
//! **Time** is discrete: a tick of real time is one action; everything else
//! happens at an instant between ticks, in any order.
//!
//! **The Lease** is (present, holder, duration `d`, version, fencing-token
//! annotation, release marker). Every write by a candidate is a
//! compare-and-swap on the version (a create: on absence); a foreign write
//! (a hand edit) is not, and keeps the annotations it does not touch (the
//! token, the release marker). Versions grow across a deletion (the API
//! server's `resourceVersion` is global). A create is seeded with a token
//! above every earlier one (the code's `max(highest seen + 1, Unix ms)`,
//! assuming the clock is ahead of the last token); an acquisition writes the
//! annotation + 1.
//!
//! **Clocks**: each candidate's clock has a constant rate, chosen in the
//! initial state: exact, or (drift runs) fast or slow, a local interval of
//! `L` ticks then lasting `L - 1` or `L + 1` real ticks (never under 1). All
//! local deadlines are kept as countdowns in real ticks, set when the
//! interval starts. That is bounded rate drift of one tick per interval (an
//! over-approximation for intervals shorter than a duration, which drift as
//! much as a whole one); the margin must then be 2 ticks.
//!
//! **A leader** claims (`is_leader`) while its validity countdown, set to
//! the real length of `duration - margin` at the instant its last
//! acknowledged write was *sent*, is above zero; at zero it stops claiming on
//! its own. Safety runs let it renew at any instant (every renew interval
//! under its validity); liveness runs renew every `renew` ticks. Releasing:
//! stop claiming, then write holder `""`, duration 1 and the release marker
//! by CAS.
//!
//! **A follower** records, per rule, when it may take over (a countdown in
//! real ticks from the instant it observed a version), then campaigns by
//! CAS on the version it saw, or by create when it saw the Lease absent. A
//! create that succeeds is followed by the replay (README, "A term nobody
//! saw is waited out too"): if a term was written since the candidate's
//! last complete view, it does not claim but waits that term's duration
//! from the create's answer and then takes the Lease by CAS. See [`Rule`]
//! for the old and the fixed rules.
//!
//! **The network and the processes**: every candidate action and every
//! server step is optional and may happen at any instant, so requests are
//! delayed arbitrarily, processes pause arbitrarily (their clocks keep
//! running, as `CLOCK_MONOTONIC` does under SIGSTOP), and a leader may stay
//! blind to writes as long as the adversary likes (a slow or lost watch).
//! An answer reaches its candidate when the server applies the request, or
//! is lost: a later answer would only shorten what the candidate does with
//! it (a claim still ends at send + duration − margin; a refusal shows what
//! a read at that instant shows). Faults, each spending one unit of a
//! per-run budget ([`Fault`]): a request lost, an answer lost, a crash (a
//! request already on the wire may still be applied), a restart (a fresh
//! process that knows nothing), a release, a lost watch (old rule: the
//! leader cannot observe until its next successful renewal), and foreign
//! writes ([`Foreign`]).
//!
//! **Observation** ([`Observe`]): `Watch` means followers see every
//! version, in order: no write happens until every running follower has
//! observed the current version, and a follower awaiting an answer (whose
//! events queue meanwhile) observes it just before the next write. Both
//! only move observations earlier than a real watch delivers them, and an
//! earlier observation never makes a follower wait longer under any rule
//! here, so every real run has a run of the model at least as dangerous.
//! `Reads` means followers may skip versions (a re-list after a 410, a
//! fallback to reads, a process that just started): no constraint. Leaders
//! are never constrained: their observations are the adversary's to delay.
//! A follower sends a CAS only on the version it has seen being current (a
//! CAS on an older one can only fail and re-read, no more than an
//! observation); a create on a stale view of an absent Lease may be sent (it
//! may land after a deletion).
//!
//! **Invariant**: at no instant do two running candidates claim; every claim
//! that begins carries a fencing token larger than every token claimed
//! before. Paused candidates count (a paused leader would answer `true` the
//! moment it resumes before its deadline), crashed ones do not.

use std::fmt;

use super::explorer::Model;

/// Which rule the candidates follow.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rule {
    /// Today's main: a follower counts silence with the duration written in
    /// the current version, from when it observed that version, and takes
    /// over at once when the holder is empty; one that saw holder H and
    /// finds the Lease gone waits the duration it saw for H from then; the
    /// leader ignores any write that keeps its holder name (it adopts the
    /// version and renews with its own duration; main keeps the Lease's
    /// duration on renewal, which changes nothing before that renewal, where
    /// the counterexample lies); a lost watch is reopened only after the
    /// next successful renewal.
    Old,
    /// The rule being implemented on main: (1) a follower may take over at
    /// `max over observed versions v of the holder's term of (obs(v) +
    /// d(v))`; a write that changes the holder starts a new chain whose wait
    /// is never shorter than the previous chain's, unless the Lease shows a
    /// release marker (a foreign write of an empty holder carries none); a
    /// follower that saw holder H finds the Lease gone and waits the longest
    /// duration it saw for H from then (and never less than its pending
    /// wait); (2) the leader ends its term as soon as it observes a foreign
    /// write (and releases by CAS when the Lease still names it); a write
    /// that keeps holder and duration is re-asserted; (3) a lost watch is
    /// reopened at once, so a leader may always observe.
    Fixed,
    /// A proposed strengthening of `Fixed`, checked against the holes the
    /// model finds in it: every duration a follower reads is raised to at
    /// least its own configured duration; an empty holder without a release
    /// marker counts as a version of an unknown holder (wait the own
    /// duration from it); a process whose first sight is an absent Lease
    /// waits its own duration before creating it. Safe only when no holder
    /// is configured with a longer duration than its followers.
    FixedFloor,
}

/// How followers observe the Lease (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Observe {
    /// Every version, in order (a watch that never skips).
    Watch,
    /// Any version may be skipped (reads, a re-list after a 410).
    Reads,
}

/// A write to the Lease by someone else (`kubectl edit`, a script).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Foreign {
    /// `leaseDurationSeconds` set to 1, holder kept.
    Duration,
    /// `holderIdentity` set to a name no candidate uses.
    Holder,
    /// `holderIdentity` set to `""` (no release marker is written).
    Empty,
    /// The Lease deleted.
    Delete,
    /// Another field changed (a label, `renewTime`): only a new version.
    Touch,
}

/// Bounds of a liveness run (faults other than one crash are off, and every
/// enabled action happens before time passes).
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    /// A leader must claim at every quiet instant from this time on.
    pub elect_within: u8,
    /// After a leader crashes, someone claims at every quiet instant from
    /// this many ticks on.
    pub failover_within: u8,
    /// Time stops here.
    pub horizon: u8,
}

impl Liveness {
    /// The liveness verdict at a quiet instant (nobody claims, no move is
    /// urgent) at `clock`, `since_crash` ticks after a leader's crash (if
    /// one crashed): a violation when a leader was due by then.
    pub fn verdict(&self, clock: u8, since_crash: Option<u8>) -> Option<String> {
        match since_crash {
            None if clock >= self.elect_within => Some(format!("no leader at t={clock}")),
            Some(k) if k >= self.failover_within => {
                Some(format!("no leader {k} ticks after the crash"))
            }
            _ => None,
        }
    }
}

/// The safety verdict of every model: two or more of the candidates
/// `claiming` answer `is_leader=true` at one instant (named with their
/// fencing tokens, `token(c)`).
pub fn overlap(claiming: &[usize], token: impl Fn(usize) -> u8) -> Option<String> {
    if claiming.len() < 2 {
        return None;
    }
    let who: Vec<String> = claiming
        .iter()
        .map(|&c| format!("{} (token {})", name(c), token(c)))
        .collect();
    Some(format!(
        "{} answer is_leader=true at the same instant",
        who.join(" and ")
    ))
}

/// One configuration of the model.
#[derive(Clone, Debug)]
pub struct Config {
    /// The rule the candidates follow.
    pub rule: Rule,
    /// How followers observe.
    pub observe: Observe,
    /// Number of candidates, 1 to 3.
    pub candidates: usize,
    /// Each candidate's configured duration, in ticks.
    pub durations: [u8; 3],
    /// Renew interval, in ticks (under `duration - margin`).
    pub renew: u8,
    /// Drift margin, in ticks.
    pub margin: u8,
    /// Clock rates: 0 (exact clocks) or 1 (±1 tick per interval).
    pub drift: u8,
    /// The kinds of fault that may happen.
    pub faults: &'static [Fault],
    /// How many faults at most in one run (all kinds together).
    pub budget: u8,
    /// A liveness run instead of a safety run.
    pub liveness: Option<Liveness>,
}

impl Config {
    /// Exact clocks, durations 3, renew 2, margin 0, two candidates, every
    /// fault off: the base the tests change.
    pub fn base(rule: Rule, observe: Observe) -> Config {
        Config {
            rule,
            observe,
            candidates: 2,
            durations: [3; 3],
            renew: 2,
            margin: 0,
            drift: 0,
            faults: &[],
            budget: 0,
            liveness: None,
        }
    }
}

/// A fault: each one taken spends one unit of the run's budget.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Fault {
    /// A write by someone else.
    Foreign(Foreign),
    /// A candidate crashes (a request already on the wire may still land).
    Crash,
    /// A candidate (running or crashed) is replaced by a fresh process that
    /// knows nothing (a Pod restarted or rescheduled); a request of the old
    /// process already on the wire is dropped.
    Restart,
    /// A request is lost before the server.
    Lose,
    /// A request is applied and its answer lost.
    LoseAnswer,
    /// The leader's watch ends (old rule: reopened after its next renewal).
    LoseWatch,
    /// The leader resigns (graceful release).
    Release,
}

/// A holder as the Lease names it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Holder {
    /// `""`.
    Empty,
    /// A candidate's term (ids are canonical: equal means the same term).
    Term(u8),
    /// A name no candidate uses, written by hand.
    Foreign,
}

/// The Lease object.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Lease {
    pub present: bool,
    pub holder: Holder,
    pub d: u8,
    pub ver: u8,
    pub token: u8,
    /// Written by a candidate's release; kept by foreign writes; cleared by
    /// any other write of a candidate.
    pub marker: bool,
}

pub const ABSENT: Lease = Lease {
    present: false,
    holder: Holder::Empty,
    d: 0,
    ver: 0,
    token: 0,
    marker: false,
};

/// What a follower last observed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Seen {
    /// Nothing yet (a fresh process).
    Nothing,
    /// The Lease absent.
    Absent,
    /// A version.
    Version {
        ver: u8,
        holder: Holder,
        d: u8,
        marker: bool,
    },
}

/// The term a candidate holds.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Lead {
    pub term: u8,
    /// The version to renew on (its last write, or a version it adopted).
    pub ver: u8,
    /// Real ticks left of claiming.
    pub valid: u8,
    /// Real ticks until the next renewal is due.
    pub renew_in: u8,
    pub token: u8,
    /// Old rule: whether its watch is open.
    pub watch: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Acquire,
    Create,
    Renew,
    Release,
}

/// A candidate's one request on the wire (its answer comes back at once
/// when the server applies it, or is lost: see `serve`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Req {
    pub kind: Kind,
    pub term: u8,
    /// The version the CAS expects (not used by `Create`).
    pub expect: u8,
    /// Real ticks of validity a success gives, counting down from the send.
    pub valid: u8,
    /// `Create` only: the longest duration of any term written to the Lease
    /// since the candidate's last complete view, up to this create (what the
    /// replay after a create reads; 0 when no term ran).
    pub replay: u8,
}

/// One candidate.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Cand {
    pub up: bool,
    /// −1 fast, 0 exact, +1 slow.
    pub rate: i8,
    pub lead: Option<Lead>,
    pub seen: Seen,
    /// Real ticks until the follower may take over.
    pub wait: u8,
    /// Fixed rules: the longest duration seen for the current holder chain.
    pub chain_d: u8,
    /// The longest duration of any term written since this follower's last
    /// complete view (its last observed version, or its first read): what a
    /// replay from there would show (see [`Req::replay`]).
    pub replay: u8,
    pub req: Option<Req>,
}

impl Cand {
    pub fn fresh(rate: i8) -> Cand {
        Cand {
            up: true,
            rate,
            lead: None,
            seen: Seen::Nothing,
            wait: 0,
            chain_d: 0,
            replay: 0,
            req: None,
        }
    }
}

/// The candidates (at most three, kept inline: no allocation per state).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Cands {
    pub n: u8,
    pub all: [Cand; 3],
}

impl std::ops::Deref for Cands {
    type Target = [Cand];
    fn deref(&self) -> &[Cand] {
        &self.all[..self.n as usize]
    }
}

impl std::ops::DerefMut for Cands {
    fn deref_mut(&mut self) -> &mut [Cand] {
        &mut self.all[..self.n as usize]
    }
}

/// The global state.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct St {
    pub lease: Lease,
    pub cands: Cands,
    /// Faults left.
    pub budget: u8,
    /// The largest fencing token ever claimed (the monitor).
    pub max_claimed: u8,
    /// Liveness runs: real time since the start, and since a leader crashed.
    pub clock: u8,
    pub since_crash: Option<u8>,
    /// The last version and term id handed out, for printed traces only
    /// (reset by canonical numbering, left out of the key), so a trace
    /// never shows a number twice.
    pub issued: (u8, u8),
}

/// One step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    Tick,
    Observe(usize),
    Campaign(usize),
    Renew(usize),
    Release(usize),
    Serve(usize),
    ServeLost(usize),
    Lose(usize),
    LoseWatch(usize),
    Crash(usize),
    Restart(usize),
    Foreign(Foreign),
}

pub fn name(c: usize) -> char {
    (b'A' + c as u8) as char
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Act::Tick => write!(f, "one tick of real time passes"),
            Act::Observe(c) => write!(f, "{} observes the Lease (watch event or read)", name(c)),
            Act::Campaign(c) => write!(f, "{} campaigns: sends its CAS (or create)", name(c)),
            Act::Renew(c) => write!(
                f,
                "{} sends a renewal (CAS on the version it knows)",
                name(c)
            ),
            Act::Release(c) => write!(f, "{} resigns: stops claiming, sends the release", name(c)),
            Act::Serve(c) => write!(
                f,
                "the API server applies {}'s request; {0} gets the answer",
                name(c)
            ),
            Act::ServeLost(c) => write!(
                f,
                "the API server applies {}'s request; the answer is lost",
                name(c)
            ),
            Act::Lose(c) => write!(f, "{}'s request is lost", name(c)),
            Act::LoseWatch(c) => write!(f, "{}'s watch is lost", name(c)),
            Act::Crash(c) => write!(f, "{} crashes", name(c)),
            Act::Restart(c) => write!(
                f,
                "{} is replaced by a fresh process (knows nothing)",
                name(c)
            ),
            Act::Foreign(Foreign::Duration) => write!(
                f,
                "FOREIGN WRITE: leaseDurationSeconds set to 1, holder kept"
            ),
            Act::Foreign(Foreign::Holder) => {
                write!(f, "FOREIGN WRITE: holderIdentity set to \"someone\"")
            }
            Act::Foreign(Foreign::Empty) => write!(f, "FOREIGN WRITE: holderIdentity set to \"\""),
            Act::Foreign(Foreign::Delete) => write!(f, "FOREIGN WRITE: the Lease is deleted"),
            Act::Foreign(Foreign::Touch) => write!(f, "FOREIGN WRITE: another field changed"),
        }
    }
}

/// The Lease model under one [`Config`].
pub struct LeaseModel(pub Config);

impl Model for LeaseModel {
    type State = St;
    type Action = Act;
    type Key = super::canon::Key;

    fn key(&self, s: &St) -> Self::Key {
        super::canon::key(s, self.0.rule)
    }

    fn init(&self) -> Vec<St> {
        let cfg = &self.0;
        // With drift, the extremes: a fast or a slow clock per candidate.
        let rates: &[i8] = if cfg.drift == 0 { &[0] } else { &[-1, 1] };
        let mut out = Vec::new();
        let n = cfg.candidates;
        for code in 0..rates.len().pow(n as u32) {
            let mut cands = Cands {
                n: n as u8,
                all: [Cand::fresh(0); 3],
            };
            for (i, cand) in cands.iter_mut().enumerate() {
                cand.rate = rates[code / rates.len().pow(i as u32) % rates.len()];
            }
            out.push(St {
                lease: ABSENT,
                cands,
                budget: cfg.budget,
                max_claimed: 0,
                clock: 0,
                since_crash: None,
                issued: (0, 0),
            });
        }
        out
    }

    fn actions(&self, s: &St, out: &mut Vec<Act>) {
        let Some(live) = self.0.liveness else {
            self.urgent(s, out);
            out.push(Act::Tick);
            self.faults(s, out);
            return;
        };
        self.urgent(s, out);
        if out.is_empty() && s.clock < live.horizon {
            out.push(Act::Tick);
        }
        // One crash of the leader, early enough to be checked.
        if s.budget > 0 && s.clock + live.failover_within < live.horizon {
            for (c, cand) in s.cands.iter().enumerate() {
                if cand.up && cand.lead.is_some() {
                    out.push(Act::Crash(c));
                }
            }
        }
    }

    fn step(&self, s: &St, a: &Act) -> Result<St, (St, String)> {
        let mut t = s.clone();
        let verdict = self.apply(&mut t, *a);
        super::canon::canon(&mut t);
        match verdict {
            Ok(()) => Ok(t),
            Err(reason) => Err((t, reason)),
        }
    }

    fn check(&self, s: &St) -> Option<String> {
        let claiming: Vec<usize> = (0..s.cands.len())
            .filter(|&c| claims(&s.cands[c]))
            .collect();
        if let Some(v) = overlap(&claiming, |c| s.cands[c].lead.map_or(0, |l| l.token)) {
            return Some(v);
        }
        let live = self.0.liveness?;
        let mut urgent = Vec::new();
        self.urgent(s, &mut urgent);
        if !urgent.is_empty() || !claiming.is_empty() {
            return None;
        }
        live.verdict(s.clock, s.since_crash)
    }

    fn describe(&self, s: &St) -> String {
        let mut out = describe_lease(&s.lease);
        for (c, cand) in s.cands.iter().enumerate() {
            out.push_str(" | ");
            out.push_str(&describe_cand(c, cand));
        }
        out
    }

    fn is_tick(&self, a: &Act) -> bool {
        *a == Act::Tick
    }

    fn step_raw(&self, s: &St, a: &Act) -> St {
        let mut t = s.clone();
        let _ = self.apply(&mut t, *a);
        t
    }
}

/// Whether a candidate answers `is_leader=true` (or would, on resuming).
pub fn claims(c: &Cand) -> bool {
    c.up && c.lead.is_some_and(|l| l.valid > 0)
}

fn describe_holder(h: Holder) -> String {
    match h {
        Holder::Empty => "\"\"".into(),
        Holder::Term(t) => format!("term{t}"),
        Holder::Foreign => "\"someone\"".into(),
    }
}

fn describe_lease(l: &Lease) -> String {
    if !l.present {
        return "Lease: absent".into();
    }
    let marker = if l.marker { " released" } else { "" };
    format!(
        "Lease v{} holder={} d={} token={}{marker}",
        l.ver,
        describe_holder(l.holder),
        l.d,
        l.token
    )
}

fn describe_cand(c: usize, cand: &Cand) -> String {
    let n = name(c);
    if !cand.up {
        return format!("{n}: crashed");
    }
    let rate = match cand.rate {
        -1 => " (fast clock)",
        1 => " (slow clock)",
        _ => "",
    };
    let mut out = match (&cand.lead, &cand.seen) {
        (Some(l), _) => {
            let blind = if l.watch { "" } else { ", watch lost" };
            format!(
                "{n}{rate}: LEADER term{} token {}, claims {} more ticks{blind}",
                l.term, l.token, l.valid
            )
        }
        (None, Seen::Nothing) => format!("{n}{rate}: follower, has seen nothing"),
        (None, Seen::Absent) => format!(
            "{n}{rate}: follower, saw the Lease absent, may take over in {}",
            cand.wait
        ),
        (None, Seen::Version { ver, holder, d, .. }) => format!(
            "{n}{rate}: follower, saw v{ver} (holder {}, d={d}), may take over in {}",
            describe_holder(*holder),
            cand.wait
        ),
    };
    if let Some(r) = &cand.req {
        let what = match r.kind {
            Kind::Acquire => format!("acquire of v{}", r.expect),
            Kind::Create => "create".into(),
            Kind::Renew => format!("renewal of v{}", r.expect),
            Kind::Release => format!("release of v{}", r.expect),
        };
        out.push_str(&format!(" [{what} on the wire]"));
    }
    out
}
