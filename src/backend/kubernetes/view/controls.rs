//! The operator controls as the election Lease carries them
//! ([`PAUSED_ANNOTATION`], [`SWITCHOVER_ANNOTATION`]) and the campaign's
//! pause rule (`backend::controls`): a campaign never takes a Lease whose
//! version it would write against is paused. Because that write is a
//! compare-and-swap on the same version, a pause written before it makes
//! it fail (409) and the re-read sees the pause: the pause and the
//! campaign are ordered by the API server, never by our clocks.
//!
//! A pause changes only who may start a term: a Lease held by a renewing
//! holder is followed as ever, and the holder's own renewals and release
//! are not gated (its term is not new).
//!
//! A version that differs from the last one seen only in these two
//! annotations ([`controls_only`]) is an operator's write, not a write of
//! the holder: it neither restarts a follower's silence clock nor counts
//! as a renewal heard. Every write of the holder (renewal, release,
//! acquisition) writes a new `renewTime`, so its spec differs; a renewal
//! missed between two versions seen shows in the later one's spec too.
//! So a pause set and lifted while a dead holder's silence ran out leaves
//! the Lease free at once after the resume.

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

use super::{LeaseView, Standing};
use crate::backend::controls::Controls;
use crate::backend::kubernetes::{PAUSED_ANNOTATION, SWITCHOVER_ANNOTATION};

/// The value of annotation `key` of `lease`, trimmed; `None` when absent.
fn note<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|v| v.trim())
}

/// The controls `lease` carries; none set for an absent Lease (`None`).
/// Paused only by the value `"true"` (any case): a hand edit to anything
/// else, or removing the annotation, resumes.
pub(in crate::backend::kubernetes) fn controls_of(lease: Option<&Lease>) -> Controls {
    let Some(lease) = lease else {
        return Controls::default();
    };
    Controls {
        paused: note(lease, PAUSED_ANNOTATION).is_some_and(|v| v.eq_ignore_ascii_case("true")),
        switchover: note(lease, SWITCHOVER_ANNOTATION)
            .filter(|v| !v.is_empty())
            .map(str::to_owned),
    }
}

/// Set annotation `key` of `lease` to `value` (`None` removes it), leaving
/// every other field as read. `false` when it already was so (nothing to
/// write).
pub(in crate::backend::kubernetes) fn with_note(
    lease: &mut Lease,
    key: &str,
    value: Option<&str>,
) -> bool {
    let notes = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match value {
        Some(v) if notes.get(key).map(String::as_str) == Some(v) => false,
        Some(v) => {
            notes.insert(key.to_owned(), v.to_owned());
            true
        }
        None => notes.remove(key).is_some(),
    }
}

/// Whether `next` differs from `before` in the controls annotations and
/// in nothing else (its `resourceVersion`, `managedFields` and the like
/// apart): the same spec, labels and other annotations. A version that
/// changes nothing at all is not one (it may be a holder's write).
pub(in crate::backend::kubernetes) fn controls_only(before: &Lease, next: &Lease) -> bool {
    let others = |l: &Lease| {
        let mut notes = l.metadata.annotations.clone().unwrap_or_default();
        notes.remove(PAUSED_ANNOTATION);
        notes.remove(SWITCHOVER_ANNOTATION);
        notes
    };
    before.spec == next.spec
        && before.metadata.labels == next.metadata.labels
        && others(before) == others(next)
        && before.metadata.annotations != next.metadata.annotations
}

impl LeaseView {
    /// What a campaign may do with `base`, the version of the Lease its
    /// compare-and-swap would write against, at `now`: as
    /// [`LeaseView::classify`] for a candidate, except that a free Lease
    /// (released, or silent for its duration) that `base` marks paused is
    /// [`Standing::Paused`].
    pub(in crate::backend::kubernetes) fn campaign_standing(
        &self,
        base: &Lease,
        now: Instant,
    ) -> Standing {
        match self.classify(None, now) {
            Standing::Free { previous } if controls_of(Some(base)).paused => {
                Standing::Paused { previous }
            }
            other => other,
        }
    }
}

