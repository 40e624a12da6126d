//! etcd and Redis as a [`Model`]: backends whose server ends a term by
//! itself (a lease's TTL, a key's `PX`), under the same candidates, clocks,
//! network and faults as [`super::lease`].
//!
//! - **etcd**: a campaign grants a lease (TTL counted by the server from when
//!   it serves the request) and creates the key bound to it if the key is
//!   absent; before that it checks that the lease of the holder it last saw
//!   is gone (`LeaseTimeToLive`), so a key deleted by hand does not end the
//!   holder's term. The fencing token is the revision of the write that
//!   began the term (the claim's create, or the handover's put below). A
//!   renewal is a keep-alive plus a read proving the key is still bound to
//!   the lease (and, with the handover, still names the renewer). The holder's watch sees its key deleted or overwritten, and
//!   then it stops claiming and revokes its lease. Resigning revokes the
//!   lease (which deletes the key).
//! - **Redis**: a campaign sets the key with `PX` if it is absent and counts
//!   the fencing counter up (`INCR`, kept beside the key); a renewal checks
//!   the key carries our random token and resets `PX`; resigning deletes the
//!   key if it is ours. The holder learns that its key is gone only at its
//!   next renewal (Redis has no watch of the key here).
//!
//! - **etcd, handover by one write** ([`Handover`], off unless a
//!   configuration asks; `src/backend/etcd/handover.rs`): a leader holds a
//!   spare *next lease* from the start of its term (granted with its claim
//!   or adoption, refreshed with its renewals). A release naming a
//!   successor ([`Fault::ReleaseTo`]), while the key is still bound to the
//!   leader's lease and the next lease lives, puts the key naming the
//!   successor under the next lease and the release mark (that put's
//!   revision) in one write, and leaves the old lease to expire; else it
//!   revokes as before. The successor that sees a put naming it **adopts**
//!   with no write: a keep-alive of the next lease and a read that the key
//!   is still that put, that the release mark's revision is the put's, and
//!   that its adopter mark (written when the process started; the code
//!   also rewrites it when it republishes its record) is older
//!   than the put. Its token is the put's revision. A hand put naming a
//!   follower under the holder's own lease ([`Fault::PutNamed`]) bumps the
//!   revision but writes no release mark; [`Handover::PutAlone`], which
//!   adopts on the put alone, is the twin that must fail. With
//!   [`Config::ttls`] the candidates' TTLs differ (issue 50): the next
//!   lease is granted with the leader's TTL, and a taker whose TTL differs
//!   **swaps**: its adoption is one write that compares what the adoption
//!   reads and puts the key naming it under a new lease of its own TTL (its
//!   token that put's revision). [`Handover::KeepsLease`] (the rule before:
//!   the next lease as granted) is the liveness twin, and
//!   [`Handover::NoSwap`] (its own TTL claimed under the next lease) the
//!   safety twin. A process tries
//!   each put once (`TCand::tried`): the code adopts a put at most once
//!   too, but tries a failed adoption again at a later campaign. Not
//!   modelled: the pause, two live processes with one identity, a successor
//!   without a mark (an older version), requests applied after their caller
//!   gave up on them, the claim's shortcut through the release mark.
//!
//! Both: the leader claims until (send instant of its last acknowledged
//! campaign or renewal) + TTL − margin on its own clock; the server's clock
//! runs at real rate (etcd lease and Redis `PX` timers are the server's).
//! Foreign writes: etcd — delete the key (its lease runs on), revoke the
//! holder's lease (`etcdctl lease revoke`: the key goes with it), put the
//! key without a lease; Redis — `DEL` the key, `SET` it without `PX`.
//! A follower campaigns when it sees the key gone (etcd: its watch; Redis:
//! it wakes at the key's `PTTL` or a release notice): a campaign sent while
//! the key exists could only succeed after the key went, later than one
//! sent then. The etcd campaign's previous holder is the one it had seen
//! when it sent it. The leader's validity, faults, watch semantics (etcd
//! followers, [`Observe`]) and answers are as in [`super::lease`].

use std::fmt;
use std::hash::Hash;

use super::explorer::Model;
use super::lease::{Liveness, Observe, name, overlap};

