//! Failsafe as a [`Model`]: a running leader that cannot reach the backend
//! keeps leading while every roster member confirms it over direct peer
//! messages (Patroni's DCS failsafe mode, made precise).
//!
//! **The backend** is one key with a server-side TTL (etcd's lease, Redis's
//! `PX`) and a fencing counter, plus the **roster**: the set of admitted
//! members, written by the leader with the term's compare-and-swap (a
//! campaign writes it with the key; a renewal rewrites it when the key is
//! still ours). [`Rules::roster_permanent`] says whether the roster outlives
//! the key (a second key without a TTL in the same transaction; a Lease
//! annotation) or goes with it.
//!
//! **Links**: each candidate reaches the backend over its own link, and
//! each pair of candidates over a peer link; faults cut any of them
//! ([`Fault::CutBackend`], [`Fault::Outage`] cuts every backend link at
//! once, [`Fault::CutPeer`]) and heals are free. A request sent over a cut
//! link times out ([`Act::Timeout`]: the candidate sees "unreachable"); a
//! request may also be lost, or applied with its answer lost (which also
//! looks like a timeout). Peer messages are delayed arbitrarily and may be
//! lost ([`Fault::LoseMsg`]).
//!
//! **The protocol**:
//! - The leader enters failsafe only when a renewal times out (never after a
//!   refusal: the term is over then). In failsafe it keeps renewing, and
//!   sends each member of its **required set** a heartbeat `(term, bound)`
//!   where `bound` is the promise `P` minus the drift margin on its own
//!   clock, counted from the send.
//! - A member that accepts (it does not lead and has no campaign on the
//!   wire, [`Rules::refuse_while_campaigning`]) promises not to campaign for
//!   `P` on its own clock from the receipt, and acknowledges.
//! - The leader claims while its lease validity lasts **or** while the
//!   smallest bound acknowledged by every member of its required set lasts.
//!   Once neither holds it steps down for good (late acknowledgements are
//!   ignored). The required set is every roster it sent in this term since
//!   its last acknowledged renewal ([`Rules::required_union`]).
//! - When the backend answers again, a renewal extends the term; when the
//!   key expired meanwhile, a renewal in failsafe re-creates it (a new
//!   fencing token), since only promised members could have campaigned.
//! - A candidate campaigns only when it reaches the backend, sees no key,
//!   holds no promise, has waited `P` since it started
//!   ([`Rules::restart_wait`]: a restarted process has forgotten what it
//!   promised) and is on the roster (or no roster exists yet); a candidate
//!   registers itself (the candidate registry) and is admitted to the
//!   roster by the leader's next campaign or renewal.
//!
//! **Invariant**: never two `is_leader=true` at one instant; every claim
//! that begins carries a token above every earlier one. Liveness runs
//! ([`FLive`]) schedule a whole outage and check that the leader keeps
//! leading through it, that it steps down by its bound when a member stops
//! confirming, and that failover works again after the backend is back.

use std::fmt;

use super::explorer::Model;
use super::lease::{Liveness, name, overlap};

/// The protocol's rules, each with the unsafe twin the model refutes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Rules {
    /// The roster outlives the key (off: it expires with the term).
    pub roster_permanent: bool,
    /// The leader requires acknowledgements from every roster it sent this
    /// term (off: only from the last roster the backend acknowledged).
    pub required_union: bool,
    /// A member with a campaign on the wire refuses heartbeats.
    pub refuse_while_campaigning: bool,
    /// A (re)started process waits the promise `P` before campaigning.
    pub restart_wait: bool,
}

/// Every rule on.
pub const SAFE: Rules = Rules {
    roster_permanent: true,
    required_union: true,
    refuse_while_campaigning: true,
    restart_wait: true,
};

/// A scheduled liveness run.
#[derive(Clone, Copy, Debug)]
pub struct FLive {
    pub base: Liveness,
    /// Every backend link is cut at this time and healed at the second.
    pub outage: (u8, u8),
    /// The peer link between A and B is cut at this time (during the
    /// outage), and A must not claim from this many ticks after.
    pub cut_peer: Option<(u8, u8)>,
    /// The leader may crash (once) from this time on.
    pub crash_from: u8,
}

/// One configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Failsafe on (off: today's rule; the roster and heartbeats unused).
    pub failsafe: bool,
    pub rules: Rules,
    /// Number of candidates, 2 or 3.
    pub candidates: usize,
    /// Candidates that start unregistered (they join later), as a bit mask.
    pub joining: u8,
    /// Key TTL, promise `P`, renew interval, drift margin, in ticks.
    pub ttl: u8,
    pub promise: u8,
    pub renew: u8,
    pub margin: u8,
    /// Clock rates: 0 (exact) or 1 (±1 tick per interval).
    pub drift: u8,
    pub faults: &'static [Fault],
    pub budget: u8,
    pub live: Option<FLive>,
}

