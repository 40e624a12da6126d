//! The Lease model's transitions: which actions are enabled, and what each
//! one does under the old and the fixed rules (see [`super::lease`]).

use super::lease::{
    ABSENT, Act, Cand, Fault, Foreign, Holder, Kind, Lead, Lease, LeaseModel, Observe, Req, Rule,
    Seen, St,
};

impl LeaseModel {
    /// A local interval of `local` ticks, in real ticks, on `c`'s clock.
    fn real(&self, c: &Cand, local: u8) -> u8 {
        (i16::from(local) + i16::from(c.rate)).max(1) as u8
    }

    /// The renewal countdown after an acknowledged write (liveness runs).
    fn renew_in(&self, c: &Cand) -> u8 {
        if self.0.liveness.is_some() {
            self.real(c, self.0.renew)
        } else {
            0
        }
    }

    /// Whether `c` has observed the Lease as it is now.
    fn current(s: &St, c: &Cand) -> bool {
        match c.seen {
            Seen::Absent => !s.lease.present,
            Seen::Version { ver, .. } => s.lease.present && ver == s.lease.ver,
            Seen::Nothing => false,
        }
    }

    /// Whether a write may happen now: with `Observe::Watch`, only once every
    /// running follower has observed the current version (one awaiting an
    /// answer observes it at the write: [`Self::before_write`]).
    fn may_write(&self, s: &St) -> bool {
        self.0.observe == Observe::Reads
            || s.cands
                .iter()
                .all(|c| !c.up || c.lead.is_some() || c.req.is_some() || Self::current(s, c))
    }

    /// Watch mode: a follower awaiting an answer has the current version
    /// queued; it is handled now, before the next write, which is no later
    /// than the real follower handles it (after the answer), so no later
    /// than safe.
    fn before_write(&self, t: &mut St) {
        if self.0.observe == Observe::Reads {
            return;
        }
        for c in 0..t.cands.len() {
            let cand = &t.cands[c];
            if cand.up && cand.lead.is_none() && cand.req.is_some() && !Self::current(t, cand) {
                self.follower_observes(t, c);
            }
        }
    }

    /// Whether serving `r` would write.
    fn succeeds(s: &St, r: &Req) -> bool {
        match r.kind {
            Kind::Create => !s.lease.present,
            _ => s.lease.present && s.lease.ver == r.expect,
        }
    }

    /// The candidates' actions and the server's and network's steps (what a
    /// liveness run does before time may pass).
    pub(super) fn urgent(&self, s: &St, out: &mut Vec<Act>) {
        for (c, cand) in s.cands.iter().enumerate() {
            if let Some(r) = &cand.req
                && (!Self::succeeds(s, r) || self.may_write(s))
            {
                out.push(Act::Serve(c));
            }
            if !cand.up {
                continue;
            }
            match &cand.lead {
                Some(l) => {
                    let changed = !s.lease.present || s.lease.ver != l.ver;
                    if changed && (self.0.rule != Rule::Old || l.watch) {
                        out.push(Act::Observe(c));
                    }
                    // Safety runs let a leader renew at any instant (any
                    // renew interval up to its validity); liveness runs
                    // renew every `renew` ticks.
                    if cand.req.is_none() && (self.0.liveness.is_none() || l.renew_in == 0) {
                        out.push(Act::Renew(c));
                    }
                }
                // A follower awaiting its campaign's answer handles its
                // watch events after it (they queue). A CAS on a version that
                // is no longer current can only fail and re-read, which is
                // no more than an observation: only current views send one.
                // A create sent on a stale view of an absent Lease may still
                // land (after a deletion), so it is always allowed.
                None if cand.req.is_none() => {
                    let current = Self::current(s, cand);
                    if !current {
                        out.push(Act::Observe(c));
                    }
                    if cand.wait == 0 && (current || cand.seen == Seen::Absent) {
                        out.push(Act::Campaign(c));
                    }
                }
                None => {}
            }
        }
    }

