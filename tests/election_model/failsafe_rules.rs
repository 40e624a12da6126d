//! The failsafe model's transitions (see [`super::failsafe`]).

use super::failsafe::{
    Act, FCand, FKey, FLead, FReq, FSt, FailsafeModel, Fault, Kind, Msg, claims, pair,
};
use super::lease::name;

impl FailsafeModel {
    fn real(&self, c: &FCand, local: u8) -> u8 {
        (i16::from(local) + i16::from(c.rate)).max(1) as u8
    }

    fn live(&self) -> bool {
        self.0.live.is_some()
    }

    fn reaches(s: &FSt, c: usize) -> bool {
        s.backend & (1 << c) != 0
    }

    fn peer_up(s: &FSt, a: usize, b: usize) -> bool {
        s.peers_cut & (1 << pair(a, b)) == 0
    }

    /// Whether `c` may send a campaign now.
    fn may_campaign(&self, s: &FSt, c: usize) -> bool {
        let cand = &s.cands[c];
        let on_roster = !self.0.failsafe || s.roster == 0 || s.roster & (1 << c) != 0;
        cand.up
            && cand.registered
            && cand.lead.is_none()
            && cand.req.is_none()
            && cand.promise == 0
            && cand.startup == 0
            && Self::reaches(s, c)
            && s.key.is_none()
            && on_roster
    }

    /// The candidates', the backend's and the network's steps.
    pub(super) fn moves(&self, s: &FSt, out: &mut Vec<Act>) {
        let n = self.0.candidates;
        for c in 0..n {
            let cand = &s.cands[c];
            if cand.req.is_some() {
                out.push(if Self::reaches(s, c) {
                    Act::Serve(c)
                } else {
                    Act::Timeout(c)
                });
            }
            if let Some(m) = &cand.hb
                && cand.up
                && Self::peer_up(s, m.from as usize, c)
            {
                out.push(Act::Deliver(c));
            }
            if let Some(m) = &cand.ack
                && s.cands[m.from as usize].up
                && Self::peer_up(s, m.from as usize, c)
            {
                out.push(Act::Ack(c));
            }
            if !cand.up {
                continue;
            }
            if !cand.registered && Self::reaches(s, c) {
                out.push(Act::Register(c));
            }
            if self.may_campaign(s, c) {
                out.push(Act::Campaign(c));
            }
            let Some(l) = &cand.lead else { continue };
            if cand.req.is_none() && (!self.live() || l.renew_in == 0) {
                out.push(Act::Renew(c));
            }
            if !(l.fs && claims(cand)) {
                continue;
            }
            for m in (0..n).filter(|&m| m != c && l.required & (1 << m) != 0) {
                let to = &s.cands[m];
                let due = !self.live() || l.sent & (1 << m) == 0;
                if due && to.hb.is_none() && to.ack.is_none() && Self::peer_up(s, c, m) {
                    out.push(Act::Heartbeat(c, m));
                }
            }
        }
    }

    /// Free heals of cut links (safety runs).
    pub(super) fn heals(&self, s: &FSt, out: &mut Vec<Act>) {
        for c in 0..self.0.candidates {
            if !Self::reaches(s, c) {
                out.push(Act::HealBackend(c));
            }
        }
        for p in 0..3 {
            if s.peers_cut & (1 << p) != 0 {
                out.push(Act::HealPeer(p));
            }
        }
    }

    pub(super) fn faults(&self, s: &FSt, out: &mut Vec<Act>) {
        if s.budget == 0 {
            return;
        }
        let n = self.0.candidates;
        for &f in self.0.faults {
            match f {
                Fault::Outage if s.backend != 0 => out.push(Act::Fault(f, 0)),
                Fault::CutPeer => (0..3)
                    .filter(|&p| s.peers_cut & (1 << p) == 0 && (n == 3 || p == 0))
                    .for_each(|p| out.push(Act::Fault(f, p))),
                _ => {
                    for c in 0..n {
                        let cand = &s.cands[c];
                        let applies = match f {
                            Fault::CutBackend => Self::reaches(s, c),
                            Fault::LoseMsg => cand.hb.is_some() || cand.ack.is_some(),
                            Fault::Lose => cand.req.is_some(),
                            Fault::LoseAnswer => cand.req.is_some() && Self::reaches(s, c),
                            Fault::Crash => cand.up,
                            Fault::Restart => true,
                            Fault::Outage | Fault::CutPeer => false,
                        };
                        if applies {
                            out.push(Act::Fault(f, c));
                        }
                    }
                }
            }
        }
    }

