//! Shard ownership as a [`Model`]: N shards (1–3) over 2–3 members, each
//! shard held like a term, moved by release then acquire.
//!
//! **The store** keeps one **session** per member process (etcd: its lease;
//! Redis: the member key whose `PX` the renewal script resets with every
//! shard key's; a server-side TTL in both) and one **record** per shard:
//! absent, or bound to a session with the shard's fencing token. A record
//! lives as long as its session: when the session's TTL runs out the server
//! deletes the session and every record bound to it. Each shard has its own
//! fencing counter, counted up by every acquisition of that shard.
//!
//! **A member** grants itself a session, then claims a shard while it holds
//! the shard's record and its session's validity lasts: the real length of
//! `TTL - margin` on its own clock, counted from the *send* instant of its
//! last acknowledged grant or renewal. **One renewal renews every shard the
//! member holds** (a keep-alive of the session: one write, whatever the
//! number of shards). At the end of its validity a member stops claiming
//! every shard and forgets its session (a new one comes with new tokens).
//! - **Acquire** a shard: create its record bound to the own session if the
//!   record is absent (or already bound to that session: an acquisition
//!   whose answer was lost is taken again, with a new token), in one
//!   compare-and-swap; refused when the session is gone.
//! - **Release** a shard: stop claiming it, *then* send the deletion of its
//!   record if it is still bound to the own session.
//! - **Leave** (graceful, SIGTERM): stop claiming every shard, send the
//!   revocation of the session (which deletes its records) and exit.
//! - A crashed owner's shards are taken only once its session is gone,
//!   that is after its validity can no longer hold.
//!
//! Safety runs let any member acquire any free shard and release any
//! shard it holds at any instant: the safety argument does not depend on
//! which member the assignment names, nor on members agreeing on it.
//! Liveness runs follow an assignment computed from the members with a live
//! session (shard `i` to the `i mod m`-th), every enabled step taken before
//! time passes, renewals every `renew` ticks.
//!
//! **Clocks, network, processes** as in [`super::ttl`]: a clock runs exact,
//! or fast or slow by a tick per interval (margin 2); requests are delayed
//! arbitrarily or lost, answers lost; processes pause (their clocks run on:
//! a paused owner still counts as claiming until its validity ends), crash
//! (a request on the wire may still be applied), and start fresh (a join,
//! or a restart in a crashed member's place). A fresh process starts only
//! once its predecessor's last request is served or lost: such a request
//! names the old session, through which no running process claims.
//!
//! **Invariant**: at no instant do two members claim one shard; every claim
//! of a shard that begins carries a token above every earlier claim of that
//! shard. The twins ([`Rule`]): an acquisition that takes a shard still
//! bound to another session, and a release sent before its owner stops
//! claiming, must each make two owners.

use std::fmt;

use super::explorer::Model;
use super::lease::{Liveness, name};

/// Members and shards at most.
pub const MEMBERS: usize = 3;
pub const SHARDS: usize = 3;
/// Sessions the store can hold at once.
const SLOTS: usize = 8;

/// The rule the members follow.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rule {
    /// The protocol above.
    Safe,
    /// Broken: an acquisition overwrites a record bound to another session
    /// (acquire before the old owner's validity ends).
    TakeOver,
    /// Broken: the owner sends its release and stops claiming only when the
    /// answer comes back.
    ReleaseLate,
}

/// A fault (each spends one unit of the budget).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Fault {
    Crash,
    /// A fresh process in a member's place that is down (a join, or a
    /// restart after a crash).
    Start,
    /// A graceful leave: stop claiming, revoke the session, exit.
    Leave,
    /// A request lost before the store.
    Lose,
    /// A request applied and its answer lost.
    LoseAnswer,
}

/// One configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub rule: Rule,
    /// Members, 2 to 3; the last `late` of them start down (they join by
    /// [`Fault::Start`]).
    pub members: usize,
    pub late: usize,
    /// Shards, 1 to 3.
    pub shards: usize,
    /// The session TTL, in ticks.
    pub ttl: u8,
    /// Renew interval in liveness runs.
    pub renew: u8,
    /// Drift margin, in ticks.
    pub margin: u8,
    /// Clock rates: 0 (exact) or 1 (fast or slow by a tick per interval).
    pub drift: u8,
    pub faults: &'static [Fault],
    pub budget: u8,
    pub liveness: Option<Liveness>,
}

impl Config {
    /// Two members, two shards, TTL 2, renew 1, exact clocks, no fault.
    pub fn base(rule: Rule) -> Config {
        Config {
            rule,
            members: 2,
            late: 0,
            shards: 2,
            ttl: 2,
            renew: 1,
            margin: 0,
            drift: 0,
            faults: &[],
            budget: 0,
            liveness: None,
        }
    }
}

/// A shard's record in the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Record {
    pub member: u8,
    pub session: u8,
    pub token: u8,
}

