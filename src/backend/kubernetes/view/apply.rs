//! The events a [`LeaseView`] applies and the questions it answers.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::controls::controls_only;
use super::{
    DEFAULT_TTL, Hold, LeaseView, Own, Pending, Seen, Standing, UNANSWERED_KEPT, WatchView,
    duration_of, edit_of, released_by_holder, renewed_before,
};
use crate::backend::kubernetes::{Holder, Term, holder_of, holder_view, lease_duration_secs};
use crate::backend::kubernetes::{rv_of, token_of};

/// What recording our own create left: the claim floor and the whole
/// duration a create waits when no replay can be had.
#[derive(Clone, Copy, Debug)]
pub(in crate::backend::kubernetes) struct Created {
    /// The `not_before` of an earlier pending create of ours, if any: a
    /// later claim never comes before it.
    pub(in crate::backend::kubernetes) floor: Option<Instant>,
    /// The longest of the created Lease's duration and the duration of the
    /// version seen before it.
    pub(in crate::backend::kubernetes) whole: Duration,
}

/// Events.
impl LeaseView {
    /// A campaign with this TTL starts (the silence to wait for a Lease
    /// that carries no usable `leaseDurationSeconds`, and the floor of any
    /// duration counted).
    pub(in crate::backend::kubernetes) fn campaigning(&mut self, ttl: Duration) {
        self.ttl = Some(ttl);
    }

    /// The Lease was read at `now`, when this machine's wall clock said
    /// `wall`. As [`LeaseView::observed`]; on the first sight of the Lease in
    /// this process it also records how long before `wall` its holder last
    /// renewed it (`renewTime`), for the cold-start rule of the module docs.
    /// Returns that time when this sight found the holder's term ended by
    /// that rule (for the log).
    pub(in crate::backend::kubernetes) fn observed_with_wall(
        &mut self,
        lease: &Lease,
        now: Instant,
        wall: Timestamp,
    ) -> Option<Duration> {
        let first = self.seen.is_none();
        self.observed(lease, now);
        let (ttl, skew) = (self.fallback_ttl(), self.max_skew);
        let s = self.seen.as_mut().filter(|_| first)?;
        s.renewed_before_sight = renewed_before(lease, wall);
        s.renewed_before_sight
            .filter(|_| s.ended_before_sight(ttl, skew))
    }

