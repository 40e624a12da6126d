//! `--preempt-after` is election-wide: only the leader decides a
//! preemption, so the leader's value is the one that counts. Each candidate
//! publishes its value in its registry record; a follower compares its own
//! with the leader's record when it sees a new leader (one list of the
//! registry per change of leader) and logs one warning naming both values
//! when they differ, so that a candidate started with another value knows
//! it waits the leader's. A leader whose own record has lapsed (it does not
//! renew it while leading) cannot be compared; the leader itself warns of
//! each differing candidate it lists ([`differs`]).

use std::time::Duration;

use tracing::warn;

use crate::backend::CandidateRegistry;
use crate::backend::candidates::Listed;

/// What a follower compared last (see the module docs).
#[derive(Debug)]
pub(super) struct PreemptAfter {
    /// This candidate's `--preempt-after`.
    mine: Duration,
    /// The leader compared last, so each leader costs one list.
    checked: Option<String>,
    /// The leader's value warned of last (one warning per value).
    warned: Option<Duration>,
}

impl PreemptAfter {
    /// A check for a candidate whose `--preempt-after` is `mine`.
    pub(super) fn new(mine: Duration) -> PreemptAfter {
        PreemptAfter {
            mine,
            checked: None,
            warned: None,
        }
    }

    /// Compare with `leader`'s record (listed through `backend` within
    /// `limit`) unless this leader was compared already; a failed list is
    /// tried again at the next call.
    pub(super) async fn check(
        &mut self,
        backend: &dyn CandidateRegistry,
        (me, leader): (&str, Option<&str>),
        limit: Duration,
    ) {
        let Some(leader) = leader.filter(|l| *l != me) else {
            return;
        };
        if self.checked.as_deref() == Some(leader) {
            return;
        }
        let Ok(Ok(listed)) = tokio::time::timeout(limit, backend.candidates()).await else {
            return;
        };
        self.checked = Some(leader.to_owned());
        self.compare(&listed, leader);
    }

    /// Warn once per differing value of `leader`'s record in `listed`;
    /// the value warned of, if any.
    fn compare(&mut self, listed: &[Listed], leader: &str) -> Option<Duration> {
        let theirs = listed
            .iter()
            .find(|l| l.candidate.identity == leader)?
            .candidate
            .preempt_after?;
        if theirs == self.mine || self.warned == Some(theirs) {
            return None;
        }
        self.warned = Some(theirs);
        warn!(
            leader,
            leader_preempt_after = ?theirs,
            preempt_after = ?self.mine,
            "--preempt-after differs from the leader's ({theirs:?} there, {:?} here): the leader's value counts (it is election-wide); set the same value on every member",
            self.mine
        );
        Some(theirs)
    }
}

/// The candidates in `listed` (not `me`) whose `--preempt-after` differs
/// from `mine`, with their value: a leader warns of each once per term.
pub(super) fn differs<'a>(
    listed: &'a [Listed],
    me: &'a str,
    mine: Duration,
) -> impl Iterator<Item = (&'a str, Duration)> + 'a {
    listed.iter().filter_map(move |l| {
        let c = &l.candidate;
        let theirs = c.preempt_after?;
        (c.identity != me && l.alive() && theirs != mine).then_some((c.identity.as_str(), theirs))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::candidates::Candidate;

    fn record(id: &str, preempt_after: Option<u64>) -> Listed {
        Listed {
            candidate: Candidate {
                preempt_after: preempt_after.map(Duration::from_secs),
                ..Candidate::new(id)
            },
            age: None,
            ttl: Duration::from_secs(60),
            created: None,
            written_ago: None,
        }
    }

    #[test]
    fn a_follower_warns_once_per_differing_leader_value() {
        let mut check = PreemptAfter::new(Duration::from_secs(3));
        let listed = [record("a", Some(10)), record("b", Some(3))];
        assert_eq!(check.compare(&listed, "a"), Some(Duration::from_secs(10)));
        assert_eq!(check.compare(&listed, "a"), None, "one warning per value");
        assert_eq!(check.compare(&listed, "b"), None, "same value: no warning");
        let older = [record("c", None)];
        assert_eq!(
            check.compare(&older, "c"),
            None,
            "a record that does not say"
        );
        let other = [record("d", Some(20))];
        assert_eq!(check.compare(&other, "d"), Some(Duration::from_secs(20)));
    }

    #[test]
    fn a_leader_lists_the_candidates_that_differ() {
        let listed = [
            record("me", Some(3)),
            record("b", Some(3)),
            record("c", Some(5)),
            record("d", None),
        ];
        let d: Vec<_> = differs(&listed, "me", Duration::from_secs(3)).collect();
        assert_eq!(d, [("c", Duration::from_secs(5))]);
    }
}
