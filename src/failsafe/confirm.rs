//! The leader's side: which members must confirm, what each confirmed,
//! and the instant until which the leader may claim on their promises.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Roster;

/// The leader's confirmations for one term.
#[derive(Debug, Default)]
pub struct Confirmations {
    /// Every member of every roster sent this term since the last
    /// acknowledged write (the leader excluded), with the end of its last
    /// acknowledged promise counted from the heartbeat's send instant.
    required: BTreeMap<String, Option<Instant>>,
    /// Whether failsafe is active (a renewal found the backend unreachable).
    active: bool,
    /// The bound passed once: the term is over for good, and a late
    /// acknowledgement never resumes it.
    over: bool,
}

impl Confirmations {
    /// Confirmations for a term that `me` just began with `roster`.
    pub fn new(me: &str, roster: &Roster) -> Self {
        let mut c = Confirmations::default();
        c.acknowledged(me, roster);
        c
    }

    /// A write carrying `roster` is being sent: its members are required
    /// from now on, whether or not the write's answer ever comes back.
    pub fn sending(&mut self, me: &str, roster: &Roster) {
        for m in roster.others(me) {
            self.required.entry(m.identity.clone()).or_insert(None);
        }
    }

    /// A write carrying `roster` was acknowledged: exactly its members
    /// are required (confirmations already received are kept), and
    /// failsafe ends.
    pub fn acknowledged(&mut self, me: &str, roster: &Roster) {
        let old = std::mem::take(&mut self.required);
        for m in roster.others(me) {
            let had = old.get(&m.identity).copied().flatten();
            self.required.insert(m.identity.clone(), had);
        }
        self.active = false;
    }

    /// A renewal failed because the backend is unreachable: failsafe
    /// starts. Returns whether it was already active.
    pub fn start(&mut self) -> bool {
        std::mem::replace(&mut self.active, true)
    }

    /// Whether failsafe is active.
    pub fn active(&self) -> bool {
        self.active
    }

    /// `member` acknowledged a heartbeat sent at `sent` with `promise`.
    /// A member not required is ignored.
    pub fn confirmed(&mut self, member: &str, sent: Instant, promise: Duration) {
        if self.over {
            return;
        }
        if let Some(end) = self.required.get_mut(member) {
            let new = sent + promise;
            *end = Some(end.map_or(new, |e| e.max(new)));
        }
    }

    /// The members the leader must hear from.
    pub fn required(&self) -> impl Iterator<Item = &str> {
        self.required.keys().map(String::as_str)
    }

    /// How many required members have confirmed a promise that still
    /// holds at `now`.
    pub fn confirmed_at(&self, now: Instant) -> usize {
        self.required
            .values()
            .filter(|e| e.is_some_and(|e| e > now))
            .count()
    }

    /// The instant until which the leader may claim on its members'
    /// promises: the earliest end every required member acknowledged,
    /// minus `margin`. `None` when failsafe is not active, when a member
    /// has not confirmed, or when there is no other member (nobody to
    /// confirm: failsafe needs at least two members).
    pub fn valid_until(&self, margin: Duration) -> Option<Instant> {
        if !self.active || self.over || self.required.is_empty() {
            return None;
        }
        let earliest = self.required.values().copied().min()??;
        earliest.checked_sub(margin)
    }

    /// Ends failsafe for good when its bound has passed at `now` (call it
    /// whenever the leader decides whether it still leads): no late
    /// acknowledgement resumes the term. Returns whether it is over.
    pub fn expire(&mut self, now: Instant, margin: Duration) -> bool {
        if self.active && self.valid_until(margin).is_none_or(|u| u <= now) {
            self.over = true;
        }
        self.over
    }
}