    pub(super) fn apply(&self, t: &mut FSt, a: Act) -> Result<(), String> {
        match a {
            Act::Tick => self.tick(t),
            Act::Register(c) => t.cands[c].registered = true,
            Act::Campaign(c) => self.send(t, c, Kind::Campaign),
            Act::Renew(c) => self.send(t, c, Kind::Renew),
            Act::Serve(c) => return self.serve(t, c, false),
            Act::Timeout(c) => self.timeout(t, c),
            Act::Heartbeat(c, m) => {
                let l = t.cands[c].lead.as_mut().expect("a leader");
                l.sent |= 1 << m;
                let (term, p) = (l.term, self.0.promise - self.0.margin);
                let bound = self.real(&t.cands[c], p);
                t.cands[m].hb = Some(Msg {
                    from: c as u8,
                    term,
                    bound,
                });
            }
            Act::Deliver(m) => self.deliver(t, m),
            Act::Ack(m) => {
                let msg = t.cands[m].ack.take().expect("an ack");
                if let Some(l) = &mut t.cands[msg.from as usize].lead
                    && l.term == msg.term
                {
                    l.conf[m] = l.conf[m].max(msg.bound);
                }
            }
            Act::HealBackend(c) => t.backend |= 1 << c,
            Act::HealPeer(p) => t.peers_cut &= !(1 << p),
            Act::Fault(Fault::LoseAnswer, c) => {
                t.budget -= 1;
                let kind = t.cands[c].req.expect("a request").kind;
                self.serve(t, c, true)?;
                self.timeout_seen(t, c, kind);
            }
            Act::Fault(f, c) => self.fault(t, f, c),
        }
        Ok(())
    }

    fn send(&self, t: &mut FSt, c: usize, kind: Kind) {
        let roster = if self.0.failsafe {
            (0..self.0.candidates)
                .filter(|&m| t.cands[m].registered)
                .fold(0, |acc, m| acc | (1 << m))
        } else {
            0
        };
        let valid = self.real(&t.cands[c], self.0.ttl - self.0.margin);
        let renew = self.real(&t.cands[c], self.0.renew);
        let term = match kind {
            Kind::Campaign => next_term(t),
            Kind::Renew => {
                let l = t.cands[c].lead.as_mut().expect("a leader renews");
                l.renew_in = renew;
                l.sent = 0; // a new round of heartbeats
                if self.0.rules.required_union {
                    l.required |= roster & !(1 << c);
                }
                l.term
            }
        };
        let recreate = t.cands[c].lead.is_some_and(|l| l.fs);
        t.cands[c].req = Some(FReq {
            kind,
            term,
            valid,
            roster,
            recreate,
        });
    }

    fn timeout(&self, t: &mut FSt, c: usize) {
        let r = t.cands[c].req.take().expect("a request");
        self.timeout_seen(t, c, r.kind);
    }

    /// `c` saw a request of `kind` time out: a renewal puts the leader in
    /// failsafe (the backend is unreachable; nothing refused the write).
    fn timeout_seen(&self, t: &mut FSt, c: usize, kind: Kind) {
        if !self.0.failsafe || kind != Kind::Renew || !t.cands[c].up {
            return;
        }
        if let Some(l) = &mut t.cands[c].lead {
            if !l.fs {
                l.sent = 0;
            }
            l.fs = true;
        }
    }

    fn deliver(&self, t: &mut FSt, m: usize) {
        let msg = t.cands[m].hb.take().expect("a heartbeat");
        let cand = &t.cands[m];
        let campaigning = cand.req.is_some_and(|r| r.kind == Kind::Campaign);
        if cand.lead.is_some() || (self.0.rules.refuse_while_campaigning && campaigning) {
            return;
        }
        let promise = self.real(cand, self.0.promise);
        let cand = &mut t.cands[m];
        cand.promise = cand.promise.max(promise);
        cand.ack = Some(msg);
    }

    fn fault(&self, t: &mut FSt, f: Fault, c: usize) {
        t.budget -= 1;
        match f {
            Fault::CutBackend => t.backend &= !(1 << c),
            Fault::Outage => t.backend = 0,
            Fault::CutPeer => t.peers_cut |= 1 << c,
            Fault::LoseMsg => {
                let cand = &mut t.cands[c];
                if cand.hb.is_some() {
                    cand.hb = None;
                } else {
                    cand.ack = None;
                }
            }
            Fault::Lose => {
                let r = t.cands[c].req.take().expect("a request");
                self.timeout_seen(t, c, r.kind);
            }
            Fault::LoseAnswer => unreachable!("handled in apply"),
            Fault::Crash => {
                if claims(&t.cands[c]) && self.live() {
                    t.since_crash = Some(0);
                }
                let cand = &mut t.cands[c];
                cand.up = false;
                cand.lead = None;
                cand.promise = 0;
            }
            Fault::Restart => {
                let old = t.cands[c];
                let wait = if self.0.rules.restart_wait {
                    self.real(&old, self.0.promise)
                } else {
                    0
                };
                t.cands[c] = FCand {
                    hb: old.hb,
                    ack: None,
                    ..FCand::fresh(old.rate, old.registered, wait)
                };
            }
        }
    }