    /// The Lease was read, written or delivered by a watch at `now`. A new
    /// `resourceVersion` restarts the silence clock and carries the end of
    /// the previous version's promise (unless its holder released it).
    pub(in crate::backend::kubernetes) fn observed(&mut self, lease: &Lease, now: Instant) {
        let rv = rv_of(lease);
        let (fallback, skew) = (self.fallback_ttl(), self.max_skew);
        let (changed_at, carry, renewed_before_sight) = match &self.seen {
            // The same version, or an operator's write of the controls
            // alone (not the holder's: `view::controls`).
            Some(s) if !s.deleted && (rv_of(&s.lease) == rv || controls_only(&s.lease, lease)) => {
                (s.changed_at, s.carry, s.renewed_before_sight)
            }
            Some(s) if released_by_holder(lease, holder_of(&s.lease)) => (now, None, None),
            Some(s) => (now, s.silent_until(fallback, skew), None),
            None => (now, None, None),
        };
        self.max_token = self.max_token.max(token_of(lease));
        self.sightings += 1;
        self.resume_rv = Some(rv.to_owned());
        self.absent_rv = None;
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.holder != holder_of(lease))
        {
            // Someone else wrote the Lease: our pending create is gone.
            self.pending = None;
        }
        self.seen = Some(Seen {
            lease: lease.clone(),
            changed_at,
            deleted: false,
            absent_since: None,
            carry,
            renewed_before_sight,
        });
    }

    /// A version of the Lease delivered at `now` by a follower's watch:
    /// applied as [`LeaseView::observed`]; a version not seen before is
    /// remembered as its holder's last renewal heard (for
    /// [`LeaseView::heard_at`]).
    pub(in crate::backend::kubernetes) fn watched(&mut self, lease: &Lease, now: Instant) {
        let new = self.seen.as_ref().is_none_or(|s| {
            s.deleted || (rv_of(&s.lease) != rv_of(lease) && !controls_only(&s.lease, lease))
        });
        self.observed(lease, now);
        if new {
            self.watched = Some((holder_of(lease).to_owned(), now));
        }
    }

    /// When our watch last delivered a new version of `holder`'s term,
    /// while the Lease as last seen still names that holder.
    pub(in crate::backend::kubernetes) fn heard_at(&self, holder: &str) -> Option<Instant> {
        let (h, at) = self.watched.as_ref()?;
        let current = self.lease().is_some_and(|l| holder_of(l) == holder);
        (h == holder && current).then_some(*at)
    }

    /// The Lease was found gone at `now`: deleted at version `at` (a
    /// watch's DELETED event, a LIST's version), else after the last
    /// version we had a complete view of. The first absence point of a run
    /// of absent reads is kept: a replay from it misses no term created
    /// since.
    pub(in crate::backend::kubernetes) fn deleted(&mut self, at: Option<&str>, now: Instant) {
        if let Some(s) = &mut self.seen {
            s.deleted = true;
            s.absent_since.get_or_insert(now);
        }
        self.sightings += 1;
        let resume = self.resume_rv.take();
        if self.absent_rv.is_none() {
            self.absent_rv = at.map(str::to_owned).or(resume);
        }
    }

    /// A watch (re)established or a LIST answered at version `rv` (or a
    /// bookmark moved it): a reopened watch resumes there. The silence
    /// clock does not move.
    pub(in crate::backend::kubernetes) fn resume_from(&mut self, rv: String) {
        self.resume_rv = Some(rv);
    }

    /// RBAC denies `watch`: follow by polling. `true` the first time.
    pub(in crate::backend::kubernetes) fn watch_denied(&mut self) -> bool {
        !std::mem::replace(&mut self.no_watch, true)
    }

    /// RBAC denies `list`: no absence point for a fresh process.
    pub(in crate::backend::kubernetes) fn list_denied(&mut self) {
        self.no_list = true;
    }

    /// An acquisition as `holder` is being sent.
    pub(in crate::backend::kubernetes) fn sent(&mut self, holder: &str) {
        if self.unanswered.len() >= UNANSWERED_KEPT {
            self.unanswered.remove(0);
        }
        self.unanswered.push(holder.to_owned());
    }

    /// The acquisition as `holder` was answered (written, conflict or
    /// error): it is no longer a term nobody claims.
    pub(in crate::backend::kubernetes) fn answered(&mut self, holder: &str) {
        self.unanswered.retain(|h| h != holder);
    }

    /// Our create as `holder` was answered with `lease` at `now`. Until a
    /// replay says otherwise it stays pending for a whole duration (safe if
    /// the campaign is dropped now).
    pub(in crate::backend::kubernetes) fn created(
        &mut self,
        lease: &Lease,
        holder: &str,
        now: Instant,
    ) -> Created {
        let fallback = self.fallback_ttl();
        let before = self.seen.as_ref().map(|s| duration_of(&s.lease, fallback));
        let whole = duration_of(lease, fallback).max(before.unwrap_or(Duration::ZERO));
        let floor = self.pending.as_ref().map(|p| p.not_before);
        self.pending = Some(Pending {
            holder: holder.to_owned(),
            not_before: floor.unwrap_or(now).max(now + whole),
            previous: holder_view(lease),
        });
        self.answered(holder);
        self.observed(lease, now);
        Created { floor, whole }
    }

    /// The replay after our create as `holder` showed that `previous` may
    /// run until `not_before`: the Lease stays unclaimed until then.
    pub(in crate::backend::kubernetes) fn pending_until(
        &mut self,
        holder: String,
        not_before: Instant,
        previous: Holder,
    ) {
        self.pending = Some(Pending {
            holder,
            not_before,
            previous,
        });
    }

    /// Our acquisition as `holder` with `ttl` was written as `lease`: we
    /// hold the term. Returns it as the Elector sees it.
    pub(in crate::backend::kubernetes) fn elected(
        &mut self,
        lease: &Lease,
        holder: String,
        ttl: Duration,
        now: Instant,
    ) -> Term {
        self.observed(lease, now);
        let ttl = Duration::from_secs(lease_duration_secs(ttl) as u64);
        self.own = Some(Own {
            holder,
            ttl,
            token: token_of(lease),
        });
        self.pending = None;
        Term {
            holder: holder_view(lease),
            ttl,
            granted: ttl,
            servers: None,
        }
    }

    /// Our term is released (or found not ours to release).
    pub(in crate::backend::kubernetes) fn resigned(&mut self) {
        self.own = None;
    }

    /// The leader's watch delivered `lease`. Our own renewals only move the
    /// resume point (the update answers are the CAS versions); any other
    /// write is recorded (an operator's write of the controls alone on top
    /// of our last version too: it becomes the base of the next renewal),
    /// and a change of our term's duration or token is returned (our term
    /// ends).
    pub(in crate::backend::kubernetes) fn observed_while_leading(
        &mut self,
        lease: &Lease,
        now: Instant,
    ) -> Option<String> {
        let ours = self
            .own
            .as_ref()
            .is_some_and(|o| o.holder == holder_of(lease));
        let edit = self.own_edit(lease);
        // An operator's write of the controls on top of the version we
        // hold is the base of our next renewal (no 409 to learn it).
        let on_top = self.lease().is_some_and(|seen| controls_only(seen, lease));
        if ours && edit.is_none() && !on_top {
            self.resume_rv = Some(rv_of(lease).to_owned());
        } else {
            self.observed(lease, now);
        }
        edit
    }
}

