//! Ending a term: the release by compare-and-swap (client-go's
//! `release()`) naming a successor, and the candidates' side of a named
//! successor and of a lost race.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

use super::verbs::Cas;
use super::*;
use crate::backend::WaitReason;
use crate::backend::candidates::successor_wait;

/// `lease` released by the holder of term `ours`: holder cleared,
/// `leaseDurationSeconds: 1`, the release mark naming the term, and the
/// successor named (or none). Everything else is kept as read, including
/// `spec.strategy` and `spec.preferredHolder` set by a third party.
pub(super) fn released(mut lease: Lease, ours: &str, successor: Option<&str>) -> Lease {
    let spec = lease.spec.get_or_insert_with(Default::default);
    let now = now_micro();
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    // Proof that the holder itself released (a hand edit clearing the
    // holder does not end its promise for our followers).
    let notes = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    notes.insert(RELEASED_ANNOTATION.to_owned(), ours.to_owned());
    match successor {
        Some(s) => notes.insert(SUCCESSOR_ANNOTATION.to_owned(), s.to_owned()),
        None => notes.remove(SUCCESSOR_ANNOTATION),
    };
    lease
}

impl KubeLeaseBackend {
    /// End `term` by CAS (client-go's `release()`, see [`released`]),
    /// naming `successor` (the Elector's choice); a term already over is
    /// not an error.
    pub(super) async fn release_to(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        let conn = self.conn().await?;
        let ours = term.holder.term_id.as_str();
        for _ in 0..CAS_TRIES {
            let (standing, lease) =
                self.view(|v| (v.classify(Some(ours), Instant::now()), v.lease().cloned()));
            let base = match (standing, lease) {
                (Standing::Ours { .. } | Standing::Overwritten { .. }, Some(lease)) => lease,
                // Gone or someone else's: nothing of ours to release.
                _ => {
                    self.view(|v| v.resigned());
                    return Ok(());
                }
            };
            match self.cas(conn, &released(base, ours, successor)).await? {
                Cas::Written(_) => {
                    self.view(|v| {
                        v.resigned();
                        if successor.is_some() {
                            v.handed_over(ours);
                        }
                    });
                    return Ok(());
                }
                Cas::Conflict => {
                    self.get(conn).await?;
                }
                Cas::Gone => {
                    self.observe_deleted(None);
                    return Ok(());
                }
            }
        }
        Err(self.contended(conn))
    }

    /// A candidate about to take a released Lease as `mine` waits while
    /// the release leaves it to the successor it names
    /// (`view::successor`); else it goes on with `previous`.
    pub(super) fn yield_to_successor(
        &self,
        mine: &str,
        previous: Holder,
        now: Instant,
    ) -> std::result::Result<Campaign, Holder> {
        let wait = successor_wait(self.view(|v| v.slowest_request()));
        match self.view(|v| v.yield_until(identity_of(mine), wait)) {
            Some(until) if now < until => Ok(Campaign::Waiting {
                previous: Some(previous),
                retry_after: until - now,
                why: WaitReason::SuccessorHeadStart,
            }),
            _ => Err(previous),
        }
    }

    /// Lost a race: report what is there now.
    pub(super) fn after_lost_race(&self) -> Campaign {
        let (exists, last) = self.view(|v| (v.lease().is_some(), v.last_holder()));
        match last {
            Some(h) if exists && !h.term_id.as_str().is_empty() => Campaign::Following(h),
            previous => Campaign::Waiting {
                previous,
                retry_after: Duration::from_millis(100),
                why: WaitReason::LostRace,
            },
        }
    }
}
