//! The operations' precedence table (DESIGN.md, "Operations: one
//! precedence table"), decided here and only here, over what the leader
//! knows (the registry as last listed, the controls as last read):
//!
//! | control | while it holds |
//! |---|---|
//! | pause | no voluntary handover starts: no preemption, no revision handover, no switchover, no step-down for an unhealthy app |
//! | freeze | the member is not eligible: never named, never preempted to, a switchover to it is refused |
//! | switchover | never silently undone: one to a lower priority (or an older revision) than the best ready candidate is refused unless forced; a forced one pins its target |
//! | revision | hands over at once to a ready, eligible candidate of a newer revision with priority ≥ the leader's |
//! | priority | preemption after `--preempt-after` (the leader's value counts) |
//!
//! Everything here is pure: a ranking over the registry's list. The
//! Elector calls [`successor_for`] when it releases, [`Rules::may_hand_over`]
//! before a preemption or a revision handover, [`Rules::may_step_down`]
//! before an unhealthy step-down, and [`check_target`] before a switchover.

use std::collections::BTreeSet;
use std::time::SystemTime;

use super::SwitchoverRefusal;
use crate::backend::candidates::{Candidate, Listed, best_candidate, newer_revision};

/// What the precedence table is applied to: the leader (or the candidate
/// deciding) and the controls in force.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    /// The deciding candidate's identity (the leader, usually).
    pub me: &'a str,
    /// Whether the election is paused.
    pub paused: bool,
    /// The member a forced switchover pinned as leader, if any.
    pub pinned: Option<&'a str>,
    /// The wall-clock time against which freezes are compared.
    pub now: SystemTime,
}

impl Rules<'_> {
    /// Whether a voluntary handover (a preemption by priority or a
    /// revision handover) may start: not while paused (nobody could take
    /// the term), not while this leader is pinned by a forced switchover.
    pub fn may_hand_over(&self) -> bool {
        !self.paused && self.pinned != Some(self.me)
    }

    /// Whether an unhealthy app may make the leader step down: not while
    /// paused (the step-down would leave nobody leading until resume).
    pub fn may_step_down(&self) -> bool {
        !self.paused
    }
}

/// Whether `l`'s record says it is frozen at `now`.
fn frozen_at(l: &Listed, now: SystemTime) -> Option<SystemTime> {
    l.candidate.frozen_until.filter(|t| *t > now)
}

/// The successor a release by `rules.me` names, from the registry `listed`:
/// the pinned member when it is eligible, else the registry's best
/// eligible candidate (not lapsed, ready, not frozen, priority above 0, not
/// `me`; then priority, newest revision, freshest record, identity). The
/// one choice of a successor in the program: backends only carry it out.
pub fn successor_for<'a>(listed: &'a [Listed], rules: &Rules) -> Option<&'a Candidate> {
    let pinned = rules.pinned.filter(|p| *p != rules.me).and_then(|p| {
        listed
            .iter()
            .find(|l| l.candidate.identity == p && eligible(l, rules))
    });
    pinned
        .map(|l| &l.candidate)
        .or_else(|| best_candidate(listed, rules.me, rules.now))
}

fn eligible(l: &Listed, rules: &Rules) -> bool {
    l.alive() && l.candidate.ready && l.candidate.priority > 0 && frozen_at(l, rules.now).is_none()
}

/// Whether `to` may take over from `leader` (of priority `priority`, when
/// known: its own record may be missing while it leads) by a switchover
/// (`force`: even to a lower priority or an older revision than the best
/// ready candidate), as the registry `listed` shows it at `now`.
///
/// # Errors
/// The first [`SwitchoverRefusal`] that applies, in the table's order:
/// the pause, then the target itself (unknown, lapsed, frozen, not ready,
/// priority 0), then what would undo the switchover (a better priority or
/// a newer revision) unless forced.
pub fn check_target(
    listed: &[Listed],
    (leader, priority, paused): (&str, Option<u32>, bool),
    to: &str,
    (force, now): (bool, SystemTime),
) -> Result<(), SwitchoverRefusal> {
    if paused {
        return Err(SwitchoverRefusal::Paused);
    }
    if to == leader {
        return Err(SwitchoverRefusal::Itself(to.to_owned()));
    }
    let Some(l) = listed.iter().find(|l| l.candidate.identity == to) else {
        return Err(SwitchoverRefusal::Unknown(to.to_owned()));
    };
    let c = &l.candidate;
    if !l.alive() {
        return Err(SwitchoverRefusal::Lapsed(to.to_owned()));
    }
    if let Some(until) = frozen_at(l, now) {
        let until = humantime::format_rfc3339_seconds(until).to_string();
        return Err(SwitchoverRefusal::Frozen(to.to_owned(), until));
    }
    if !c.ready {
        return Err(SwitchoverRefusal::NotReady(to.to_owned()));
    }
    if c.priority == 0 {
        return Err(SwitchoverRefusal::NeverLeads(to.to_owned()));
    }
    if force {
        return Ok(());
    }
    would_undo(listed, (leader, priority), c, now)
}