/// Which backend.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backend {
    Etcd,
    Redis,
}

/// Whether and how etcd's handover by one write runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Handover {
    /// Releases revoke; nobody adopts (the claim only).
    Off,
    /// The product's rule: the adoption checks the key, the release mark
    /// and the adopter mark.
    Marked,
    /// A broken rule, the twin that must fail: the successor adopts any put
    /// of the key naming it while its lease lives.
    PutAlone,
    /// The rule before issue 50, the liveness twin of the swap: the
    /// successor adopts the next lease as it was granted (the old leader's
    /// TTL), so its crash costs that TTL, not its own.
    KeepsLease,
    /// A broken rule, the safety twin of the swap: the successor claims its
    /// own TTL while the key stays under the next lease of a shorter one.
    NoSwap,
}

/// A fault of the TTL backends (each spends one unit of budget).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Fault {
    /// The key deleted by hand (etcd: `etcdctl del`; Redis: `DEL`).
    DeleteKey,
    /// etcd: the holder's lease revoked by hand.
    RevokeLease,
    /// The key overwritten by hand without a lease or `PX`.
    PutKey,
    /// etcd: the key put by hand naming a follower, under the holder's own
    /// lease (`etcdctl put --lease`): a new revision, no release mark.
    PutNamed,
    /// The leader resigns naming a successor ([`Act::HandOver`]).
    ReleaseTo,
    Crash,
    /// Replaced by a fresh process that knows nothing.
    Restart,
    /// A request lost before the server.
    Lose,
    /// A request applied and its answer lost.
    LoseAnswer,
    Release,
}

/// One configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub backend: Backend,
    /// etcd followers: `Watch` sees every change of the key in order (the
    /// etcd watch from a revision), `Reads` may miss some (a compacted
    /// watch, a re-read).
    pub observe: Observe,
    /// Number of candidates, 1 to 3.
    pub candidates: usize,
    /// The TTL (etcd lease, Redis `PX`), in ticks; every candidate's but
    /// those [`Config::ttls`] names.
    pub ttl: u8,
    /// A's and B's own TTLs when they differ from `ttl` (a rolling update
    /// that changes `--lease-duration`, issue 50); C's is `ttl`.
    pub ttls: Option<[u8; 2]>,
    /// Renew interval in liveness runs (safety runs renew at any instant).
    pub renew: u8,
    /// Drift margin, in ticks.
    pub margin: u8,
    /// Clock rates: 0 (exact) or 1 (fast or slow by a tick per interval).
    pub drift: u8,
    /// The kinds of fault that may happen.
    pub faults: &'static [Fault],
    /// How many faults at most in one run (all kinds together).
    pub budget: u8,
    /// Check that no two claim at once (off: check only the tokens).
    pub exclusion: bool,
    pub liveness: Option<Liveness>,
    /// etcd's handover by one write.
    pub handover: Handover,
}

impl Config {
    /// Two candidates, TTL 3, renew 2, exact clocks, no fault.
    pub fn base(backend: Backend) -> Config {
        Config {
            backend,
            observe: Observe::Watch,
            candidates: 2,
            ttl: 3,
            ttls: None,
            renew: 2,
            margin: 0,
            drift: 0,
            faults: &[],
            budget: 0,
            exclusion: true,
            liveness: None,
            handover: Handover::Off,
        }
    }
}

/// Term ids: 0 is "none", [`FOREIGN`] a value written by hand.
pub const FOREIGN: u8 = 0xFF;