impl Config {
    /// Failsafe on with every rule, 3 candidates of which C joins later,
    /// TTL and promise 2 (liveness runs: 3), exact clocks.
    pub fn base(faults: &'static [Fault], budget: u8) -> Config {
        Config {
            failsafe: true,
            rules: SAFE,
            candidates: 3,
            joining: 0b100,
            ttl: 2,
            promise: 2,
            renew: 2,
            margin: 0,
            drift: 0,
            faults,
            budget,
            live: None,
        }
    }
}

/// A fault (each spends one unit of budget; heals are free).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Fault {
    /// One candidate's link to the backend is cut.
    CutBackend,
    /// Every backend link is cut (the backend is down for everyone).
    Outage,
    /// One peer link is cut (both ways).
    CutPeer,
    /// A heartbeat or an acknowledgement on the wire is lost.
    LoseMsg,
    /// A backend request is lost before the server (seen as a timeout).
    Lose,
    /// A backend request is applied and its answer lost (a timeout).
    LoseAnswer,
    Crash,
    /// Replaced by a fresh process: it forgets its promise and its term.
    Restart,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FKey {
    pub term: u8,
    pub token: u8,
    /// Real ticks left before the server forgets the key.
    pub ttl: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FLead {
    pub term: u8,
    pub token: u8,
    /// Real ticks of claiming left from the last acknowledged write.
    pub valid: u8,
    pub renew_in: u8,
    /// In failsafe (a renewal timed out).
    pub fs: bool,
    /// Members whose confirmation the leader needs (bit mask).
    pub required: u8,
    /// Per member: real ticks left of the bound it acknowledged.
    pub conf: [u8; 3],
    /// Liveness runs: members sent a heartbeat this round.
    pub sent: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    Campaign,
    Renew,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FReq {
    pub kind: Kind,
    pub term: u8,
    /// Real ticks of validity a success gives, counting down from the send.
    pub valid: u8,
    /// The roster this write carries.
    pub roster: u8,
    /// A renewal sent in failsafe: may re-create an expired key.
    pub recreate: bool,
}

/// A heartbeat to a member, or its acknowledgement back.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Msg {
    pub from: u8,
    pub term: u8,
    /// Real ticks left of the bound the leader will count.
    pub bound: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FCand {
    pub up: bool,
    pub rate: i8,
    pub registered: bool,
    pub lead: Option<FLead>,
    pub req: Option<FReq>,
    /// Real ticks left of the promise not to campaign.
    pub promise: u8,
    /// Real ticks left of the wait after a (re)start.
    pub startup: u8,
    /// The heartbeat on the wire to this candidate.
    pub hb: Option<Msg>,
    /// This candidate's acknowledgement on the wire.
    pub ack: Option<Msg>,
}

/// The global state.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct FSt {
    pub key: Option<FKey>,
    pub roster: u8,
    pub counter: u8,
    /// Backend links up (bit per candidate).
    pub backend: u8,
    /// Peer links cut (bit per pair: AB, AC, BC).
    pub peers_cut: u8,
    pub cands: [FCand; 3],
    pub budget: u8,
    pub max_claimed: u8,
    pub clock: u8,
    pub since_crash: Option<u8>,
}

/// One step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    Tick,
    Register(usize),
    Campaign(usize),
    Renew(usize),
    Serve(usize),
    Timeout(usize),
    /// The leader sends a heartbeat to a member.
    Heartbeat(usize, usize),
    /// A member receives its heartbeat.
    Deliver(usize),
    /// The leader receives a member's acknowledgement.
    Ack(usize),
    HealBackend(usize),
    HealPeer(usize),
    Fault(Fault, usize),
}

/// The peer link between `a` and `b` (its bit index).
pub fn pair(a: usize, b: usize) -> usize {
    match (a.min(b), a.max(b)) {
        (0, 1) => 0,
        (0, 2) => 1,
        _ => 2,
    }
}