    fn tick(&self, t: &mut FSt) {
        if let Some(k) = &mut t.key {
            k.ttl -= 1;
            if k.ttl == 0 {
                t.key = None;
                if !self.0.rules.roster_permanent {
                    t.roster = 0;
                }
            }
        }
        for cand in t.cands.iter_mut() {
            cand.promise = cand.promise.saturating_sub(1);
            cand.startup = cand.startup.saturating_sub(1);
            if let Some(r) = &mut cand.req {
                r.valid = r.valid.saturating_sub(1);
            }
            for m in [&mut cand.hb, &mut cand.ack].into_iter().flatten() {
                m.bound = m.bound.saturating_sub(1);
            }
            let Some(l) = &mut cand.lead else { continue };
            l.valid = l.valid.saturating_sub(1);
            l.renew_in = l.renew_in.saturating_sub(1);
            l.conf.iter_mut().for_each(|x| *x = x.saturating_sub(1));
            if !claims(cand) {
                cand.lead = None; // its bound passed: it steps down for good
            }
        }
        if let Some(live) = self.0.live {
            t.clock += 1;
            t.since_crash = t.since_crash.map(|k| k.saturating_add(1));
            let all = (1u8 << self.0.candidates) - 1;
            if t.clock == live.outage.0 {
                t.backend = 0;
            }
            if t.clock == live.outage.1 {
                t.backend = all;
            }
            if live.cut_peer.is_some_and(|(at, _)| at == t.clock) {
                t.peers_cut |= 1 << pair(0, 1);
            }
        }
    }

    /// The backend applies `c`'s request; the answer reaches `c` at once
    /// unless `lost`.
    fn serve(&self, t: &mut FSt, c: usize, lost: bool) -> Result<(), String> {
        let r = t.cands[c].req.take().expect("a request");
        let ttl = self.0.ttl;
        let ours = t.key.is_some_and(|k| k.term == r.term);
        let ok = match r.kind {
            Kind::Campaign => t.key.is_none(),
            Kind::Renew => ours || (t.key.is_none() && r.recreate),
        };
        if ok && !ours {
            t.counter += 1;
            t.key = Some(FKey {
                term: r.term,
                token: t.counter,
                ttl,
            });
        }
        if ok {
            t.key.as_mut().expect("the key").ttl = ttl;
            t.roster = r.roster;
        }
        let token = t.key.map_or(0, |k| k.token);
        if lost || !t.cands[c].up {
            return Ok(());
        }
        self.answer(t, c, r, ok.then_some((token, !ours)))
    }

    /// `c` receives the answer to `r`: refused, or the key's token and
    /// whether this write created the key.
    fn answer(
        &self,
        t: &mut FSt,
        c: usize,
        r: FReq,
        got: Option<(u8, bool)>,
    ) -> Result<(), String> {
        let (ok, (token, created)) = (got.is_some(), got.unwrap_or((0, false)));
        let renew_in = self.real(&t.cands[c], self.0.renew);
        let cand = &mut t.cands[c];
        let fresh = match (r.kind, &mut cand.lead) {
            (Kind::Campaign, None) if ok && r.valid > 0 => {
                cand.lead = Some(FLead {
                    term: r.term,
                    token,
                    valid: r.valid,
                    renew_in,
                    fs: false,
                    required: r.roster & !(1 << c),
                    conf: [0; 3],
                    sent: 0,
                });
                true
            }
            (Kind::Renew, Some(l)) if l.term == r.term => {
                if !ok {
                    cand.lead = None; // refused: the term is over
                    return Ok(());
                }
                (l.valid, l.fs, l.token) = (r.valid.max(l.valid), false, token);
                l.required = r.roster & !(1 << c);
                created
            }
            _ => false,
        };
        if fresh {
            if token <= t.max_claimed {
                return Err(format!(
                    "{} claims token {token}, not above {}",
                    name(c),
                    t.max_claimed
                ));
            }
            t.max_claimed = token;
        }
        Ok(())
    }
}

fn next_term(t: &FSt) -> u8 {
    let mut m = t.key.map_or(0, |k| k.term);
    for c in &t.cands {
        if let Some(l) = &c.lead {
            m = m.max(l.term);
        }
        if let Some(r) = &c.req {
            m = m.max(r.term);
        }
        for x in [&c.hb, &c.ack].into_iter().flatten() {
            m = m.max(x.term);
        }
    }
    m + 1
}