/// The key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Key {
    /// The term (etcd: its lease; Redis: its random token) or [`FOREIGN`].
    pub term: u8,
    pub token: u8,
    /// Redis: real ticks left of `PX` (0: no expiry). etcd: unused (the
    /// key lives as long as its lease).
    pub px: u8,
    /// The candidate the key names (its index + 1; 0: none, a hand write).
    pub named: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Campaign,
    Renew,
    Resign,
    /// etcd: take over the term a release's put named us for.
    Adopt,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Req {
    pub kind: Kind,
    pub term: u8,
    /// etcd campaign: the term whose lease must be gone first (0: none);
    /// etcd release with the handover: the next lease's term.
    pub prev: u8,
    pub valid: u8,
    /// Release: the successor named (index + 1; 0: none).
    pub succ: u8,
    /// Adoption: the revision of the put it adopts.
    pub token: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TLead {
    pub term: u8,
    pub valid: u8,
    pub renew_in: u8,
    pub token: u8,
    /// etcd with the handover: the next lease's term (0: none).
    pub next: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TCand {
    pub up: bool,
    pub rate: i8,
    pub lead: Option<TLead>,
    /// The holder last seen (etcd; 0: none seen, or seen absent first).
    pub seen: u8,
    /// Whether the key as it is now has been observed (etcd watch mode).
    pub current: bool,
    pub req: Option<Req>,
    /// etcd with the handover: the revision of this process's adopter mark.
    pub adopter: u8,
    /// etcd with the handover: the put it last tried to adopt.
    pub tried: u8,
}

impl TCand {
    pub fn fresh(rate: i8) -> TCand {
        TCand {
            up: true,
            rate,
            lead: None,
            seen: 0,
            current: false,
            req: None,
            adopter: 0,
            tried: 0,
        }
    }
}

/// The global state.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct TSt {
    pub key: Option<Key>,
    /// etcd leases alive: (term, real ticks left, granted TTL); unused
    /// slots are (0, 0, 0).
    pub leases: [(u8, u8, u8); 12],
    /// The fencing counter (etcd: the revision of the last key creation;
    /// Redis: the counter beside the key).
    pub counter: u8,
    pub cands: [TCand; 3],
    /// etcd with the handover: the release mark's revision (0: none).
    pub mark: u8,
    pub budget: u8,
    pub max_claimed: u8,
    pub clock: u8,
    pub since_crash: Option<u8>,
    /// With [`Config::ttls`]: the failover bound of the last crash or
    /// release (a crashed holder's own TTL, a release's next lease's).
    pub due: u8,
}

/// One step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    Tick,
    Observe(usize),
    Campaign(usize),
    Renew(usize),
    Serve(usize),
    /// etcd: a follower sends its adoption of the put naming it.
    Adopt(usize),
    /// The leader resigns naming the second candidate its successor.
    HandOver(usize, usize),
    Fault(Fault, usize),
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Act::Tick => write!(f, "one tick of real time passes"),
            Act::Observe(c) => write!(f, "{} observes the key (watch event or read)", name(c)),
            Act::Campaign(c) => write!(f, "{} campaigns", name(c)),
            Act::Adopt(c) => write!(f, "{} adopts the term the key names it for", name(c)),
            Act::HandOver(c, s) => write!(
                f,
                "{} resigns naming {} its successor: stops claiming, sends the release",
                name(c),
                name(s)
            ),
            Act::Renew(c) => write!(f, "{} sends a renewal", name(c)),
            Act::Serve(c) => write!(
                f,
                "the server applies {}'s request; {0} gets the answer",
                name(c)
            ),

            Act::Fault(Fault::DeleteKey, _) => write!(f, "FOREIGN WRITE: the key is deleted"),
            Act::Fault(Fault::RevokeLease, _) => {
                write!(f, "FOREIGN WRITE: the holder's lease is revoked")
            }
            Act::Fault(Fault::PutKey, _) => {
                write!(f, "FOREIGN WRITE: the key is overwritten (no TTL)")
            }
            Act::Fault(Fault::Crash, c) => write!(f, "{} crashes", name(c)),
            Act::Fault(Fault::Restart, c) => {
                write!(f, "{} is replaced by a fresh process", name(c))
            }
            Act::Fault(Fault::Lose, c) => write!(f, "{}'s request is lost", name(c)),
            Act::Fault(Fault::LoseAnswer, c) => write!(
                f,
                "the server applies {}'s request; the answer is lost",
                name(c)
            ),
            Act::Fault(Fault::PutNamed, c) => write!(
                f,
                "FOREIGN WRITE: the key is put naming {} under the holder's lease",
                name(c)
            ),
            Act::Fault(Fault::ReleaseTo, _) => write!(f, "a release naming a successor"),
            Act::Fault(Fault::Release, c) => {
                write!(f, "{} resigns: stops claiming, sends the release", name(c))
            }
        }
    }
}