/// Whether preemption or the revision handover would undo a switchover to
/// `c` (see [`check_target`]).
fn would_undo(
    listed: &[Listed],
    (leader, priority): (&str, Option<u32>),
    c: &Candidate,
    now: SystemTime,
) -> Result<(), SwitchoverRefusal> {
    let to = c.identity.as_str();
    // The leader's own record counts even when lapsed: it does not renew
    // it while leading and publishes it again once it follows.
    let best = listed
        .iter()
        .filter(|o| o.candidate.identity != to)
        .filter(|o| {
            o.candidate.identity == leader
                || (o.alive() && o.candidate.ready && frozen_at(o, now).is_none())
        })
        .max_by_key(|o| o.candidate.priority);
    let best = best.map(|b| (b.candidate.identity.as_str(), b.candidate.priority));
    let best = match (best, priority) {
        (Some(b), Some(p)) if p > b.1 => Some((leader, p)),
        (None, Some(p)) => Some((leader, p)),
        (b, _) => b,
    };
    if let Some((best, best_priority)) = best.filter(|b| b.1 > c.priority) {
        return Err(SwitchoverRefusal::LowerPriority {
            to: to.to_owned(),
            priority: c.priority,
            best: best.to_owned(),
            best_priority,
        });
    }
    if let Some(n) = newer_revision(listed, to, (c.priority, &c.revision), None) {
        return Err(SwitchoverRefusal::OlderRevision {
            to: to.to_owned(),
            newer: n.identity.clone(),
        });
    }
    Ok(())
}

/// The controls of the precedence table's pairwise matrix, in the table's
/// order (each matrix test applies ordered pairs of them to an election
/// and checks it against a [`TableModel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixOp {
    /// Pause the election.
    Pause,
    /// Freeze a follower.
    Freeze,
    /// A switchover by the leader.
    Switchover,
    /// A forced switchover by the leader.
    Forced,
    /// A candidate of a newer revision joins.
    Revision,
    /// A candidate of a higher priority joins.
    Priority,
    /// The leader's app turns unhealthy.
    Unhealthy,
    /// The leader gets SIGTERM.
    Sigterm,
    /// The leader gets SIGKILL: no release, its record stays ready.
    Sigkill,
}

impl MatrixOp {
    /// Every control, in the table's order.
    pub const ALL: [MatrixOp; 9] = [
        MatrixOp::Pause,
        MatrixOp::Freeze,
        MatrixOp::Switchover,
        MatrixOp::Forced,
        MatrixOp::Revision,
        MatrixOp::Priority,
        MatrixOp::Unhealthy,
        MatrixOp::Sigterm,
        MatrixOp::Sigkill,
    ];
}

/// One member in a [`TableModel`]: (identity, priority, revision number,
/// ready).
pub type ModelMember = (String, u32, u32, bool);

/// **Which candidate the precedence table names as leader**, as a small
/// model of the table over abstract members (no registry, no clock), for
/// the pairwise matrix tests that check an election against it (the
/// in-memory one in `src/elector/matrix_tests.rs` and the real backends'
/// in `tests/suite/ops_matrix.rs`). Its rules restate the table above:
/// the best eligible member is the highest priority, then the newest
/// revision (ties: any of them); a pause stops every voluntary handover;
/// a forced switchover pins its target.
#[derive(Clone, Debug, Default)]
pub struct TableModel {
    /// Whether the election is paused.
    pub paused: bool,
    /// The frozen members (never named).
    pub frozen: BTreeSet<String>,
    /// The member a forced switchover pinned, if any.
    pub pinned: Option<String>,
    /// The members that may be named.
    pub members: Vec<ModelMember>,
    /// The leaders the table allows now, any one of them (empty: nobody).
    pub leader: BTreeSet<String>,
}