    /// Faults, while the budget lasts.
    pub(super) fn faults(&self, s: &St, out: &mut Vec<Act>) {
        if s.budget == 0 {
            return;
        }
        for &fault in self.0.faults {
            match fault {
                Fault::Foreign(k) if self.foreign_applies(s, k) => out.push(Act::Foreign(k)),
                Fault::Foreign(_) => {}
                _ => {
                    for (c, cand) in s.cands.iter().enumerate() {
                        let leads = cand.up && cand.lead.is_some();
                        let applies = match fault {
                            Fault::Lose => cand.req.is_some(),
                            Fault::LoseAnswer => cand
                                .req
                                .is_some_and(|r| !Self::succeeds(s, &r) || self.may_write(s)),
                            Fault::Crash => cand.up,
                            Fault::Restart => true,
                            Fault::LoseWatch => {
                                self.0.rule == Rule::Old && cand.lead.is_some_and(|l| l.watch)
                            }
                            Fault::Release => leads,
                            Fault::Foreign(_) => false,
                        };
                        if applies {
                            out.push(fault_act(fault, c));
                        }
                    }
                }
            }
        }
    }

    fn foreign_applies(&self, s: &St, k: Foreign) -> bool {
        let l = &s.lease;
        l.present
            && self.may_write(s)
            && match k {
                Foreign::Duration => l.d != 1 && l.holder != Holder::Empty,
                Foreign::Holder => l.holder != Holder::Foreign,
                Foreign::Empty => l.holder != Holder::Empty,
                Foreign::Delete => true,
                Foreign::Touch => matches!(l.holder, Holder::Term(_)),
            }
    }

    /// Takes `a` in `t`; `Err` on a fencing token that did not grow.
    pub(super) fn apply(&self, t: &mut St, a: Act) -> Result<(), String> {
        match a {
            Act::Tick => self.tick(t),
            Act::Observe(c) if t.cands[c].lead.is_some() => self.leader_observes(t, c),
            Act::Observe(c) => self.follower_observes(t, c),
            Act::Campaign(c) => self.campaign(t, c),
            Act::Renew(c) => {
                let cand = &t.cands[c];
                let l = cand.lead.expect("a leader renews");
                let valid = self.real(cand, self.0.durations[c] - self.0.margin);
                t.cands[c].req = Some(Req {
                    kind: Kind::Renew,
                    term: l.term,
                    expect: l.ver,
                    valid,
                    replay: 0,
                });
            }
            Act::Release(c) => {
                t.budget -= 1;
                let ver = t.cands[c].lead.expect("a leader resigns").ver;
                self.end_term(t, c, Some(ver));
            }
            Act::Serve(c) => return self.serve(t, c, false),
            Act::ServeLost(c) => {
                t.budget -= 1;
                return self.serve(t, c, true);
            }
            Act::Lose(c) => {
                t.budget -= 1;
                t.cands[c].req = None;
            }
            Act::LoseWatch(c) => {
                t.budget -= 1;
                if let Some(l) = &mut t.cands[c].lead {
                    l.watch = false;
                }
            }
            Act::Crash(c) => self.crash(t, c),
            Act::Restart(c) => {
                t.budget -= 1;
                t.cands[c] = Cand::fresh(t.cands[c].rate);
            }
            Act::Foreign(k) => {
                self.before_write(t);
                foreign(t, k);
            }
        }
        Ok(())
    }

    fn tick(&self, t: &mut St) {
        for (c, cand) in t.cands.iter_mut().enumerate() {
            let own = self.0.durations[c];
            cand.wait = cand.wait.saturating_sub(1);
            if let Some(r) = &mut cand.req {
                r.valid = r.valid.saturating_sub(1);
            }
            let Some(l) = &mut cand.lead else { continue };
            l.valid -= 1;
            l.renew_in = l.renew_in.saturating_sub(1);
            if l.valid == 0 {
                // The deadline passed without an acknowledged renewal: the
                // term is over (on its own clock).
                let l = *l;
                cand.lead = None;
                cand.seen = Seen::Version {
                    ver: l.ver,
                    holder: Holder::Term(l.term),
                    d: own,
                    marker: false,
                };
                cand.chain_d = own;
            }
        }
        if self.0.liveness.is_some() {
            t.clock += 1;
            t.since_crash = t.since_crash.map(|k| k.saturating_add(1));
        }
    }

