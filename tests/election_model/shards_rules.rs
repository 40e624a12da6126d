//! The shard model's transitions (see [`super::shards`]).

use super::shards::{
    Act, Fault, Kind, MEMBERS, Member, Record, Req, Rule, SSt, Session, ShardModel, claims,
};

impl ShardModel {
    fn real(&self, m: &Member, local: u8) -> u8 {
        (i16::from(local) + i16::from(m.rate)).max(1) as u8
    }

    fn alive(s: &SSt, session: u8) -> bool {
        session != 0 && s.sessions.iter().any(|x| x.1 == session && x.2 > 0)
    }

    /// Liveness runs: the member the assignment names for shard `i`, from
    /// the members with a live session in the store (`i mod m`).
    fn target(&self, s: &SSt, i: usize) -> Option<usize> {
        let live: Vec<usize> = (0..self.0.members)
            .filter(|&c| s.sessions.iter().any(|x| x.2 > 0 && usize::from(x.0) == c))
            .collect();
        (!live.is_empty()).then(|| live[i % live.len()])
    }

    /// The members' and the store's steps (in liveness runs: every one of
    /// them is taken before time passes).
    pub(super) fn moves(&self, s: &SSt, out: &mut Vec<Act>) {
        let live = self.0.liveness.is_some();
        for c in 0..self.0.members {
            let m = &s.members[c];
            if m.req.is_some() {
                out.push(Act::Serve(c));
            }
            if !m.up || m.req.is_some() {
                continue;
            }
            let Some(x) = m.session else {
                out.push(Act::Grant(c));
                continue;
            };
            if !live || x.renew_in == 0 {
                out.push(Act::Renew(c));
            }
            for i in 0..self.0.shards {
                let wanted = !live || self.target(s, i) == Some(c);
                if m.held[i] && (!live || !wanted) {
                    out.push(Act::Release(c, i));
                }
                let free = s.records[i].is_none_or(|r| r.session == x.id);
                let may = free || self.0.rule == Rule::TakeOver;
                if !m.held[i] && wanted && may && x.valid > 0 {
                    out.push(Act::Acquire(c, i));
                }
            }
        }
    }

    pub(super) fn faults(&self, s: &SSt, out: &mut Vec<Act>) {
        if s.budget == 0 {
            return;
        }
        let live = self.0.liveness.is_some();
        let up = s.members.iter().filter(|m| m.up).count();
        // Liveness runs: a member joins a settled set (every shard owned).
        let settled = (0..self.0.shards).all(|i| s.members.iter().any(|m| claims(m, i)));
        for &f in self.0.faults {
            for c in 0..self.0.members {
                let m = &s.members[c];
                let applies = match f {
                    // Liveness runs keep one member up to own the shards.
                    Fault::Crash => m.up && (!live || up > 1),
                    Fault::Leave => m.up && m.session.is_some() && m.req.is_none() && up > 1,
                    Fault::Start => !m.up && m.req.is_none() && (!live || settled),
                    Fault::Lose | Fault::LoseAnswer => m.req.is_some(),
                };
                if applies {
                    out.push(Act::Fault(f, c));
                }
            }
        }
    }

    pub(super) fn apply(&self, t: &mut SSt, a: Act) -> Result<(), String> {
        let send = |t: &mut SSt, c: usize, kind: Kind, valid: u8| {
            let session = t.members[c].session.map_or(0, |x| x.id);
            t.members[c].req = Some(Req {
                kind,
                session,
                valid,
            });
        };
        let valid = |t: &SSt, c: usize| self.real(&t.members[c], self.0.ttl - self.0.margin);
        match a {
            Act::Tick => self.tick(t),
            Act::Grant(c) => {
                let v = valid(t, c);
                let id = next_session(t);
                t.members[c].req = Some(Req {
                    kind: Kind::Grant,
                    session: id,
                    valid: v,
                });
            }
            Act::Renew(c) => send(t, c, Kind::Renew, valid(t, c)),
            Act::Acquire(c, i) => send(t, c, Kind::Acquire(i as u8), 0),
            Act::Release(c, i) => {
                if self.0.rule != Rule::ReleaseLate {
                    t.members[c].held[i] = false; // stop claiming first
                }
                send(t, c, Kind::Release(i as u8), 0);
            }
            Act::Serve(c) => return self.serve(t, c, false),
            Act::Fault(f, c) => {
                t.budget -= 1;
                return self.fault(t, f, c);
            }
        }
        Ok(())
    }

    fn fault(&self, t: &mut SSt, f: Fault, c: usize) -> Result<(), String> {
        match f {
            Fault::Crash => {
                if self.0.liveness.is_some() {
                    t.since_crash = Some(0);
                }
                let m = &mut t.members[c];
                *m = Member {
                    up: false,
                    req: m.req,
                    ..Member::fresh(m.rate)
                };
            }
            Fault::Start => t.members[c] = Member::fresh(t.members[c].rate),
            Fault::Leave => {
                let m = &mut t.members[c];
                let id = m.session.map_or(0, |x| x.id);
                *m = Member {
                    up: false,
                    req: Some(Req {
                        kind: Kind::Revoke,
                        session: id,
                        valid: 0,
                    }),
                    ..Member::fresh(m.rate)
                };
            }
            Fault::Lose => t.members[c].req = None,
            Fault::LoseAnswer => return self.serve(t, c, true),
        }
        Ok(())
    }