/// Questions.
impl LeaseView {
    /// What the Lease means at `now` for the holder of term `me` (renew,
    /// resign, a leader's watch), or for a candidate (`None`).
    pub(in crate::backend::kubernetes) fn classify(
        &self,
        me: Option<&str>,
        now: Instant,
    ) -> Standing {
        let Some(s) = &self.seen else {
            return Standing::Absent { since: None };
        };
        let holder = holder_of(&s.lease);
        let end = self.end_of(s);
        if s.deleted {
            return match end {
                Some(until) if now < until && !self.is_unclaimed_own(holder) => Standing::Held {
                    holder: holder_view(&s.lease),
                    until,
                    how: Hold::Deleted,
                },
                _ => Standing::Absent {
                    since: s.absent_since,
                },
            };
        }
        if me.is_some_and(|me| me == holder) {
            return self.ours(s);
        }
        if let Some(p) = self.pending.as_ref().filter(|p| p.holder == holder)
            && now < p.not_before
        {
            return Standing::Pending {
                previous: p.previous.clone(),
                until: p.not_before,
            };
        }
        match end {
            Some(until) if now < until && !self.is_unclaimed_own(holder) => Standing::Held {
                holder: holder_view(&s.lease),
                until,
                how: if holder.is_empty() {
                    Hold::Cleared
                } else {
                    Hold::Renewing
                },
            },
            _ => Standing::Free {
                previous: holder_view(&s.lease),
            },
        }
    }

    /// The Lease names the caller's term: ours, unless someone else changed
    /// the duration or token we wrote.
    fn ours(&self, s: &Seen) -> Standing {
        if let Some(edit) = self.own_edit(&s.lease) {
            return Standing::Overwritten { edit };
        }
        let duration = duration_of(&s.lease, self.fallback_ttl());
        Standing::Ours {
            until: s.changed_at + duration,
        }
    }

    /// How `lease`, naming the term we hold, differs from what we wrote.
    fn own_edit(&self, lease: &Lease) -> Option<String> {
        let own = self.own.as_ref().filter(|o| o.holder == holder_of(lease))?;
        edit_of(lease, own.ttl, own.token)
    }