impl TableModel {
    /// The members that may lead: ready and not frozen.
    pub fn eligible(&self) -> impl Iterator<Item = &ModelMember> {
        self.members
            .iter()
            .filter(|m| m.3 && !self.frozen.contains(&m.0))
    }

    /// The best eligible members other than `not`: highest priority, then
    /// newest revision (ties: any of them).
    pub fn best(&self, not: &str) -> BTreeSet<String> {
        let others: Vec<_> = self.eligible().filter(|m| m.0 != not).collect();
        let top = others.iter().map(|m| (m.1, m.2)).max();
        others
            .iter()
            .filter(|m| Some((m.1, m.2)) == top)
            .map(|m| m.0.clone())
            .collect()
    }

    /// The one leader, when the model names exactly one.
    pub fn the_leader(&self) -> Option<String> {
        (self.leader.len() == 1).then(|| self.leader.iter().next().cloned())?
    }

    /// Member `id`, if it is one.
    pub fn of(&self, id: &str) -> Option<&ModelMember> {
        self.members.iter().find(|m| m.0 == id)
    }

    /// Whether `leader` (`None`: nobody) is one the model allows.
    pub fn allows(&self, leader: Option<&str>) -> bool {
        match leader {
            Some(l) => self.leader.contains(l),
            None => self.leader.is_empty(),
        }
    }

    /// Preemption and the revision handover, after any change: a better
    /// eligible member takes over unless paused or the leader is pinned.
    pub fn settle(&mut self) {
        let Some(l) = self.the_leader() else { return };
        if self.paused || self.pinned.as_deref() == Some(l.as_str()) {
            return;
        }
        let Some(&(_, p, r, _)) = self.of(&l) else {
            return;
        };
        let better: BTreeSet<String> = self
            .eligible()
            .filter(|m| m.0 != l && (m.1 > p || (m.1 == p && m.2 > r)))
            .map(|m| m.0.clone())
            .collect();
        if !better.is_empty() {
            let top = self.best("");
            self.leader = top.intersection(&better).cloned().collect();
        }
    }

    /// Whether the table refuses a switchover by `leader` to `to`
    /// (`force`: even to a lower priority or an older revision): paused,
    /// a frozen target, or (unless forced) one preemption would undo.
    ///
    /// # Panics
    /// When `to` is not a member.
    pub fn refuses(&self, leader: &str, to: &str, force: bool) -> bool {
        let (_, tp, tr, _) = self.of(to).cloned().expect("a member");
        let undone = self
            .eligible()
            .chain(self.of(leader))
            .any(|x| x.0 != to && (x.1 > tp || (x.1 == tp && x.2 > tr)));
        self.paused || self.frozen.contains(to) || (!force && undone)
    }

    /// A switchover to `to` that the table allows: it leads, pinned when
    /// forced.
    pub fn switched(&mut self, to: &str, force: bool) {
        self.leader = BTreeSet::from([to.to_owned()]);
        self.pinned = force.then(|| to.to_owned());
    }

    /// Member `l` leaves the candidates (`gone`: a SIGTERM or a SIGKILL) or turns
    /// unhealthy: the best other member is named unless paused; paused,
    /// a leader that left leaves nobody.
    pub fn loses(&mut self, l: &str, gone: bool) {
        if gone {
            self.members.retain(|x| x.0 != l);
        } else {
            self.members
                .iter_mut()
                .filter(|x| x.0 == l)
                .for_each(|x| x.3 = false);
        }
        if !self.paused {
            self.leader = self.best(l);
            self.pinned = self.pinned.take().filter(|p| p != l);
        } else if gone {
            self.leader.clear();
            self.pinned = self.pinned.take().filter(|p| p != l);
        }
    }
}

#[cfg(test)]
#[path = "precedence_tests.rs"]
mod tests;