/// What a request asks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Grant,
    Renew,
    Acquire(u8),
    Release(u8),
    /// Revoke the session (a graceful leave).
    Revoke,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Req {
    pub kind: Kind,
    pub session: u8,
    /// Grant and renewal: the validity they give, counted from the send.
    pub valid: u8,
}

/// A member's own session, as it knows it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Session {
    pub id: u8,
    pub valid: u8,
    pub renew_in: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Member {
    pub up: bool,
    pub rate: i8,
    pub session: Option<Session>,
    pub held: [bool; SHARDS],
    /// The token of each held shard (printed only).
    pub tokens: [u8; SHARDS],
    pub req: Option<Req>,
}

impl Member {
    pub fn fresh(rate: i8) -> Member {
        Member {
            up: true,
            rate,
            session: None,
            held: [false; SHARDS],
            tokens: [0; SHARDS],
            req: None,
        }
    }
}

/// The global state.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct SSt {
    pub records: [Option<Record>; SHARDS],
    /// The store's live sessions: (member, session id, real ticks left);
    /// unused slots are (0, 0, 0).
    pub sessions: [(u8, u8, u8); SLOTS],
    /// Each shard's fencing counter.
    pub counters: [u8; SHARDS],
    /// The largest token claimed so far, per shard (the monitor).
    pub max_claimed: [u8; SHARDS],
    pub members: [Member; MEMBERS],
    pub budget: u8,
    pub clock: u8,
    pub since_crash: Option<u8>,
}

/// One step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    Tick,
    Grant(usize),
    Renew(usize),
    Acquire(usize, usize),
    Release(usize, usize),
    Serve(usize),
    Fault(Fault, usize),
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Act::Tick => write!(f, "one tick of real time passes"),
            Act::Grant(c) => write!(f, "{} asks for a session", name(c)),
            Act::Renew(c) => write!(f, "{} renews its session (all its shards)", name(c)),
            Act::Acquire(c, i) => write!(f, "{} sends the acquisition of shard {i}", name(c)),
            Act::Release(c, i) => write!(f, "{} releases shard {i}", name(c)),
            Act::Serve(c) => write!(
                f,
                "the store applies {}'s request; {0} gets the answer",
                name(c)
            ),
            Act::Fault(Fault::Crash, c) => write!(f, "{} crashes", name(c)),
            Act::Fault(Fault::Start, c) => write!(f, "a fresh process starts as {}", name(c)),
            Act::Fault(Fault::Leave, c) => write!(
                f,
                "{} leaves: stops claiming, sends the revocation, exits",
                name(c)
            ),
            Act::Fault(Fault::Lose, c) => write!(f, "{}'s request is lost", name(c)),
            Act::Fault(Fault::LoseAnswer, c) => write!(
                f,
                "the store applies {}'s request; the answer is lost",
                name(c)
            ),
        }
    }
}

/// The shard model under one [`Config`].
pub struct ShardModel(pub Config);

impl Model for ShardModel {
    type State = SSt;
    type Action = Act;
    type Key = SSt;

    fn key(&self, s: &SSt) -> SSt {
        s.clone()
    }

    fn init(&self) -> Vec<SSt> {
        let cfg = &self.0;
        let rates: &[i8] = if cfg.drift == 0 { &[0] } else { &[-1, 1] };
        let n = cfg.members;
        (0..rates.len().pow(n as u32))
            .map(|code| {
                let mut members = [Member {
                    up: false,
                    ..Member::fresh(0)
                }; MEMBERS];
                for (i, m) in members.iter_mut().enumerate().take(n) {
                    let rate = rates[code / rates.len().pow(i as u32) % rates.len()];
                    *m = Member {
                        up: i < n - cfg.late,
                        ..Member::fresh(rate)
                    };
                }
                SSt {
                    records: [None; SHARDS],
                    sessions: [(0, 0, 0); SLOTS],
                    counters: [0; SHARDS],
                    max_claimed: [0; SHARDS],
                    members,
                    budget: cfg.budget,
                    clock: 0,
                    since_crash: None,
                }
            })
            .collect()
    }

    fn actions(&self, s: &SSt, out: &mut Vec<Act>) {
        self.moves(s, out);
        match self.0.liveness {
            None => {
                out.push(Act::Tick);
                self.faults(s, out);
            }
            Some(live) => {
                if out.is_empty() && s.clock < live.horizon {
                    out.push(Act::Tick);
                }
                if s.budget > 0 && s.clock + live.failover_within < live.horizon {
                    self.faults(s, out);
                }
            }
        }
    }

    fn step(&self, s: &SSt, a: &Act) -> Result<SSt, (SSt, String)> {
        let mut t = s.clone();
        let verdict = self.apply(&mut t, *a);
        canon(&mut t);
        verdict.map(|()| t.clone()).map_err(|reason| (t, reason))
    }

