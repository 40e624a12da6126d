//! What the Elector knows of its election's operations, in one place: the
//! controls as the controls follower last read them and the candidate
//! registry as the leader last listed it. Written by those two followers,
//! read by the precedence decisions ([`super::precedence`]): a release
//! names its successor from the registry already known (no extra read on
//! the release path), and the lead loop and the waits wake when it changes.
//! It also holds which members this Elector knows dead ([`Alive`]).

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;
use tokio::time::Instant;

use super::precedence::Rules;
use crate::backend::candidates::Listed;
use crate::backend::controls::Controls;

/// The controls and the registry as last read (see the module docs).
#[derive(Clone, Debug, Default)]
pub(super) struct Known {
    /// The controls as last read (default: none set, or no controls).
    pub(super) controls: Controls,
    /// The registry as this leader last listed it during its current term;
    /// `None` before the first list of a term (or without a registry).
    pub(super) registry: Option<Arc<Vec<Listed>>>,
    /// The members known dead, and what shows it ([`Alive`]).
    pub(super) alive: Alive,
}

impl Known {
    /// The precedence rules for `me` now.
    pub(super) fn rules<'a>(&'a self, me: &'a str) -> Rules<'a> {
        Rules {
            me,
            paused: self.controls.paused,
            pinned: self.controls.pinned(),
            now: SystemTime::now(),
        }
    }
}

/// Which members this Elector knows dead: out of every choice (successor,
/// preemption, revision handover, switchover target) until their record is
/// written anew. Two observations, on every backend alike:
/// - **the holder this Elector saw last, when it takes the term itself**:
///   a term that ended by silence was a dead holder's, and one released
///   with a hand-over by etcd's one write named a successor that did not
///   take it; a holder that released gracefully wrote its record again
///   when it stopped claiming, which clears the mark at the next list;
/// - **the successor its own release named, when another member takes the
///   term** (or it takes it back itself): the successor had its head start
///   and did not take it.
///
/// A mark holds until a list shows the member's record written
/// [`REWRITE_SLACK`] after the moment the mark counts from (a restart
/// publishes at once; a dead process never writes), or shows no record.
#[derive(Clone, Debug, Default)]
pub(super) struct Alive {
    /// Known-dead identities, each with the instant a record write must
    /// follow to show it alive again.
    dead: std::collections::HashMap<String, Instant>,
    /// The holder seen last (not us), and since when.
    holder: Option<(String, Instant)>,
    /// The successor our last release named, and when.
    named: Option<(String, Instant)>,
}

/// How much later than the instant a mark counts from a record must have
/// been written to clear it: none. A restart may publish within
/// milliseconds of the mark's instant (a holder that led for 15 ms, was
/// stopped and started again: any slack kept it out for a whole record
/// renewal period, 4 lease durations). Clock skew between writer and
/// reader can make a dead member's last write look later than the mark;
/// that costs at most one more handover it does not take, after which the
/// releaser marks it again (the successor rule).
pub(super) const REWRITE_SLACK: std::time::Duration = std::time::Duration::ZERO;

impl Alive {
    fn mark(&mut self, identity: String, since: Instant) {
        tracing::info!(candidate = %identity, "a member is known dead: out of every choice until its record is written again");
        let at = self.dead.entry(identity).or_insert(since);
        *at = (*at).max(since);
    }

    /// A holder other than `me` (`None`: nobody) was observed at `now`.
    pub(super) fn saw_holder(&mut self, holder: Option<&str>, me: &str, now: Instant) {
        let Some(h) = holder.filter(|h| *h != me) else {
            return;
        };
        if self.holder.as_ref().is_none_or(|(seen, _)| seen != h) {
            self.holder = Some((h.to_owned(), now));
        }
        if let Some((named, at)) = self.named.take()
            && named != h
        {
            self.mark(named, at);
        }
    }

    /// `me` took a term: the holder seen last and a successor our
    /// release named did not hold on (see [`Alive`]).
    pub(super) fn took_term(&mut self, me: &str) {
        let holder = self.holder.take().into_iter();
        for (who, since) in holder.chain(self.named.take()) {
            if who != me {
                self.mark(who, since);
            }
        }
    }

    /// Our release at `now` named `successor`.
    pub(super) fn released_to(&mut self, successor: &str, now: Instant) {
        self.named = Some((successor.to_owned(), now));
    }

    /// `listed` as this Elector may choose from it at `now`: a member known
    /// dead shows as not ready (its record still dates its revision); a
    /// mark is dropped once the record was written anew, or is gone.
    pub(super) fn judge(&mut self, mut listed: Vec<Listed>, now: Instant) -> Vec<Listed> {
        self.dead
            .retain(|id, _| listed.iter().any(|l| l.candidate.identity == *id));
        for l in &mut listed {
            let Some(since) = self.dead.get(&l.candidate.identity).copied() else {
                continue;
            };
            let written = l.age.or(l.written_ago).and_then(|a| now.checked_sub(a));
            if written.is_some_and(|w| w > since + REWRITE_SLACK) {
                tracing::info!(candidate = %l.candidate.identity, "a member known dead wrote its record again: back in the choice");
                self.dead.remove(&l.candidate.identity);
            } else {
                l.candidate.ready = false;
            }
        }
        listed
    }
}

/// `listed`, judged by what `shared` knows of the dead ([`Alive::judge`]),
/// and kept as the registry last listed when `keep`.
pub(super) fn judged(shared: &Shared, listed: Vec<Listed>, keep: bool) -> Arc<Vec<Listed>> {
    let mut out = None;
    shared.send_if_modified(|k| {
        let listed = Arc::new(k.alive.judge(listed, Instant::now()));
        if keep {
            k.registry = Some(listed.clone());
        }
        out = Some(listed);
        keep
    });
    out.expect("judged")
}

/// The shared, watched [`Known`].
pub(super) type Shared = Arc<watch::Sender<Known>>;

/// A new shared [`Known`].
pub(super) fn shared() -> Shared {
    Arc::new(watch::channel(Known::default()).0)
}

/// Whether an unhealthy app may end `me`'s term now (not while paused),
/// marking the controls seen.
pub(super) fn may_step_down(rx: &mut watch::Receiver<Known>, me: &str) -> bool {
    rx.borrow_and_update().rules(me).may_step_down()
}

#[cfg(test)]
#[path = "alive_tests.rs"]
mod tests;