const PAIRS: [&str; 3] = ["A-B", "A-C", "B-C"];

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Act::Tick => write!(f, "one tick of real time passes"),
            Act::Register(c) => write!(f, "{} registers as a candidate", name(c)),
            Act::Campaign(c) => write!(f, "{} campaigns (with the roster)", name(c)),
            Act::Renew(c) => write!(f, "{} sends a renewal (with the roster)", name(c)),
            Act::Serve(c) => write!(f, "the backend applies {}'s request; answered", name(c)),
            Act::Timeout(c) => write!(f, "{}'s request times out (unreachable)", name(c)),
            Act::Heartbeat(c, m) => write!(f, "{} sends a heartbeat to {}", name(c), name(m)),
            Act::Deliver(m) => write!(f, "{} receives its heartbeat", name(m)),
            Act::Ack(m) => write!(f, "the leader receives {}'s acknowledgement", name(m)),
            Act::HealBackend(c) => write!(f, "{} reaches the backend again", name(c)),
            Act::HealPeer(p) => write!(f, "peer link {} heals", PAIRS[p]),
            Act::Fault(k, c) => match k {
                Fault::CutBackend => write!(f, "CUT: {} loses the backend", name(c)),
                Fault::Outage => write!(f, "OUTAGE: nobody reaches the backend"),
                Fault::CutPeer => write!(f, "CUT: peer link {}", PAIRS[c]),
                Fault::LoseMsg => write!(f, "{}'s heartbeat or acknowledgement is lost", name(c)),
                Fault::Lose => write!(f, "{}'s request is lost (a timeout)", name(c)),
                Fault::LoseAnswer => write!(
                    f,
                    "the backend applies {}'s request; the answer is lost (a timeout)",
                    name(c)
                ),
                Fault::Crash => write!(f, "{} crashes", name(c)),
                Fault::Restart => write!(f, "{} restarts (a fresh process)", name(c)),
            },
        }
    }
}

/// The failsafe model under one [`Config`].
pub struct FailsafeModel(pub Config);

/// Whether `c` answers `is_leader=true`.
pub fn claims(c: &FCand) -> bool {
    c.up && c.lead.is_some_and(|l| l.valid > 0 || fs_valid(&l) > 0)
}

/// Real ticks the leader may still claim by its members' confirmations:
/// the smallest bound over its required set (0 without failsafe or
/// without another member).
pub fn fs_valid(l: &FLead) -> u8 {
    if !l.fs || l.required == 0 {
        return 0;
    }
    (0..3)
        .filter(|m| l.required & (1 << m) != 0)
        .map(|m| l.conf[m])
        .min()
        .unwrap_or(0)
}

impl Model for FailsafeModel {
    type State = FSt;
    type Action = Act;
    type Key = FSt;

    fn key(&self, s: &FSt) -> FSt {
        s.clone()
    }

    fn init(&self) -> Vec<FSt> {
        let cfg = &self.0;
        let rates: &[i8] = if cfg.drift == 0 { &[0] } else { &[-1, 1] };
        let n = cfg.candidates;
        let all = (1u8 << n) - 1;
        (0..rates.len().pow(n as u32))
            .map(|code| {
                let mut cands = [FCand::fresh(0, false, 0); 3];
                for (i, c) in cands.iter_mut().enumerate().take(n) {
                    let rate = rates[code / rates.len().pow(i as u32) % rates.len()];
                    *c = FCand::fresh(rate, cfg.joining & (1 << i) == 0, 0);
                }
                FSt {
                    key: None,
                    roster: 0,
                    counter: 0,
                    backend: all,
                    peers_cut: 0,
                    cands,
                    budget: cfg.budget,
                    max_claimed: 0,
                    clock: 0,
                    since_crash: None,
                }
            })
            .collect()
    }

    fn actions(&self, s: &FSt, out: &mut Vec<Act>) {
        self.moves(s, out);
        match self.0.live {
            None => {
                out.push(Act::Tick);
                self.heals(s, out);
                self.faults(s, out);
            }
            Some(live) => {
                if out.is_empty() && s.clock < live.base.horizon {
                    out.push(Act::Tick);
                }
                if s.budget > 0 && s.clock >= live.crash_from {
                    for c in 0..self.0.candidates {
                        if claims(&s.cands[c]) {
                            out.push(Act::Fault(Fault::Crash, c));
                        }
                    }
                }
            }
        }
    }

    fn step(&self, s: &FSt, a: &Act) -> Result<FSt, (FSt, String)> {
        let mut t = s.clone();
        let verdict = self.apply(&mut t, *a);
        canon(&mut t, self.0.live.is_some());
        verdict.map(|()| t.clone()).map_err(|reason| (t, reason))
    }

    fn step_raw(&self, s: &FSt, a: &Act) -> FSt {
        let mut t = s.clone();
        let _ = self.apply(&mut t, *a);
        t
    }