/// The TTL backends' model under one [`Config`].
pub struct TtlModel(pub Config);

impl Model for TtlModel {
    type State = TSt;
    type Action = Act;
    type Key = TSt;

    fn key(&self, s: &TSt) -> TSt {
        s.clone()
    }

    fn init(&self) -> Vec<TSt> {
        let cfg = &self.0;
        let rates: &[i8] = if cfg.drift == 0 { &[0] } else { &[-1, 1] };
        let n = cfg.candidates;
        (0..rates.len().pow(n as u32))
            .map(|code| {
                let mut cands = [TCand {
                    up: false,
                    ..TCand::fresh(0)
                }; 3];
                for (i, c) in cands.iter_mut().enumerate().take(n) {
                    *c = TCand::fresh(rates[code / rates.len().pow(i as u32) % rates.len()]);
                }
                TSt {
                    key: None,
                    leases: [(0, 0, 0); 12],
                    counter: 0,
                    cands,
                    mark: 0,
                    budget: cfg.budget,
                    max_claimed: 0,
                    clock: 0,
                    since_crash: None,
                    due: 0,
                }
            })
            .collect()
    }

    fn actions(&self, s: &TSt, out: &mut Vec<Act>) {
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
                    // With the handover, a follower may crash too (the
                    // successor a release names may be dead), while another
                    // candidate stays up to lead.
                    let handover = self.0.handover != Handover::Off;
                    let up = s.cands.iter().filter(|c| c.up).count();
                    for c in 0..self.0.candidates {
                        let cand = &s.cands[c];
                        if (claims(cand) && !handover) || (handover && cand.up && up > 1) {
                            out.push(Act::Fault(Fault::Crash, c));
                        }
                    }
                    self.handovers(s, out);
                }
            }
        }
    }

    fn step(&self, s: &TSt, a: &Act) -> Result<TSt, (TSt, String)> {
        let mut t = s.clone();
        let verdict = self.apply(&mut t, *a);
        canon(&mut t);
        verdict.map(|()| t.clone()).map_err(|reason| (t, reason))
    }

    fn step_raw(&self, s: &TSt, a: &Act) -> TSt {
        let mut t = s.clone();
        let _ = self.apply(&mut t, *a);
        t
    }

    fn check(&self, s: &TSt) -> Option<String> {
        let claiming: Vec<usize> = (0..self.0.candidates)
            .filter(|&c| claims(&s.cands[c]))
            .collect();
        if self.0.exclusion
            && let Some(v) = overlap(&claiming, |c| s.cands[c].lead.map_or(0, |l| l.token))
        {
            return Some(v);
        }
        let live = self.0.liveness?;
        let mut urgent = Vec::new();
        self.moves(s, &mut urgent);
        if !urgent.is_empty() || !claiming.is_empty() {
            return None;
        }
        let within = if s.due > 0 {
            s.due
        } else {
            live.failover_within
        };
        let live = super::lease::Liveness {
            failover_within: within,
            ..live
        };
        live.verdict(s.clock, s.since_crash)
    }

    fn describe(&self, s: &TSt) -> String {
        let mut out = match s.key {
            None => "key: absent".to_string(),
            Some(k) if k.term == FOREIGN => "key: a value written by hand".to_string(),
            Some(k) if self.0.backend == Backend::Redis => {
                format!("key: term{} token={} PX {}", k.term, k.token, k.px)
            }
            Some(k) if k.named > 0 => format!(
                "key: term{} token={} names {}",
                k.term,
                k.token,
                name(usize::from(k.named) - 1)
            ),
            Some(k) => format!("key: term{} token={}", k.term, k.token),
        };
        if s.mark > 0 {
            out.push_str(&format!(", release mark {}", s.mark));
        }
        if self.0.backend == Backend::Etcd {
            let leases: Vec<String> = s
                .leases
                .iter()
                .filter(|l| l.1 > 0)
                .map(|l| format!("term{} {} left of {}", l.0, l.1, l.2))
                .collect();
            out.push_str(&format!(", leases: [{}]", leases.join(", ")));
        }
        for c in 0..self.0.candidates {
            out.push_str(&format!(" | {}", describe_cand(c, &s.cands[c])));
        }
        out
    }

    fn is_tick(&self, a: &Act) -> bool {
        *a == Act::Tick
    }
}