    fn crash(&self, t: &mut St, c: usize) {
        t.budget -= 1;
        if super::lease::claims(&t.cands[c]) && self.0.liveness.is_some() {
            t.since_crash = Some(0);
        }
        let cand = &mut t.cands[c];
        *cand = Cand {
            up: false,
            req: cand.req,
            ..Cand::fresh(cand.rate)
        };
    }

    /// A follower observes the Lease as it is now.
    pub(super) fn follower_observes(&self, t: &mut St, c: usize) {
        let own = self.0.durations[c];
        let lease = t.lease;
        let cand = t.cands[c];
        let floor = |d: u8| {
            if self.0.rule == Rule::FixedFloor {
                d.max(own)
            } else {
                d
            }
        };
        let (mut wait, mut chain_d) = (cand.wait, cand.chain_d);
        if !lease.present {
            match cand.seen {
                Seen::Nothing if self.0.rule == Rule::FixedFloor => wait = self.real(&cand, own),
                Seen::Nothing => wait = 0,
                Seen::Absent => {}
                Seen::Version {
                    holder: Holder::Empty,
                    marker,
                    ..
                } => {
                    if self.0.rule == Rule::Old || marker {
                        wait = 0;
                    }
                }
                Seen::Version { d, .. } if self.0.rule == Rule::Old => wait = self.real(&cand, d),
                Seen::Version { .. } => wait = wait.max(self.real(&cand, floor(chain_d))),
            }
            let cand = &mut t.cands[c];
            cand.seen = Seen::Absent;
            (cand.wait, cand.chain_d) = (wait, chain_d);
            return;
        }
        if let Seen::Version { ver, .. } = cand.seen
            && ver == lease.ver
        {
            return;
        }
        let same_holder =
            matches!(cand.seen, Seen::Version { holder, .. } if holder == lease.holder);
        match (self.0.rule, lease.holder) {
            (Rule::Old, Holder::Empty) => wait = 0,
            (Rule::Old, _) => wait = self.real(&cand, lease.d),
            (_, Holder::Empty) if lease.marker => (wait, chain_d) = (0, 0),
            // No marker: not a release. Fixed: the previous chain's wait
            // stands. Floor: also a version of a holder we cannot name.
            (Rule::FixedFloor, Holder::Empty) => wait = wait.max(self.real(&cand, own)),
            (_, Holder::Empty) => {}
            _ => {
                let d = floor(lease.d);
                wait = wait.max(self.real(&cand, d));
                chain_d = if same_holder { chain_d.max(d) } else { d };
            }
        }
        let cand = &mut t.cands[c];
        cand.seen = Seen::Version {
            ver: lease.ver,
            holder: lease.holder,
            d: lease.d,
            marker: lease.marker,
        };
        cand.replay = 0; // the replay would start from this view
        (cand.wait, cand.chain_d) = (wait, chain_d);
    }

    /// A leader observes the Lease as it is now (it differs from the version
    /// the leader knows).
    fn leader_observes(&self, t: &mut St, c: usize) {
        let l = t.cands[c].lead.expect("a leader observes");
        let lease = t.lease;
        let ours = lease.present && lease.holder == Holder::Term(l.term);
        if ours && (self.0.rule == Rule::Old || lease.d == self.0.durations[c]) {
            // Old: any write keeping our name is ignored. Fixed: a write that
            // keeps holder and duration is re-asserted.
            t.cands[c].lead.as_mut().expect("leader").ver = lease.ver;
            return;
        }
        // Fixed: a foreign write ends the term at once; release by CAS when
        // the Lease still names us. Old: another holder or no Lease ends it.
        self.end_term(t, c, if ours { Some(lease.ver) } else { None });
        self.follower_observes(t, c);
    }

