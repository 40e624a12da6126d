//! The TTL backends' transitions (see [`super::ttl`]).

use super::lease::Observe;
use super::ttl::{
    Act, Backend, FOREIGN, Fault, Key, Kind, Req, TCand, TLead, TSt, TtlModel, claims,
};

impl TtlModel {
    fn real(&self, c: &TCand, local: u8) -> u8 {
        (i16::from(local) + i16::from(c.rate)).max(1) as u8
    }

    fn etcd(&self) -> bool {
        self.0.backend == Backend::Etcd
    }

    /// etcd, watch mode: no write until every running follower has seen
    /// the key as it is.
    fn may_write(&self, s: &TSt) -> bool {
        !self.etcd()
            || self.0.observe == Observe::Reads
            || s.cands[..self.0.candidates]
                .iter()
                .all(|c| !c.up || c.lead.is_some() || c.req.is_some() || c.current)
    }

    /// etcd, watch mode: a follower awaiting an answer handles the key's
    /// current state now, before it changes (no later than the real one,
    /// which handles it after the answer).
    fn before_write(&self, t: &mut TSt) {
        if !self.etcd() || self.0.observe == Observe::Reads {
            return;
        }
        for c in 0..self.0.candidates {
            let cand = &t.cands[c];
            if cand.up && cand.lead.is_none() && cand.req.is_some() && !cand.current {
                self.observe(t, c);
            }
        }
    }

    fn lease_alive(s: &TSt, term: u8) -> bool {
        term != 0 && s.leases.iter().any(|l| l.0 == term && l.1 > 0)
    }

    /// Whether serving `r` (of candidate `c`) would write.
    fn writes(&self, s: &TSt, r: &Req) -> bool {
        match r.kind {
            Kind::Campaign => s.key.is_none() && !(self.etcd() && Self::lease_alive(s, r.prev)),
            Kind::Renew => self.etcd() || s.key.is_some_and(|k| k.term == r.term),
            Kind::Resign => Self::lease_alive(s, r.term) || s.key.is_some_and(|k| k.term == r.term),
        }
    }

    /// Whether serving `r` would change the key (a keep-alive does not).
    fn changes_key(&self, s: &TSt, r: &Req) -> bool {
        r.kind != Kind::Renew && self.writes(s, r)
    }

    /// The candidates', the server's and the network's steps.
    pub(super) fn moves(&self, s: &TSt, out: &mut Vec<Act>) {
        for c in 0..self.0.candidates {
            let cand = &s.cands[c];
            if let Some(r) = &cand.req
                && (!self.changes_key(s, r) || self.may_write(s))
            {
                out.push(Act::Serve(c));
            }
            if !cand.up {
                continue;
            }
            // etcd: followers watch the key (handling events after an
            // answer they await); the holder watches for its key's deletion
            // or overwrite.
            let watches = match &cand.lead {
                None => cand.req.is_none(),
                Some(_) => self.lost_key(s, c),
            };
            if self.etcd() && watches && !cand.current {
                out.push(Act::Observe(c));
            }
            let live = self.0.liveness.is_some();
            // A follower campaigns when it finds the key gone (etcd: its
            // watch; Redis: it wakes at the PTTL or a release notice); a
            // campaign sent while the key exists could only land after the
            // key went, later than one sent then, so it adds nothing.
            let sees_no_key = s.key.is_none() && (cand.current || !self.etcd());
            match &cand.lead {
                Some(l) if cand.req.is_none() && (!live || l.renew_in == 0) => {
                    out.push(Act::Renew(c))
                }
                None if cand.req.is_none() && sees_no_key => out.push(Act::Campaign(c)),
                _ => {}
            }
        }
    }

    /// Whether the leader `c`'s key is gone or someone else's (etcd).
    fn lost_key(&self, s: &TSt, c: usize) -> bool {
        let term = s.cands[c].lead.map_or(0, |l| l.term);
        s.key.is_none_or(|k| k.term != term)
    }

    pub(super) fn faults(&self, s: &TSt, out: &mut Vec<Act>) {
        if s.budget == 0 {
            return;
        }
        for &f in self.0.faults {
            match f {
                Fault::DeleteKey | Fault::PutKey
                    if s.key.is_some_and(|k| k.term != FOREIGN) && self.may_write(s) =>
                {
                    out.push(Act::Fault(f, 0))
                }
                Fault::RevokeLease
                    if self.etcd()
                        && s.key.is_some_and(|k| Self::lease_alive(s, k.term))
                        && self.may_write(s) =>
                {
                    out.push(Act::Fault(f, 0))
                }
                Fault::Crash
                | Fault::Restart
                | Fault::Lose
                | Fault::LoseAnswer
                | Fault::Release => {
                    for c in 0..self.0.candidates {
                        let cand = &s.cands[c];
                        let applies = match f {
                            Fault::Crash => cand.up,
                            Fault::Restart => true,
                            Fault::Lose => cand.req.is_some(),
                            Fault::LoseAnswer => cand
                                .req
                                .is_some_and(|r| !self.changes_key(s, &r) || self.may_write(s)),
                            _ => claims(cand) && cand.req.is_none(),
                        };
                        if applies {
                            out.push(Act::Fault(f, c));
                        }
                    }
                }
                _ => {}
            }
        }
    }

