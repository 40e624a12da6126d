//! The TTL backends' transitions (see [`super::ttl`]).

use super::lease::Observe;
use super::ttl::{
    Act, Backend, FOREIGN, Fault, Handover, Key, Kind, Req, TCand, TLead, TSt, TtlModel, claims,
};

impl TtlModel {
    fn real(&self, c: &TCand, local: u8) -> u8 {
        (i16::from(local) + i16::from(c.rate)).max(1) as u8
    }

    /// Candidate `c`'s own TTL.
    pub(super) fn ttl_of(&self, c: usize) -> u8 {
        match self.0.ttls {
            Some(pair) if c < 2 => pair[c],
            _ => self.0.ttl,
        }
    }

    fn etcd(&self) -> bool {
        self.0.backend == Backend::Etcd
    }

    /// etcd's handover by one write is on.
    fn handover(&self) -> bool {
        self.etcd() && self.0.handover != Handover::Off
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
            Kind::Adopt => self.swaps(s, r),
        }
    }

    /// Whether serving `r` would change the key (a keep-alive does not; an
    /// adoption does when it swaps).
    fn changes_key(&self, s: &TSt, r: &Req) -> bool {
        r.kind != Kind::Renew && self.writes(s, r)
    }

    /// Whether serving adoption `r` swaps the key onto a lease of the
    /// taker's own TTL (the product's rule, when the next lease was granted
    /// with another TTL: `src/backend/etcd/swap.rs`).
    fn swaps(&self, s: &TSt, r: &Req) -> bool {
        let Some(k) = s.key.filter(|k| k.named > 0 && k.term != FOREIGN) else {
            return false;
        };
        let c = usize::from(k.named) - 1;
        self.0.handover == Handover::Marked
            && r.kind == Kind::Adopt
            && self.adoptable(s, c, r)
            && granted(s, r.term) != self.ttl_of(c)
    }

    /// Whether `c`'s adoption `r` passes its checks at the server.
    fn adoptable(&self, s: &TSt, c: usize, r: &Req) -> bool {
        let put = s.key.is_some_and(|k| {
            k.term == r.term && k.token == r.token && usize::from(k.named) == c + 1
        });
        let marked = match self.0.handover {
            Handover::PutAlone => true,
            _ => s.mark == r.token && s.cands[c].adopter < r.token,
        };
        Self::lease_alive(s, r.term) && put && marked
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
                None if cand.req.is_none() && self.named_me(s, c) => out.push(Act::Adopt(c)),
                _ => {}
            }
        }
    }

    /// Whether follower `c` has seen a put naming it that it has not tried
    /// to adopt (etcd, the handover on).
    fn named_me(&self, s: &TSt, c: usize) -> bool {
        let cand = &s.cands[c];
        self.handover()
            && cand.current
            && s.key.is_some_and(|k| {
                k.term != FOREIGN && usize::from(k.named) == c + 1 && cand.tried != k.token
            })
    }

    /// The releases naming a successor that leader `c` may send now.
    pub(super) fn handovers(&self, s: &TSt, out: &mut Vec<Act>) {
        if s.budget == 0 || !self.0.faults.contains(&Fault::ReleaseTo) {
            return;
        }
        for c in 0..self.0.candidates {
            if claims(&s.cands[c]) && s.cands[c].req.is_none() {
                for to in (0..self.0.candidates).filter(|&to| to != c) {
                    out.push(Act::HandOver(c, to));
                }
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
        self.handovers(s, out);
        for &f in self.0.faults {
            match f {
                Fault::DeleteKey | Fault::PutKey
                    if s.key.is_some_and(|k| k.term != FOREIGN) && self.may_write(s) =>
                {
                    out.push(Act::Fault(f, 0))
                }
                Fault::PutNamed
                    if self.etcd()
                        && s.key
                            .is_some_and(|k| k.term != FOREIGN && Self::lease_alive(s, k.term))
                        && self.may_write(s) =>
                {
                    let named = s.key.map_or(0, |k| usize::from(k.named));
                    for to in (0..self.0.candidates).filter(|&to| to + 1 != named) {
                        out.push(Act::Fault(f, to));
                    }
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
                let valid = self.real(cand, self.ttl_of(c) - self.0.margin);
                let prev = if self.etcd() { cand.seen } else { 0 };
                t.cands[c].req = Some(Req {
                    valid,
                    prev,
                    ..Req::new(Kind::Campaign, term)
                });
            }
            Act::Renew(c) => {
                let cand = &t.cands[c];
                let term = cand.lead.expect("a leader renews").term;
                // The TTL its term's lease was granted with (its own, but
                // under the twins that keep the next lease).
                let ttl = match granted(t, term) {
                    0 => self.ttl_of(c),
                    g => g,
                };
                let valid = self.real(cand, ttl - self.0.margin);
                t.cands[c].req = Some(Req {
                    valid,
                    ..Req::new(Kind::Renew, term)
                });
            }
            Act::Adopt(c) => {
                let k = t.key.expect("a key names the adopter");
                // The old rule counts the next lease's TTL; the others the
                // taker's own.
                let ttl = match granted(t, k.term) {
                    g if g > 0 && self.0.handover == Handover::KeepsLease => g,
                    _ => self.ttl_of(c),
                };
                let valid = self.real(&t.cands[c], ttl - self.0.margin);
                t.cands[c].tried = k.token;
                t.cands[c].req = Some(Req {
                    valid,
                    token: k.token,
                    ..Req::new(Kind::Adopt, k.term)
                });
            }
            Act::HandOver(c, to) => {
                t.budget -= 1;
                if self.0.liveness.is_some() {
                    t.since_crash = Some(0);
                    // A dead successor costs the next lease's TTL.
                    t.due = self.due(self.ttl_of(c));
                }
                self.step_down_to(t, c, to as u8 + 1);
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
        let write = matches!(
            f,
            Fault::DeleteKey | Fault::PutKey | Fault::RevokeLease | Fault::PutNamed
        );
        if write {
            self.before_write(t);
        }
        match f {
            Fault::DeleteKey => t.key = None,
            Fault::PutKey => {
                t.key = Some(Key {
                    term: FOREIGN,
                    token: 0,
                    px: 0,
                    named: 0,
                })
            }
            Fault::RevokeLease => {
                let term = t.key.expect("a key").term;
                revoke(t, term);
            }
            Fault::Crash => {
                // With the handover any candidate may crash (the bound then
                // counts from the last crash or release).
                if (claims(&t.cands[c]) || self.handover()) && self.0.liveness.is_some() {
                    t.since_crash = Some(0);
                    // A holder's crash costs its own TTL; anyone else's
                    // the longest (a successor named by a release).
                    let holder = claims(&t.cands[c]).then(|| self.ttl_of(c));
                    t.due = self.due(holder.unwrap_or(self.longest()));
                }
                let cand = &mut t.cands[c];
                *cand = TCand {
                    up: false,
                    req: cand.req,
                    ..TCand::fresh(cand.rate)
                };
            }
            Fault::Restart => {
                t.cands[c] = TCand::fresh(t.cands[c].rate);
                if self.handover() {
                    // The new process writes its record and adopter mark.
                    t.counter += 1;
                    t.cands[c].adopter = t.counter;
                }
            }
            Fault::PutNamed => {
                let k = t.key.expect("a key");
                t.counter += 1;
                t.key = Some(Key {
                    token: t.counter,
                    named: c as u8 + 1,
                    ..k
                });
            }
            Fault::ReleaseTo => unreachable!("an Act::HandOver"),
            Fault::Lose => t.cands[c].req = None,
            Fault::LoseAnswer => unreachable!("served in apply"),
            Fault::Release => self.step_down(t, c),
        }
        if write {
            t.cands.iter_mut().for_each(|c| c.current = false);
        }
    }

    /// Stop claiming, and release naming no successor (etcd: revoke the
    /// lease; Redis: delete the key if it is ours).
    fn step_down(&self, t: &mut TSt, c: usize) {
        self.step_down_to(t, c, 0);
    }

    /// Stop claiming, and release naming `succ` (index + 1; 0: none).
    fn step_down_to(&self, t: &mut TSt, c: usize, succ: u8) {
        let cand = &mut t.cands[c];
        let l = cand.lead.take().expect("a leader steps down");
        cand.seen = l.term;
        if cand.req.is_none() {
            cand.req = Some(Req {
                prev: l.next,
                succ,
                ..Req::new(Kind::Resign, l.term)
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
                *l = (0, 0, 0);
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
                    cand.req = Some(Req::new(Kind::Resign, term));
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
        let mut r = t.cands[c].req.take().expect("a request");
        let adopt = r.kind == Kind::Adopt;
        let ok = if adopt {
            self.adoptable(t, c, &r)
        } else {
            self.writes(t, &r)
        };
        let writes_key = match r.kind {
            Kind::Renew => false,
            Kind::Adopt => self.swaps(t, &r),
            _ => true,
        };
        if ok && writes_key {
            self.before_write(t);
        }
        let (token, next) = if ok {
            let answer = self.apply_request(t, c, &mut r);
            if writes_key {
                t.cands.iter_mut().for_each(|c| c.current = false);
            }
            answer
        } else {
            (0, 0)
        };
        let granted = match r.kind {
            Kind::Renew => token == 1,
            _ => ok,
        };
        if lost || !t.cands[c].up || r.kind == Kind::Resign {
            return Ok(());
        }
        self.answer(t, c, r, (granted, token), next)
    }

    /// Apply `c`'s request `r`, which the server accepts: its token (a
    /// renewal: 1 when it keeps the term) and the new term's next lease (a
    /// swapping adoption: `r.term` becomes the taker's own lease).
    fn apply_request(&self, t: &mut TSt, c: usize, r: &mut Req) -> (u8, u8) {
        let mut token = 0;
        let mut next = 0;
        let ttl = self.ttl_of(c);
        match r.kind {
            Kind::Campaign => {
                t.counter += 1;
                token = t.counter;
                let px = if self.etcd() { 0 } else { ttl };
                t.key = Some(Key {
                    term: r.term,
                    token,
                    px,
                    named: c as u8 + 1,
                });
                if self.etcd() {
                    grant(t, r.term, ttl);
                }
                next = self.grant_next(t, c);
            }
            Kind::Adopt if self.swaps(t, r) => {
                // One transaction compares what the adoption reads and
                // puts the key naming the taker under a lease of its TTL.
                r.term = next_term(t);
                grant(t, r.term, ttl);
                t.counter += 1;
                token = t.counter;
                t.key = Some(Key {
                    term: r.term,
                    token,
                    px: 0,
                    named: c as u8 + 1,
                });
                next = self.grant_next(t, c);
            }
            Kind::Adopt => {
                // The keep-alive of the next lease; the read proved the
                // rest. The term's own next lease, as at a claim.
                refresh(t, r.term);
                token = r.token;
                next = self.grant_next(t, c);
            }
            Kind::Renew if self.etcd() => {
                // Keep-alive; the read in the same round trip proves
                // the key is still bound to our lease (and, with the
                // handover, still names us: a put over it ends the term).
                let alive = Self::lease_alive(t, r.term);
                refresh(t, r.term);
                if let Some(n) = t.cands[c].lead.map(|l| l.next) {
                    refresh(t, n);
                }
                let ours = t.key.is_some_and(|k| {
                    k.term == r.term && (!self.handover() || usize::from(k.named) == c + 1)
                });
                token = u8::from(alive && ours);
            }
            Kind::Resign if self.handover_put(t, r) => {
                // One write: the key names the successor under the next
                // lease, the release mark is this put; the old lease is
                // left to expire.
                t.counter += 1;
                t.key = Some(Key {
                    term: r.prev,
                    token: t.counter,
                    px: 0,
                    named: r.succ,
                });
                t.mark = t.counter;
            }
            Kind::Renew => {
                if let Some(k) = &mut t.key {
                    k.px = ttl;
                }
                token = 1;
            }
            Kind::Resign => revoke(t, r.term),
        }
        (token, next)
    }

    /// etcd with the handover: grant the next lease of `c`'s new term,
    /// with `c`'s TTL (0: off).
    fn grant_next(&self, t: &mut TSt, c: usize) -> u8 {
        if !self.handover() {
            return 0;
        }
        let n = next_term(t);
        grant(t, n, self.ttl_of(c));
        n
    }

    /// The longest TTL of any candidate.
    fn longest(&self) -> u8 {
        (0..self.0.candidates)
            .map(|c| self.ttl_of(c))
            .max()
            .unwrap_or(self.0.ttl)
    }

    /// The failover bound `bound` when candidates' TTLs differ (0: the
    /// configuration's one bound).
    fn due(&self, bound: u8) -> u8 {
        if self.0.ttls.is_some() { bound } else { 0 }
    }

    /// Whether release `r` hands the term over by one put: it names a
    /// successor, the key is still bound to the leader's lease, and the
    /// next lease lives.
    fn handover_put(&self, t: &TSt, r: &Req) -> bool {
        self.handover()
            && r.succ > 0
            && t.key.is_some_and(|k| k.term == r.term)
            && Self::lease_alive(t, r.prev)
    }

    /// `c` receives the answer `(ok, token)` to `r`; `next`: the new term's
    /// next lease (etcd with the handover).
    fn answer(
        &self,
        t: &mut TSt,
        c: usize,
        r: Req,
        answer: (bool, u8),
        next: u8,
    ) -> Result<(), String> {
        let (ok, token) = answer;
        let renew_in = if self.0.liveness.is_some() {
            self.real(&t.cands[c], self.0.renew)
        } else {
            0
        };
        match r.kind {
            Kind::Campaign | Kind::Adopt if ok && r.valid > 0 => {
                t.cands[c].lead = Some(TLead {
                    term: r.term,
                    valid: r.valid,
                    renew_in,
                    token,
                    next,
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
            Kind::Campaign | Kind::Adopt if ok => {
                // Too late to claim: release what we got.
                t.cands[c].req = Some(Req::new(Kind::Resign, r.term));
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

impl Req {
    /// A request of `kind` for `term`, every other field empty.
    fn new(kind: Kind, term: u8) -> Req {
        Req {
            kind,
            term,
            prev: 0,
            valid: 0,
            succ: 0,
            token: 0,
        }
    }
}

/// A keep-alive of the lease of `term`, if it lives: its granted TTL from
/// now.
fn refresh(t: &mut TSt, term: u8) {
    for l in t.leases.iter_mut().filter(|l| l.0 == term && l.1 > 0) {
        l.1 = l.2;
    }
}

fn grant(t: &mut TSt, term: u8, ttl: u8) {
    let slot = t
        .leases
        .iter_mut()
        .find(|l| l.1 == 0)
        .expect("a free lease slot");
    *slot = (term, ttl, ttl);
}

/// The TTL the live lease of `term` was granted with (0: none lives).
fn granted(t: &TSt, term: u8) -> u8 {
    t.leases
        .iter()
        .find(|l| l.0 == term && l.1 > 0 && term != 0)
        .map_or(0, |l| l.2)
}

/// Revokes the lease of `term` (etcd; its key goes with it), or deletes
/// the key if it is `term`'s (Redis check-and-delete).
fn revoke(t: &mut TSt, term: u8) {
    for l in t.leases.iter_mut().filter(|l| l.0 == term) {
        *l = (0, 0, 0);
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
            m = m.max(l.term).max(l.next);
        }
        if let Some(r) = &c.req {
            m = m.max(r.term).max(r.prev % FOREIGN);
        }
    }
    m + 1
}