    /// Where a watch of term `term_id` resumes, or `None` when what we know
    /// already differs from it (the watch's answer is "changed").
    pub(in crate::backend::kubernetes) fn watch_from(&self, term_id: &str) -> Option<WatchView> {
        let s = self.seen.as_ref()?;
        if s.deleted || holder_of(&s.lease) != term_id {
            return None;
        }
        Some(WatchView {
            rv: self
                .resume_rv
                .clone()
                .unwrap_or_else(|| rv_of(&s.lease).to_owned()),
            deadline: self.end_of(s),
            leading: self.own.as_ref().is_some_and(|o| o.holder == term_id),
            poll: self.no_watch,
        })
    }

    /// When the last seen term ends by silence (`None`: free, or nothing seen).
    pub(in crate::backend::kubernetes) fn silent_until(&self) -> Option<Instant> {
        self.seen.as_ref().and_then(|s| self.end_of(s))
    }

    /// The Lease as last seen, unless it was deleted since.
    pub(in crate::backend::kubernetes) fn lease(&self) -> Option<&Lease> {
        self.seen.as_ref().filter(|s| !s.deleted).map(|s| &s.lease)
    }

    /// How many versions (and deletions) this view has taken in so far.
    pub(in crate::backend::kubernetes) fn sightings(&self) -> u64 {
        self.sightings
    }

    /// The controls of the Lease as last seen (none set once it was found
    /// deleted); `None` before anything was seen.
    pub(in crate::backend::kubernetes) fn controls_seen(
        &self,
    ) -> Option<crate::backend::controls::Controls> {
        let s = self.seen.as_ref()?;
        Some(super::controls_of((!s.deleted).then_some(&s.lease)))
    }

    /// The last seen Lease's holder (also of a deleted one).
    pub(in crate::backend::kubernetes) fn last_holder(&self) -> Option<Holder> {
        self.seen.as_ref().map(|s| holder_view(&s.lease))
    }

    /// When the term of `s` ends by silence (or ended, by the cold-start
    /// rule), with our TTL and allowed clock skew.
    fn end_of(&self, s: &Seen) -> Option<Instant> {
        s.silent_until(self.fallback_ttl(), self.max_skew)
    }

    /// The configured TTL, or client-go's default 15 s before any campaign.
    pub(in crate::backend::kubernetes) fn fallback_ttl(&self) -> Duration {
        self.ttl.unwrap_or(DEFAULT_TTL)
    }

    /// Highest fencing token this process has observed or written.
    pub(in crate::backend::kubernetes) fn max_token(&self) -> u64 {
        self.max_token
    }

    /// Where a replay of the changes since the Lease was found absent
    /// starts (`None` while it exists, or with no absence point).
    pub(in crate::backend::kubernetes) fn absent_from(&self) -> Option<String> {
        self.absent_rv.clone()
    }

    /// Whether an absent read should be followed by a LIST: a fresh process
    /// (no version and no absence point yet) that may list.
    pub(in crate::backend::kubernetes) fn wants_list(&self) -> bool {
        self.resume_rv.is_none() && self.absent_rv.is_none() && !self.no_list
    }

    /// RBAC denies `list`.
    pub(in crate::backend::kubernetes) fn may_not_list(&self) -> bool {
        self.no_list
    }

    /// RBAC denies `watch`.
    pub(in crate::backend::kubernetes) fn may_not_watch(&self) -> bool {
        self.no_watch
    }

    /// Whether `holder` is an acquisition of ours never answered.
    pub(in crate::backend::kubernetes) fn is_unanswered(&self, holder: &str) -> bool {
        self.unanswered.iter().any(|h| h == holder)
    }

    /// An acquisition of ours that nobody claims: never answered, or
    /// created and pending (whatever held it up still holds until its
    /// `not_before`).
    fn is_unclaimed_own(&self, holder: &str) -> bool {
        !holder.is_empty()
            && (self.is_unanswered(holder)
                || self.pending.as_ref().is_some_and(|p| p.holder == holder))
    }
}
