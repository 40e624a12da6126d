//! The follower's side of a named successor: a release whose
//! [`SUCCESSOR_ANNOTATION`] names another candidate is left to that
//! candidate for one round trip (`backend::candidates::successor_wait`,
//! from this process's own request latency), counted from this process's
//! first sight of the release. The named candidate, and everyone after the
//! wait, campaigns as on any release: the compare-and-swap still decides,
//! so the rule changes who tries first, never who may lead. The releaser
//! itself leaves the successor the longest wait (see
//! `LeaseView::yield_until`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

use super::{LeaseView, has_release_mark};
use crate::backend::candidates::SUCCESSOR_WAIT_CAP;
use crate::backend::kubernetes::{RELEASED_ANNOTATION, SUCCESSOR_ANNOTATION, holder_of};

/// The term a holder's own release names ([`RELEASED_ANNOTATION`]).
fn release_mark_of(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(RELEASED_ANNOTATION)
        .map(String::as_str)
}

/// The identity a release names as its successor (`None`: none, or the
/// Lease is held).
pub(in crate::backend::kubernetes) fn successor_of(lease: &Lease) -> Option<&str> {
    if !holder_of(lease).is_empty() || !has_release_mark(lease) {
        return None;
    }
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(SUCCESSOR_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

impl LeaseView {
    /// Until when a candidate `identity` leaves the released Lease to the
    /// successor it names, waiting `wait` from its first sight of the
    /// release; `None` when the Lease is not such a release or names
    /// `identity` itself.
    ///
    /// The releaser itself waits [`SUCCESSOR_WAIT_CAP`] instead: it saw
    /// its own release at once, while the successor sees it only when its
    /// watch delivers it and then needs its own scheduling, which on a
    /// loaded node took longer than a fast releaser's `wait` (a switchover
    /// taken back by the old leader, seen in CI). Its own release is
    /// proven by the release mark naming the term it handed over
    /// ([`LeaseView::handed_over`]).
    pub(in crate::backend::kubernetes) fn yield_until(
        &self,
        identity: &str,
        wait: Duration,
    ) -> Option<Instant> {
        let seen = self.seen.as_ref().filter(|s| !s.deleted)?;
        let named = successor_of(&seen.lease)?;
        let ours = self
            .handed_over
            .as_deref()
            .is_some_and(|t| release_mark_of(&seen.lease) == Some(t));
        let wait = if ours {
            wait.max(SUCCESSOR_WAIT_CAP)
        } else {
            wait
        };
        (named != identity).then(|| seen.changed_at + wait)
    }

    /// We released term `term_id` naming a successor.
    pub(in crate::backend::kubernetes) fn handed_over(&mut self, term_id: &str) {
        self.handed_over = Some(term_id.to_owned());
    }

    /// One request of ours took `took`: the slowest recent latency decays
    /// by an eighth per request and never falls below the latest one.
    pub(in crate::backend::kubernetes) fn request_took(&mut self, took: Duration) {
        self.slowest = took.max(self.slowest - self.slowest / 8);
    }

    /// The slowest recent request latency ([`Self::request_took`]).
    pub(in crate::backend::kubernetes) fn slowest_request(&self) -> Duration {
        self.slowest
    }
}

#[cfg(test)]
mod tests {
    use super::super::controls::lease;
    use super::*;
    use crate::backend::kubernetes::RELEASED_ANNOTATION;

    #[test]
    fn only_others_yield_to_a_named_successor_for_the_wait() {
        let wait = Duration::from_millis(100);
        let release = [(RELEASED_ANNOTATION, "a_1"), (SUCCESSOR_ANNOTATION, "b")];
        let cases: &[(&str, Lease, &str, bool)] = &[
            (
                "another candidate yields",
                lease("", &release, "2"),
                "c",
                true,
            ),
            (
                "the named one does not",
                lease("", &release, "2"),
                "b",
                false,
            ),
            (
                "no successor named: nobody yields",
                lease("", &[(RELEASED_ANNOTATION, "a_1")], "2"),
                "c",
                false,
            ),
            (
                "a held Lease names no successor",
                lease("b_2", &[(SUCCESSOR_ANNOTATION, "b")], "3"),
                "c",
                false,
            ),
            (
                "cleared by hand (no release mark): not a release",
                lease("", &[(SUCCESSOR_ANNOTATION, "b")], "2"),
                "c",
                false,
            ),
        ];
        for (what, l, me, yields) in cases {
            let mut v = LeaseView::default();
            let t0 = Instant::now();
            v.observed(l, t0);
            assert_eq!(v.yield_until(me, wait).is_some(), *yields, "{what}");
            if *yields {
                assert_eq!(v.yield_until(me, wait), Some(t0 + wait), "{what}");
            }
        }
    }

    #[test]
    fn the_wait_counts_from_the_first_sight_of_the_release() {
        let wait = Duration::from_millis(100);
        let l = lease(
            "",
            &[(RELEASED_ANNOTATION, "a_1"), (SUCCESSOR_ANNOTATION, "b")],
            "2",
        );
        let mut v = LeaseView::default();
        let t0 = Instant::now();
        v.observed(&l, t0);
        // Read again later (the campaign's own read): the same version.
        v.observed(&l, t0 + Duration::from_millis(60));
        assert_eq!(v.yield_until("c", wait), Some(t0 + wait));
        // Deleted since: nothing to yield.
        v.deleted(None, t0 + Duration::from_millis(70));
        assert_eq!(v.yield_until("c", wait), None);
    }

    #[test]
    fn the_slowest_latency_decays() {
        let mut v = LeaseView::default();
        v.request_took(Duration::from_millis(80));
        v.request_took(Duration::from_millis(1));
        assert_eq!(v.slowest_request(), Duration::from_millis(70));
        for _ in 0..100 {
            v.request_took(Duration::from_millis(2));
        }
        assert_eq!(v.slowest_request(), Duration::from_millis(2));
    }
}