    fn check(&self, s: &FSt) -> Option<String> {
        let claiming: Vec<usize> = (0..self.0.candidates)
            .filter(|&c| claims(&s.cands[c]))
            .collect();
        if let Some(v) = overlap(&claiming, |c| s.cands[c].lead.map_or(0, |l| l.token)) {
            return Some(v);
        }
        let live = self.0.live?;
        if let Some((at, within)) = live.cut_peer
            && s.clock >= at + within
            && s.clock < live.outage.1
            && claims(&s.cands[0])
        {
            return Some(format!(
                "A still claims at t={} although B stopped confirming at t={at}",
                s.clock
            ));
        }
        let mut urgent = Vec::new();
        self.moves(s, &mut urgent);
        if !urgent.is_empty() || !claiming.is_empty() {
            return None;
        }
        live.base.verdict(s.clock, s.since_crash)
    }

    fn describe(&self, s: &FSt) -> String {
        let mut out = match s.key {
            None => "key: absent".to_string(),
            Some(k) => format!("key: term{} token={} ttl {}", k.term, k.token, k.ttl),
        };
        out.push_str(&format!(", roster {}", members(s.roster)));
        let cut: Vec<String> = (0..self.0.candidates)
            .filter(|c| s.backend & (1 << c) == 0)
            .map(|c| format!("{}-backend", name(c)))
            .chain(
                (0..3)
                    .filter(|p| s.peers_cut & (1 << p) != 0)
                    .map(|p| PAIRS[p].into()),
            )
            .collect();
        if !cut.is_empty() {
            out.push_str(&format!(", cut: {}", cut.join(" ")));
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

impl FCand {
    pub fn fresh(rate: i8, registered: bool, startup: u8) -> FCand {
        FCand {
            up: true,
            rate,
            registered,
            lead: None,
            req: None,
            promise: 0,
            startup,
            hb: None,
            ack: None,
        }
    }
}

fn members(mask: u8) -> String {
    let m: String = (0..3).filter(|c| mask & (1 << c) != 0).map(name).collect();
    format!("{{{m}}}")
}

fn describe_cand(c: usize, cand: &FCand) -> String {
    let n = name(c);
    if !cand.up {
        return format!("{n}: crashed");
    }
    let mut out = match &cand.lead {
        Some(l) if l.fs => format!(
            "{n}: LEADER term{} token {}, lease {} more, FAILSAFE needs {} confirmed {}",
            l.term,
            l.token,
            l.valid,
            members(l.required),
            fs_valid(l)
        ),
        Some(l) => format!(
            "{n}: LEADER term{} token {}, claims {} more",
            l.term, l.token, l.valid
        ),
        None => format!("{n}: follower"),
    };
    if !cand.registered {
        out.push_str(" (unregistered)");
    }
    if cand.promise > 0 {
        out.push_str(&format!(" promised {} more", cand.promise));
    }
    if cand.startup > 0 {
        out.push_str(&format!(" starting {} more", cand.startup));
    }
    if let Some(r) = &cand.req {
        let what = if r.kind == Kind::Campaign {
            "campaign"
        } else {
            "renewal"
        };
        out.push_str(&format!(" [{what} on the wire]"));
    }
    if cand.hb.is_some() {
        out.push_str(" [heartbeat to it on the wire]");
    }
    if cand.ack.is_some() {
        out.push_str(" [its ack on the wire]");
    }
    out
}

/// Renumbers term ids (first appearance) and tokens (order, equality and
/// "one more" kept), as the other models do, and clears what no rule
/// reads: the renewal and heartbeat cadence outside liveness runs, the
/// bounds of members the leader does not require.
fn canon(s: &mut FSt, live: bool) {
    for c in s.cands.iter_mut() {
        if let Some(l) = &mut c.lead {
            if !live {
                (l.renew_in, l.sent) = (0, 0);
            }
            for m in 0..3 {
                if l.required & (1 << m) == 0 {
                    l.conf[m] = 0;
                }
            }
        }
    }
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
    if let Some(k) = &mut s.key {
        id(&mut k.term);
    }
    for c in s.cands.iter_mut() {
        if let Some(l) = &mut c.lead {
            id(&mut l.term);
            l.token = 0; // printed only (raw traces keep it)
        }
        if let Some(r) = &mut c.req {
            id(&mut r.term);
        }
        for m in [&mut c.hb, &mut c.ack].into_iter().flatten() {
            id(&mut m.term);
        }
    }
    let mut vals: Vec<u8> = vec![0, s.counter, s.max_claimed];
    if let Some(k) = &s.key {
        vals.push(k.token);
    }
    vals.sort_unstable();
    vals.dedup();
    let mut tok = [0u8; 256];
    let mut n = 0u8;
    for w in vals.windows(2) {
        n += if w[1] - w[0] > 1 { 2 } else { 1 };
        tok[w[1] as usize] = n;
    }
    s.counter = tok[s.counter as usize];
    s.max_claimed = tok[s.max_claimed as usize];
    if let Some(k) = &mut s.key {
        k.token = tok[k.token as usize];
    }
}