    fn step_raw(&self, s: &SSt, a: &Act) -> SSt {
        let mut t = s.clone();
        let _ = self.apply(&mut t, *a);
        t
    }

    fn check(&self, s: &SSt) -> Option<String> {
        for i in 0..self.0.shards {
            let owners: Vec<String> = (0..self.0.members)
                .filter(|&c| claims(&s.members[c], i))
                .map(|c| format!("{} (token {})", name(c), s.members[c].tokens[i]))
                .collect();
            if owners.len() > 1 {
                return Some(format!("{} own shard {i} at once", owners.join(" and ")));
            }
        }
        let live = self.0.liveness?;
        let mut urgent = Vec::new();
        self.moves(s, &mut urgent);
        let orphan =
            (0..self.0.shards).find(|&i| (0..self.0.members).all(|c| !claims(&s.members[c], i)))?;
        if !urgent.is_empty() {
            return None;
        }
        live.verdict(s.clock, s.since_crash)
            .map(|v| format!("shard {orphan} has no owner: {v}"))
    }

    fn describe(&self, s: &SSt) -> String {
        let records: Vec<String> = (0..self.0.shards)
            .map(|i| match s.records[i] {
                None => format!("shard{i}: free"),
                Some(r) => format!(
                    "shard{i}: {}#{} token {}",
                    name(usize::from(r.member)),
                    r.session,
                    r.token
                ),
            })
            .collect();
        let sessions: Vec<String> = s
            .sessions
            .iter()
            .filter(|x| x.2 > 0)
            .map(|x| format!("{}#{} {} left", name(usize::from(x.0)), x.1, x.2))
            .collect();
        let mut out = format!(
            "{}; sessions: [{}]",
            records.join(", "),
            sessions.join(", ")
        );
        for c in 0..self.0.members {
            out.push_str(&format!(" | {}", self.describe_member(c, &s.members[c])));
        }
        out
    }

    fn is_tick(&self, a: &Act) -> bool {
        *a == Act::Tick
    }
}

impl ShardModel {
    fn describe_member(&self, c: usize, m: &Member) -> String {
        let n = name(c);
        if !m.up {
            return format!("{n}: down");
        }
        let mut out = match &m.session {
            None => format!("{n}: no session"),
            Some(x) => {
                let owns: Vec<String> = (0..self.0.shards)
                    .filter(|&i| m.held[i])
                    .map(|i| format!("{i} (token {})", m.tokens[i]))
                    .collect();
                format!(
                    "{n}: session #{} valid {} more, owns [{}]",
                    x.id,
                    x.valid,
                    owns.join(", ")
                )
            }
        };
        if let Some(r) = &m.req {
            let what = match r.kind {
                Kind::Grant => "grant".to_string(),
                Kind::Renew => "renewal".to_string(),
                Kind::Acquire(i) => format!("acquisition of {i}"),
                Kind::Release(i) => format!("release of {i}"),
                Kind::Revoke => "revocation".to_string(),
            };
            out.push_str(&format!(" [{what} on the wire]"));
        }
        out
    }
}

/// Whether member `m` answers that it owns shard `i` right now.
pub fn claims(m: &Member, i: usize) -> bool {
    m.up && m.held[i] && m.session.is_some_and(|x| x.valid > 0)
}

/// Renumbers session ids (first appearance) and each shard's tokens by
/// rank (a new token is the counter + 1 and a claim compares tokens: only
/// their order is read).
fn canon(s: &mut SSt) {
    s.sessions
        .sort_by_key(|x| std::cmp::Reverse((x.2 > 0, x.0, x.2)));
    let mut map = [0u8; 256];
    let mut next = 0u8;
    let mut id = |t: &mut u8| {
        if *t == 0 {
            return;
        }
        if map[*t as usize] == 0 {
            next += 1;
            map[*t as usize] = next;
        }
        *t = map[*t as usize];
    };
    for x in s.sessions.iter_mut() {
        id(&mut x.1);
    }
    for r in s.records.iter_mut().flatten() {
        id(&mut r.session);
    }
    for m in s.members.iter_mut() {
        if let Some(x) = &mut m.session {
            id(&mut x.id);
        }
        if let Some(r) = &mut m.req {
            id(&mut r.session);
        }
        m.tokens = [0; SHARDS];
    }
    for i in 0..SHARDS {
        let mut vals = vec![0, s.counters[i], s.max_claimed[i]];
        if let Some(r) = &s.records[i] {
            vals.push(r.token);
        }
        vals.sort_unstable();
        vals.dedup();
        let mut map = [0u8; 256];
        for (rank, &v) in vals.iter().enumerate() {
            map[v as usize] = rank as u8;
        }
        s.counters[i] = map[s.counters[i] as usize];
        s.max_claimed[i] = map[s.max_claimed[i] as usize];
        if let Some(r) = &mut s.records[i] {
            r.token = map[r.token as usize];
        }
    }
}