/// Whether a candidate answers `is_leader=true`.
pub fn claims(c: &TCand) -> bool {
    c.up && c.lead.is_some_and(|l| l.valid > 0)
}

fn describe_cand(c: usize, cand: &TCand) -> String {
    let n = name(c);
    if !cand.up {
        return format!("{n}: crashed");
    }
    let mut out = match &cand.lead {
        Some(l) => format!(
            "{n}: LEADER term{} token {}, claims {} more ticks",
            l.term, l.token, l.valid
        ),
        None if cand.seen == 0 => format!("{n}: follower"),
        None => format!("{n}: follower, last saw term{}", cand.seen),
    };
    if let Some(r) = &cand.req {
        let what = match r.kind {
            Kind::Campaign => "campaign",
            Kind::Renew => "renewal",
            Kind::Resign => "release",
            Kind::Adopt => "adoption",
        };
        out.push_str(&format!(" [{what} on the wire]"));
    }
    out
}

/// Renumbers term ids (first appearance) and tokens (order, equality and
/// "one more" kept), as [`super::canon`] does for the Lease.
fn canon(s: &mut TSt) {
    let mut map = [0u8; 256];
    map[FOREIGN as usize] = FOREIGN;
    let mut next = 0u8;
    let mut id = |t: &mut u8| {
        if *t == 0 || *t == FOREIGN {
            return;
        }
        if map[*t as usize] == 0 {
            next += 1;
            map[*t as usize] = next;
        }
        *t = map[*t as usize];
    };
    if let Some(k) = &mut s.key {
        id(&mut k.term);
    }
    s.leases.sort_by_key(|l| std::cmp::Reverse(*l));
    for l in s.leases.iter_mut() {
        id(&mut l.0);
    }
    for c in s.cands.iter_mut() {
        if let Some(l) = &mut c.lead {
            id(&mut l.term);
            id(&mut l.next);
            l.token = 0; // printed only (raw traces keep it)
        }
        if let Some(r) = &mut c.req {
            id(&mut r.term);
            id(&mut r.prev);
        }
        id(&mut c.seen);
    }
    canon_tokens(s);
}

fn canon_tokens(s: &mut TSt) {
    // The handover's marks matter only beside the put they may match (the
    // key's, or an adoption's on the wire): forget the others, so states
    // that differ only in stale marks are one.
    let live: Vec<u8> = s
        .key
        .iter()
        .map(|k| k.token)
        .chain(s.cands.iter().filter_map(|c| c.req.map(|r| r.token)))
        .filter(|&t| t > 0)
        .collect();
    if !live.contains(&s.mark) {
        s.mark = 0;
    }
    let oldest = live.iter().copied().min().unwrap_or(u8::MAX);
    for c in s.cands.iter_mut() {
        if !live.contains(&c.tried) {
            c.tried = 0;
        }
        // Older than every put it may be compared with: as old as any.
        if c.adopter < oldest {
            c.adopter = 0;
        }
    }
    let mut vals: Vec<u8> = vec![0, s.counter, s.max_claimed, s.mark];
    if let Some(k) = &s.key {
        vals.push(k.token);
    }
    for c in &s.cands {
        vals.extend([c.adopter, c.tried]);
        if let Some(r) = &c.req {
            vals.push(r.token);
        }
    }
    vals.sort_unstable();
    vals.dedup();
    let mut map = [0u8; 256];
    let mut next = 0u8;
    for w in vals.windows(2) {
        next += if w[1] - w[0] > 1 { 2 } else { 1 };
        map[w[1] as usize] = next;
    }
    s.counter = map[s.counter as usize];
    s.max_claimed = map[s.max_claimed as usize];
    s.mark = map[s.mark as usize];
    if let Some(k) = &mut s.key {
        k.token = map[k.token as usize];
    }
    for c in s.cands.iter_mut() {
        c.adopter = map[c.adopter as usize];
        c.tried = map[c.tried as usize];
        if let Some(r) = &mut c.req {
            r.token = map[r.token as usize];
        }
    }
}