    pub(super) fn apply(&self, t: &mut TSt, a: Act) -> Result<(), String> {
        match a {
            Act::Tick => self.tick(t),
            Act::Observe(c) => self.observe(t, c),
            Act::Campaign(c) => {
                let term = next_term(t);
                let cand = &t.cands[c];
                let valid = self.real(cand, self.0.ttl - self.0.margin);
                let prev = if self.etcd() { cand.seen } else { 0 };
                t.cands[c].req = Some(Req {
                    kind: Kind::Campaign,
                    term,
                    prev,
                    valid,
                });
            }
            Act::Renew(c) => {
                let cand = &t.cands[c];
                let term = cand.lead.expect("a leader renews").term;
                let valid = self.real(cand, self.0.ttl - self.0.margin);
                t.cands[c].req = Some(Req {
                    kind: Kind::Renew,
                    term,
                    prev: 0,
                    valid,
                });
            }
            Act::Serve(c) => return self.serve(t, c, false),
            Act::Fault(Fault::LoseAnswer, c) => {
                t.budget -= 1;
                return self.serve(t, c, true);
            }
            Act::Fault(f, c) => self.fault(t, f, c),
        }
        Ok(())
    }

    fn fault(&self, t: &mut TSt, f: Fault, c: usize) {
        t.budget -= 1;
        if matches!(f, Fault::DeleteKey | Fault::PutKey | Fault::RevokeLease) {
            self.before_write(t);
        }
        match f {
            Fault::DeleteKey => t.key = None,
            Fault::PutKey => {
                t.key = Some(Key {
                    term: FOREIGN,
                    token: 0,
                    px: 0,
                })
            }
            Fault::RevokeLease => {
                let term = t.key.expect("a key").term;
                revoke(t, term);
            }
            Fault::Crash => {
                if claims(&t.cands[c]) && self.0.liveness.is_some() {
                    t.since_crash = Some(0);
                }
                let cand = &mut t.cands[c];
                *cand = TCand {
                    up: false,
                    req: cand.req,
                    ..TCand::fresh(cand.rate)
                };
            }
            Fault::Restart => t.cands[c] = TCand::fresh(t.cands[c].rate),
            Fault::Lose => t.cands[c].req = None,
            Fault::LoseAnswer => unreachable!("served in apply"),
            Fault::Release => self.step_down(t, c),
        }
        if matches!(f, Fault::DeleteKey | Fault::PutKey | Fault::RevokeLease) {
            t.cands.iter_mut().for_each(|c| c.current = false);
        }
    }

    /// Stop claiming, and release (etcd: revoke the lease; Redis: delete
    /// the key if it is ours).
    fn step_down(&self, t: &mut TSt, c: usize) {
        let cand = &mut t.cands[c];
        let l = cand.lead.take().expect("a leader steps down");
        cand.seen = l.term;
        if cand.req.is_none() {
            cand.req = Some(Req {
                kind: Kind::Resign,
                term: l.term,
                prev: 0,
                valid: 0,
            });
        }
    }

    fn observe(&self, t: &mut TSt, c: usize) {
        if t.cands[c].lead.is_some() && self.lost_key(t, c) {
            // The holder's watch: its key deleted or overwritten.
            self.step_down(t, c);
        }
        let key = t.key;
        let cand = &mut t.cands[c];
        cand.current = true;
        if let Some(k) = key {
            cand.seen = k.term;
        }
    }

    fn tick(&self, t: &mut TSt) {
        for l in t.leases.iter_mut() {
            l.1 = l.1.saturating_sub(1);
            if l.1 == 0 {
                l.0 = 0;
            }
        }
        let key_term = t.key.map_or(0, |k| k.term);
        let expires = t.key.is_some_and(|k| k.px == 1)
            || (self.etcd()
                && key_term != FOREIGN
                && key_term != 0
                && !Self::lease_alive(t, key_term));
        if expires {
            self.before_write(t);
        }
        if self.etcd() && key_term != FOREIGN && key_term != 0 && !Self::lease_alive(t, key_term) {
            t.key = None; // the lease expired: etcd deletes the key
            t.cands.iter_mut().for_each(|c| c.current = false);
        }
        if let Some(k) = &mut t.key
            && k.px > 0
        {
            k.px -= 1;
            if k.px == 0 {
                t.key = None; // PX ran out
            }
        }
        for cand in t.cands.iter_mut() {
            if let Some(r) = &mut cand.req {
                r.valid = r.valid.saturating_sub(1);
            }
            let Some(l) = &mut cand.lead else { continue };
            l.valid -= 1;
            l.renew_in = l.renew_in.saturating_sub(1);
            if l.valid == 0 {
                // The deadline passed: stop claiming, then resign.
                let term = l.term;
                cand.seen = term;
                cand.lead = None;
                if cand.req.is_none() {
                    cand.req = Some(Req {
                        kind: Kind::Resign,
                        term,
                        prev: 0,
                        valid: 0,
                    });
                }
            }
        }
        if self.0.liveness.is_some() {
            t.clock += 1;
            t.since_crash = t.since_crash.map(|k| k.saturating_add(1));
        }
    }