    fn tick(&self, t: &mut SSt) {
        for x in t.sessions.iter_mut() {
            x.2 = x.2.saturating_sub(1);
            if x.2 == 0 {
                *x = (0, 0, 0);
            }
        }
        drop_orphans(t);
        for m in t.members.iter_mut() {
            if let Some(r) = &mut m.req {
                r.valid = r.valid.saturating_sub(1);
            }
            let Some(x) = &mut m.session else { continue };
            x.valid -= 1;
            x.renew_in = x.renew_in.saturating_sub(1);
            if x.valid == 0 {
                // The validity ended: stop claiming, forget the session.
                (m.session, m.held) = (None, [false; super::shards::SHARDS]);
            }
        }
        if self.0.liveness.is_some() {
            t.clock += 1;
            t.since_crash = t.since_crash.map(|k| k.saturating_add(1));
        }
    }

    /// The store applies `c`'s request; the answer reaches `c` at once
    /// unless `lost` (a later answer would only shorten what it gives).
    fn serve(&self, t: &mut SSt, c: usize, lost: bool) -> Result<(), String> {
        let r = t.members[c].req.take().expect("a request");
        let alive = Self::alive(t, r.session);
        let mut token = 0;
        let ok = match r.kind {
            Kind::Grant => {
                let slot = t
                    .sessions
                    .iter_mut()
                    .find(|x| x.2 == 0)
                    .expect("a free session slot");
                *slot = (c as u8, r.session, self.0.ttl);
                true
            }
            Kind::Renew => {
                for x in t
                    .sessions
                    .iter_mut()
                    .filter(|x| x.1 == r.session && x.2 > 0)
                {
                    x.2 = self.0.ttl;
                }
                alive
            }
            Kind::Acquire(i) => {
                let i = usize::from(i);
                let free = t.records[i].is_none_or(|x| x.session == r.session);
                let ok = alive && (free || self.0.rule == Rule::TakeOver);
                if ok {
                    t.counters[i] += 1;
                    token = t.counters[i];
                    t.records[i] = Some(Record {
                        member: c as u8,
                        session: r.session,
                        token,
                    });
                }
                ok
            }
            Kind::Release(i) => {
                let i = usize::from(i);
                if t.records[i].is_some_and(|x| x.session == r.session) {
                    t.records[i] = None;
                }
                true
            }
            Kind::Revoke => {
                for x in t.sessions.iter_mut().filter(|x| x.1 == r.session) {
                    *x = (0, 0, 0);
                }
                drop_orphans(t);
                true
            }
        };
        if lost || !t.members[c].up {
            return Ok(());
        }
        self.answer(t, c, r, ok, token)
    }

    /// `c` receives the answer to `r`.
    fn answer(&self, t: &mut SSt, c: usize, r: Req, ok: bool, token: u8) -> Result<(), String> {
        let renew_in = if self.0.liveness.is_some() {
            self.real(&t.members[c], self.0.renew)
        } else {
            0
        };
        let m = &mut t.members[c];
        let current = m.session.is_some_and(|x| x.id == r.session);
        match r.kind {
            Kind::Grant if m.session.is_none() && r.valid > 0 => {
                m.session = Some(Session {
                    id: r.session,
                    valid: r.valid,
                    renew_in,
                });
            }
            Kind::Renew if current && ok && r.valid > 0 => {
                let x = m.session.as_mut().expect("a session");
                (x.valid, x.renew_in) = (r.valid, renew_in);
            }
            Kind::Renew if current && !ok => {
                // The session is gone: every shard with it.
                (m.session, m.held) = (None, [false; super::shards::SHARDS]);
            }
            Kind::Acquire(i) if current && ok => {
                let i = usize::from(i);
                (m.held[i], m.tokens[i]) = (true, token);
                if token <= t.max_claimed[i] {
                    return Err(format!(
                        "{} claims shard {i} with token {token}, not above {}",
                        super::lease::name(c),
                        t.max_claimed[i]
                    ));
                }
                t.max_claimed[i] = token;
            }
            Kind::Release(i) if current => m.held[usize::from(i)] = false,
            _ => {}
        }
        Ok(())
    }
}

/// Deletes the records whose session is gone (the store does it with the
/// session: etcd's keys bound to a lease, Redis's keys under the same `PX`).
fn drop_orphans(t: &mut SSt) {
    for i in 0..t.records.len() {
        if t.records[i].is_some_and(|r| !ShardModel::alive(t, r.session)) {
            t.records[i] = None;
        }
    }
}

/// A session id above every one in use.
fn next_session(t: &SSt) -> u8 {
    let mut m = 0;
    for x in &t.sessions {
        m = m.max(x.1);
    }
    for r in t.records.iter().flatten() {
        m = m.max(r.session);
    }
    for c in t.members.iter().take(MEMBERS) {
        m = m.max(c.session.map_or(0, |x| x.id));
        m = m.max(c.req.map_or(0, |r| r.session));
    }
    m + 1
}