    /// Stop claiming; release on `release` (a version to CAS) when given
    /// and no request is in flight.
    fn end_term(&self, t: &mut St, c: usize, release: Option<u8>) {
        let own = self.0.durations[c];
        let cand = &mut t.cands[c];
        let l = cand.lead.take().expect("a leader ends its term");
        cand.seen = Seen::Version {
            ver: l.ver,
            holder: Holder::Term(l.term),
            d: own,
            marker: false,
        };
        (cand.wait, cand.chain_d) = (0, own);
        if let Some(expect) = release
            && cand.req.is_none()
        {
            cand.req = Some(Req {
                kind: Kind::Release,
                term: l.term,
                expect,
                valid: 0,
                replay: 0,
            });
        }
    }

    fn campaign(&self, t: &mut St, c: usize) {
        let term = next_term(t);
        t.issued.1 = term;
        let cand = &t.cands[c];
        let (kind, expect) = match cand.seen {
            Seen::Version { ver, .. } => (Kind::Acquire, ver),
            _ => (Kind::Create, 0),
        };
        let valid = self.real(cand, self.0.durations[c] - self.0.margin);
        let replay = if kind == Kind::Create { cand.replay } else { 0 };
        t.cands[c].req = Some(Req {
            kind,
            term,
            expect,
            valid,
            replay,
        });
    }

    /// The server applies `c`'s request; its answer reaches `c` at once
    /// unless `lost`. (An answer that arrives later only shortens what the
    /// candidate does with it: a leader's claim ends at send + duration −
    /// margin whenever the answer comes, and a refusal is what a read at
    /// that instant shows; so the adversary's only use of a late answer is
    /// losing it.)
    fn serve(&self, t: &mut St, c: usize, lost: bool) -> Result<(), String> {
        let r = t.cands[c].req.take().expect("a request to serve");
        let ok = Self::succeeds(t, &r);
        if ok {
            self.before_write(t);
        }
        let (ver, mut token) = (next_version(t), t.lease.token);
        if ok {
            t.issued.0 = ver;
        }
        if ok {
            let holder = Holder::Term(r.term);
            let d = self.0.durations[c];
            let lease = t.lease;
            t.lease = match r.kind {
                Kind::Acquire => {
                    // max(annotation, highest token seen) + 1: the
                    // annotation is the highest token ever written (creates
                    // seed above every token, below), so it is the max.
                    token = lease.token + 1;
                    Lease {
                        holder,
                        d,
                        ver,
                        token,
                        marker: false,
                        present: true,
                    }
                }
                Kind::Create => {
                    // Seeded with max(highest seen + 1, Unix ms): assumed
                    // ahead of every token (no two acquisitions per ms).
                    token = max_token(t) + 1;
                    Lease {
                        holder,
                        d,
                        ver,
                        token,
                        marker: false,
                        present: true,
                    }
                }
                Kind::Renew => Lease {
                    holder,
                    d,
                    ver,
                    marker: false,
                    ..lease
                },
                Kind::Release => Lease {
                    holder: Holder::Empty,
                    d: 1,
                    ver,
                    marker: true,
                    ..lease
                },
            };
            record_write(t, Some(c));
        }
        if lost || !t.cands[c].up {
            return Ok(());
        }
        self.answer(t, c, r, ok, ver, token)
    }