    /// The server applies `c`'s request; the answer reaches `c` at once
    /// unless `lost` (see the Lease model's `serve` on why that suffices).
    fn serve(&self, t: &mut TSt, c: usize, lost: bool) -> Result<(), String> {
        let r = t.cands[c].req.take().expect("a request");
        let ok = self.writes(t, &r);
        if ok && r.kind != Kind::Renew {
            self.before_write(t);
        }
        let mut token = 0;
        let ttl = self.0.ttl;
        if ok {
            match r.kind {
                Kind::Campaign => {
                    t.counter += 1;
                    token = t.counter;
                    let px = if self.etcd() { 0 } else { ttl };
                    t.key = Some(Key {
                        term: r.term,
                        token,
                        px,
                    });
                    if self.etcd() {
                        grant(t, r.term, ttl);
                    }
                }
                Kind::Renew if self.etcd() => {
                    // Keep-alive; the read in the same round trip proves
                    // the key is still bound to our lease.
                    let alive = Self::lease_alive(t, r.term);
                    for l in t.leases.iter_mut().filter(|l| l.0 == r.term && l.1 > 0) {
                        l.1 = ttl;
                    }
                    token = u8::from(alive && t.key.is_some_and(|k| k.term == r.term));
                }
                Kind::Renew => {
                    if let Some(k) = &mut t.key {
                        k.px = ttl;
                    }
                    token = 1;
                }
                Kind::Resign => revoke(t, r.term),
            }
            if r.kind != Kind::Renew {
                t.cands.iter_mut().for_each(|c| c.current = false);
            }
        }
        let granted = match r.kind {
            Kind::Renew => token == 1,
            _ => ok,
        };
        if lost || !t.cands[c].up || r.kind == Kind::Resign {
            return Ok(());
        }
        self.answer(t, c, r, granted, token)
    }

    /// `c` receives the answer to `r`.
    fn answer(&self, t: &mut TSt, c: usize, r: Req, ok: bool, token: u8) -> Result<(), String> {
        let renew_in = if self.0.liveness.is_some() {
            self.real(&t.cands[c], self.0.renew)
        } else {
            0
        };
        match r.kind {
            Kind::Campaign if ok && r.valid > 0 => {
                t.cands[c].lead = Some(TLead {
                    term: r.term,
                    valid: r.valid,
                    renew_in,
                    token,
                });
                if token <= t.max_claimed {
                    return Err(format!(
                        "{} claims token {token}, not above {}",
                        super::lease::name(c),
                        t.max_claimed
                    ));
                }
                t.max_claimed = token;
            }
            Kind::Campaign if ok => {
                // Too late to claim: release what we got.
                t.cands[c].req = Some(Req {
                    kind: Kind::Resign,
                    term: r.term,
                    prev: 0,
                    valid: 0,
                });
            }
            Kind::Renew if t.cands[c].lead.is_some_and(|l| l.term == r.term) => {
                if ok {
                    let l = t.cands[c].lead.as_mut().expect("leader");
                    (l.valid, l.renew_in) = (r.valid, renew_in);
                } else {
                    self.step_down(t, c); // the term is over
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn grant(t: &mut TSt, term: u8, ttl: u8) {
    let slot = t
        .leases
        .iter_mut()
        .find(|l| l.1 == 0)
        .expect("a free lease slot");
    *slot = (term, ttl);
}

/// Revokes the lease of `term` (etcd; its key goes with it), or deletes
/// the key if it is `term`'s (Redis check-and-delete).
fn revoke(t: &mut TSt, term: u8) {
    for l in t.leases.iter_mut().filter(|l| l.0 == term) {
        *l = (0, 0);
    }
    if t.key.is_some_and(|k| k.term == term) {
        t.key = None;
    }
}

fn next_term(t: &TSt) -> u8 {
    let mut m = t
        .key
        .map_or(0, |k| if k.term == FOREIGN { 0 } else { k.term });
    for l in &t.leases {
        m = m.max(l.0);
    }
    for c in &t.cands {
        m = m.max(c.seen % FOREIGN);
        if let Some(l) = &c.lead {
            m = m.max(l.term);
        }
        if let Some(r) = &c.req {
            m = m.max(r.term).max(r.prev % FOREIGN);
        }
    }
    m + 1
}