/// A Lease `e` for the view's tests: held by `holder` (1 s), annotated
/// with `notes`, at resource version `rv`.
#[cfg(test)]
pub(super) fn lease(holder: &str, notes: &[(&str, &str)], rv: &str) -> Lease {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    Lease {
        metadata: ObjectMeta {
            name: Some("e".into()),
            resource_version: Some(rv.into()),
            annotations: Some(
                notes
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(1),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::kubernetes::{RELEASED_ANNOTATION, SUCCESSOR_ANNOTATION};

    const PAUSED: (&str, &str) = (PAUSED_ANNOTATION, "true");
    const RELEASED: (&str, &str) = (RELEASED_ANNOTATION, "a_1");

    #[test]
    fn controls_read_from_the_annotations() {
        // What, the annotations, paused, the switchover target.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool, Option<&'a str>);
        let cases: &[Case] = &[
            ("none", &[], false, None),
            ("paused", &[PAUSED], true, None),
            (
                "any case, spaces",
                &[(PAUSED_ANNOTATION, " True ")],
                true,
                None,
            ),
            ("false", &[(PAUSED_ANNOTATION, "false")], false, None),
            ("other text", &[(PAUSED_ANNOTATION, "yes")], false, None),
            (
                "switchover",
                &[(SWITCHOVER_ANNOTATION, "b")],
                false,
                Some("b"),
            ),
            (
                "empty switchover",
                &[(SWITCHOVER_ANNOTATION, " ")],
                false,
                None,
            ),
        ];
        for (what, notes, paused, to) in cases {
            let c = controls_of(Some(&lease("a_1", notes, "1")));
            assert_eq!(c.paused, *paused, "{what}");
            assert_eq!(c.switchover.as_deref(), *to, "{what}");
        }
        assert_eq!(controls_of(None), Controls::default(), "absent Lease");
    }

    #[test]
    fn a_note_is_set_and_removed_alone() {
        let mut l = lease("a_1", &[RELEASED, ("x", "y")], "1");
        let before = l.clone();
        assert!(with_note(&mut l, PAUSED_ANNOTATION, Some("true")));
        assert!(!with_note(&mut l, PAUSED_ANNOTATION, Some("true")));
        assert!(controls_of(Some(&l)).paused);
        assert!(with_note(&mut l, PAUSED_ANNOTATION, None));
        assert!(!with_note(&mut l, PAUSED_ANNOTATION, None));
        assert_eq!(l, before, "everything else as read");
    }

    /// Cases of the pause rule: what, the base version, how long after
    /// its sight the campaign looks, and what it finds.
    fn pause_cases() -> Vec<(&'static str, Lease, Duration, &'static str)> {
        let late = Duration::from_millis(1001);
        let now = Duration::ZERO;
        let successor = (SUCCESSOR_ANNOTATION, "b");
        let resumed = (PAUSED_ANNOTATION, "false");
        vec![
            (
                "released, paused",
                lease("", &[RELEASED, PAUSED], "2"),
                now,
                "paused",
            ),
            ("released", lease("", &[RELEASED], "2"), now, "free"),
            (
                "released to a successor, paused",
                lease("", &[RELEASED, successor, PAUSED], "2"),
                now,
                "paused",
            ),
            (
                "silent, paused",
                lease("a_1", &[PAUSED], "2"),
                late,
                "paused",
            ),
            ("silent", lease("a_1", &[], "2"), late, "free"),
            (
                "silent, resumed by hand",
                lease("a_1", &[resumed], "2"),
                late,
                "free",
            ),
            (
                "renewing, paused",
                lease("a_1", &[PAUSED], "2"),
                now,
                "held",
            ),
            (
                "created paused, no holder",
                lease("", &[PAUSED], "2"),
                now,
                "held",
            ),
            (
                "created paused, no holder, silent",
                lease("", &[PAUSED], "2"),
                late,
                "paused",
            ),
        ]
    }

    /// The pause rule, by what the campaign's base version shows: only a
    /// free Lease is held back; a held one is followed as ever.
    #[test]
    fn a_campaign_never_takes_a_paused_free_lease() {
        let ttl = Duration::from_secs(1);
        for (what, l, after, want) in &pause_cases() {
            let mut v = LeaseView::default();
            v.campaigning(ttl);
            let t0 = Instant::now();
            v.observed(l, t0);
            let got = match v.campaign_standing(l, t0 + *after) {
                Standing::Paused { .. } => "paused",
                Standing::Free { .. } => "free",
                Standing::Held { .. } => "held",
                other => panic!("{what}: {other:?}"),
            };
            assert_eq!(got, *want, "{what}");
        }
    }

    /// An operator's write of the controls alone does not restart the
    /// silence clock nor count as a renewal heard; any other change does.
    #[test]
    fn only_a_controls_edit_leaves_the_silence_clock() {
        let ttl = Duration::from_secs(1);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(600);
        let base = lease("a_1", &[("x", "1")], "1");
        let paused = lease("a_1", &[("x", "1"), PAUSED], "2");
        let mut renewed = lease("a_1", &[("x", "1"), PAUSED], "2");
        renewed.spec.as_mut().unwrap().renew_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let other = lease("a_1", &[("x", "2")], "2");
        let touched = lease("a_1", &[("x", "1")], "2");
        let cases: &[(&str, &Lease, bool)] = &[
            ("pause", &paused, true),
            ("pause and a renewal", &renewed, false),
            ("another annotation", &other, false),
            ("a new version, nothing changed", &touched, false),
        ];
        for (what, next, kept) in cases {
            assert_eq!(controls_only(&base, next), *kept, "{what}");
            let mut v = LeaseView::default();
            v.campaigning(ttl);
            v.observed(&base, t0);
            v.watched(next, t1);
            let until = if *kept { t0 + ttl } else { t1 + ttl };
            assert_eq!(v.silent_until(), Some(until), "{what}");
            assert_eq!(v.heard_at("a_1").is_some(), !*kept, "{what}");
        }
    }

    /// The leader's watch delivering an operator's write of the controls
    /// on top of its last version makes it the next renewal's base; its
    /// own renewal delivered after it is only a resume point.
    #[test]
    fn a_controls_write_is_the_leaders_next_base() {
        let t0 = Instant::now();
        let mut v = LeaseView::default();
        let mine = lease("a_1", &[], "1");
        v.elected(&mine, "a_1".into(), Duration::from_secs(1), t0);
        let paused = lease("a_1", &[PAUSED], "2");
        assert_eq!(v.observed_while_leading(&paused, t0), None);
        assert_eq!(
            v.lease().unwrap().metadata.resource_version.as_deref(),
            Some("2")
        );
        let renewed = lease("a_1", &[PAUSED], "3");
        assert_eq!(v.observed_while_leading(&renewed, t0), None);
        assert_eq!(
            v.lease().unwrap().metadata.resource_version.as_deref(),
            Some("2")
        );
    }

    /// The decision is on the base version: a pause the view has not seen
    /// yet still holds the campaign back, and a base without it is free
    /// even if a later version (which the write would conflict with) is
    /// paused.
    #[test]
    fn the_decision_is_on_the_version_written_against() {
        let mut v = LeaseView::default();
        let t0 = Instant::now();
        let free = lease("", &[RELEASED], "2");
        let paused = lease("", &[RELEASED, PAUSED], "3");
        v.observed(&free, t0);
        assert!(matches!(
            v.campaign_standing(&paused, t0),
            Standing::Paused { .. }
        ));
        assert!(matches!(
            v.campaign_standing(&free, t0),
            Standing::Free { .. }
        ));
    }
}
