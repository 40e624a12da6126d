//! Canonical numbering of the Lease model's versions, fencing tokens and
//! term ids, so that states differing only in absolute numbers (which no
//! rule reads) are one state and the state space is finite although
//! versions and tokens grow for ever.
//!
//! Versions: only equality and order are read (CAS, "a newer version"), and
//! a new one is the largest + 1: ranks keep both. Tokens: order, equality
//! and "exactly one more" are read (a new token is max + 1 and must exceed
//! every token claimed): ranks with gaps of 1 kept as 1 and wider gaps
//! shrunk to 2 keep all three. Term ids: only equality: numbered by first
//! appearance.

use std::hash::{Hash, Hasher};

use super::lease::{Cand, Holder, Kind, Rule, Seen, St};

/// Up to 16 values to renumber, without allocating (this runs once per
/// transition).
#[derive(Default)]
struct Values {
    n: usize,
    v: [u8; 16],
}

impl Values {
    fn push(&mut self, x: u8) {
        if x != 0 && !self.v[..self.n].contains(&x) {
            self.v[self.n] = x;
            self.n += 1;
        }
    }

    /// The renumbering: ranks from 1 (0 stays 0); with `keep_unit_gaps`,
    /// a gap of exactly 1 stays 1 and a wider one becomes 2.
    fn table(mut self, keep_unit_gaps: bool) -> [u8; 256] {
        let vals = &mut self.v[..self.n];
        vals.sort_unstable();
        let mut map = [0u8; 256];
        let (mut prev, mut next) = (0u8, 0u8);
        for &x in vals.iter() {
            next += if keep_unit_gaps && x - prev > 1 { 2 } else { 1 };
            map[x as usize] = next;
            prev = x;
        }
        map
    }
}

/// Renumbers `s` in place.
pub fn canon(s: &mut St) {
    for c in s.cands.iter_mut() {
        if c.lead.is_some() || c.seen == Seen::Nothing {
            c.replay = 0; // read only by followers with a view
        }
    }
    s.issued = (0, 0);
    versions(s);
    tokens(s);
    terms(s);
}

fn versions(s: &mut St) {
    let mut seen = Values::default();
    seen.push(s.lease.ver);
    for c in s.cands.iter() {
        if let Seen::Version { ver, .. } = c.seen {
            seen.push(ver);
        }
        if let Some(l) = &c.lead {
            seen.push(l.ver);
        }
        if let Some(r) = &c.req {
            seen.push(r.expect);
        }
    }
    let m = seen.table(false);
    s.lease.ver = m[s.lease.ver as usize];
    for c in s.cands.iter_mut() {
        if let Seen::Version { ver, .. } = &mut c.seen {
            *ver = m[*ver as usize];
        }
        if let Some(l) = &mut c.lead {
            l.ver = m[l.ver as usize];
        }
        if let Some(r) = &mut c.req {
            r.expect = m[r.expect as usize];
        }
    }
}

fn tokens(s: &mut St) {
    let mut seen = Values::default();
    seen.push(s.lease.token);
    seen.push(s.max_claimed);
    for c in s.cands.iter() {
        if let Some(l) = &c.lead {
            seen.push(l.token);
        }
    }
    let m = seen.table(true);
    s.lease.token = m[s.lease.token as usize];
    s.max_claimed = m[s.max_claimed as usize];
    for c in s.cands.iter_mut() {
        if let Some(l) = &mut c.lead {
            l.token = m[l.token as usize];
        }
    }
}

fn terms(s: &mut St) {
    let mut map = [0u8; 256];
    let mut next = 0u8;
    let mut id = |t: &mut u8| {
        if map[*t as usize] == 0 {
            next += 1;
            map[*t as usize] = next;
        }
        *t = map[*t as usize];
    };
    if let Holder::Term(t) = &mut s.lease.holder {
        id(t);
    }
    for c in s.cands.iter_mut() {
        if let Some(l) = &mut c.lead {
            id(&mut l.term);
        }
        if let Some(r) = &mut c.req {
            id(&mut r.term);
        }
        if let Seen::Version {
            holder: Holder::Term(t),
            ..
        } = &mut c.seen
        {
            id(t);
        }
    }
}

/// A state's identity, one byte per field that some rule reads (a claimed
/// token is left out: only the monitor's maximum matters after the claim),
/// hashed as machine words.
#[derive(PartialEq, Eq)]
pub struct Key([u8; 88]);

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        for w in self.0.chunks_exact(8) {
            h.write_u64(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
    }
}

fn holder_code(h: Holder) -> u8 {
    match h {
        Holder::Empty => 0,
        Holder::Foreign => 1,
        Holder::Term(t) => 2 + t,
    }
}

/// The key of a canonical state under `rule`.
pub fn key(s: &St, rule: Rule) -> Key {
    let mut k = [0u8; 88];
    let l = &s.lease;
    let since = s.since_crash.map_or(0, |x| x + 1);
    k[..10].copy_from_slice(&[
        u8::from(l.present),
        holder_code(l.holder),
        l.d,
        l.ver,
        l.token,
        u8::from(l.marker),
        s.budget,
        s.max_claimed,
        s.clock,
        since,
    ]);
    for (i, c) in s.cands.iter().enumerate() {
        k[10 + 24 * i..10 + 24 * (i + 1)].copy_from_slice(&cand_key(c, rule));
    }
    Key(k)
}

fn cand_key(c: &Cand, rule: Rule) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[0] = u8::from(c.up);
    k[1] = (c.rate + 1) as u8;
    if let Some(l) = &c.lead {
        k[2..8].copy_from_slice(&[1, l.term, l.ver, l.valid, l.renew_in, u8::from(l.watch)]);
    }
    match c.seen {
        Seen::Nothing => {}
        Seen::Absent => k[8] = 1,
        Seen::Version {
            ver,
            holder,
            d,
            marker,
        } => {
            // Only the old rule reads a seen version's duration.
            let d = if rule == Rule::Old { d } else { 0 };
            k[8..13].copy_from_slice(&[2, ver, holder_code(holder), d, u8::from(marker)]);
        }
    }
    let chain_d = if rule == Rule::Old { 0 } else { c.chain_d };
    k[13..16].copy_from_slice(&[c.wait, chain_d, c.replay]);
    if let Some(r) = &c.req {
        let kind = match r.kind {
            Kind::Acquire => 1,
            Kind::Create => 2,
            Kind::Renew => 3,
            Kind::Release => 4,
        };
        k[16..21].copy_from_slice(&[kind, r.term, r.expect, r.valid, r.replay]);
    }
    k
}