    /// `c` receives the answer to `r`.
    fn answer(
        &self,
        t: &mut St,
        c: usize,
        r: Req,
        ok: bool,
        ver: u8,
        token: u8,
    ) -> Result<(), String> {
        let own = self.0.durations[c];
        match (r.kind, ok) {
            (Kind::Acquire | Kind::Create, true) if t.cands[c].lead.is_none() => {
                let cand = &mut t.cands[c];
                let own_write = Seen::Version {
                    ver,
                    holder: Holder::Term(r.term),
                    d: own,
                    marker: false,
                };
                let replayed = r.kind == Kind::Create && r.replay > 0;
                if replayed || r.valid == 0 {
                    // No claim: acknowledged too late, or the replay shows a
                    // term we never saw (then leave the Lease unclaimed for
                    // that term's duration from this answer, and take it by
                    // CAS: a new term, the next token). What was observed
                    // meanwhile is kept.
                    if !matches!(cand.seen, Seen::Version { ver: v, .. } if v >= ver) {
                        (cand.seen, cand.chain_d) = (own_write, own);
                    }
                    if replayed {
                        let d = if self.0.rule == Rule::FixedFloor {
                            r.replay.max(own)
                        } else {
                            r.replay
                        };
                        cand.wait = cand.wait.max(self.real(cand, d));
                    }
                    return Ok(());
                }
                (cand.seen, cand.wait, cand.chain_d) = (own_write, 0, own);
                let renew_in = self.renew_in(cand);
                cand.lead = Some(Lead {
                    term: r.term,
                    ver,
                    valid: r.valid,
                    renew_in,
                    token,
                    watch: true,
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
            (Kind::Acquire | Kind::Create, false) if t.cands[c].lead.is_none() => {
                self.follower_observes(t, c)
            }
            (Kind::Renew, _) if t.cands[c].lead.is_some_and(|l| l.term == r.term) => {
                if ok {
                    let renew_in = self.renew_in(&t.cands[c]);
                    let l = t.cands[c].lead.as_mut().expect("leader");
                    (l.valid, l.ver, l.renew_in, l.watch) = (r.valid, ver, renew_in, true);
                } else {
                    // 409: re-read, and react as to an observation.
                    self.leader_observes(t, c);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn fault_act(fault: Fault, c: usize) -> Act {
    match fault {
        Fault::Lose => Act::Lose(c),
        Fault::LoseAnswer => Act::ServeLost(c),
        Fault::Crash => Act::Crash(c),
        Fault::Restart => Act::Restart(c),
        Fault::LoseWatch => Act::LoseWatch(c),
        Fault::Release => Act::Release(c),
        Fault::Foreign(k) => Act::Foreign(k),
    }
}

fn foreign(t: &mut St, k: Foreign) {
    t.budget -= 1;
    let ver = next_version(t);
    t.issued.0 = ver;
    let l = &mut t.lease;
    match k {
        Foreign::Duration => (l.d, l.ver) = (1, ver),
        Foreign::Holder => (l.holder, l.ver) = (Holder::Foreign, ver),
        Foreign::Empty => (l.holder, l.ver) = (Holder::Empty, ver),
        Foreign::Delete => *l = ABSENT,
        Foreign::Touch => l.ver = ver,
    }
    record_write(t, None);
}

/// What the replay after a create will show: the Lease as just written by
/// `writer` (None: a foreign write), for every follower (its replay starts
/// at its last complete view: the last version it observed, or its first
/// read) and every create still on the wire. Counted conservatively: every
/// term's write, the renewals of the holder last seen included.
fn record_write(t: &mut St, writer: Option<usize>) {
    let l = t.lease;
    if !l.present || l.holder == Holder::Empty {
        return;
    }
    for (c, cand) in t.cands.iter_mut().enumerate() {
        if Some(c) == writer {
            continue;
        }
        if cand.lead.is_none() && cand.seen != Seen::Nothing {
            cand.replay = cand.replay.max(l.d);
        }
        if let Some(r) = &mut cand.req
            && r.kind == Kind::Create
        {
            r.replay = r.replay.max(l.d);
        }
    }
}

fn next_version(t: &St) -> u8 {
    let mut v = t.lease.ver.max(t.issued.0);
    for c in t.cands.iter() {
        if let Seen::Version { ver, .. } = c.seen {
            v = v.max(ver);
        }
        if let Some(l) = &c.lead {
            v = v.max(l.ver);
        }
        if let Some(r) = &c.req {
            v = v.max(r.expect);
        }
    }
    v + 1
}

fn max_token(t: &St) -> u8 {
    let mut m = t.lease.token.max(t.max_claimed);
    for c in t.cands.iter() {
        if let Some(l) = &c.lead {
            m = m.max(l.token);
        }
    }
    m
}

fn next_term(t: &St) -> u8 {
    let mut m = t.issued.1;
    let mut see = |h: Holder| {
        if let Holder::Term(x) = h {
            m = m.max(x);
        }
    };
    see(t.lease.holder);
    for c in t.cands.iter() {
        if let Seen::Version { holder, .. } = c.seen {
            see(holder);
        }
        if let Some(l) = &c.lead {
            see(Holder::Term(l.term));
        }
        if let Some(r) = &c.req {
            see(Holder::Term(r.term));
        }
    }
    m + 1
}
