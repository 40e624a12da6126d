//! The election verbs on a Lease: campaign, renew, resign, read and watch,
//! each a read or a compare-and-swap on the Lease's `resourceVersion`.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{PostParams, WatchParams};
use tokio::time::{Instant, sleep_until};
use tracing::{debug, warn};

use super::*;
use crate::backend::WaitReason;
use crate::backend::candidates::{Candidate, Listed};
use crate::backend::controls::Controls;
use crate::backend::{CandidateRegistry, ControlStore};

#[async_trait]
impl LeaseBackend for KubeLeaseBackend {
    fn about(&self) -> &'static crate::backend::About {
        ABOUT
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        _previous: Option<&Holder>,
    ) -> Result<Campaign> {
        let conn = self.conn().await?;
        self.view(|v| v.campaigning(ttl));
        // Two rounds: a lost race (409) is answered by one fresh read.
        for round in 0..2 {
            let current = self.get(conn).await?;
            let mine = format!("{identity}_{}", term_id());
            let step = match current {
                None => self.take_absent(conn, round, mine, ttl).await?,
                Some(lease) => self.take_over(conn, round, lease, mine, ttl).await?,
            };
            match step {
                Round::Done(c) => return Ok(c),
                Round::Again => continue,
                Round::Lost => break,
            }
        }
        Ok(self.after_lost_race())
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        let conn = self.conn().await?;
        let ours = term.holder.term_id.as_str();
        for _ in 0..CAS_TRIES {
            let (standing, lease) =
                self.view(|v| (v.classify(Some(ours), Instant::now()), v.lease().cloned()));
            let base = match (standing, lease) {
                (Standing::Ours { .. }, Some(lease)) => lease,
                (Standing::Overwritten { edit }, _) => {
                    // Someone changed what our term promises: followers
                    // count from their sight of it, so the term ends here.
                    warn!(lease = %self.name, %edit, "our Lease was edited by someone else; ending the term");
                    return Ok(Renewal::Lost(LostReason::KeyOverwritten));
                }
                (_, None) => return Ok(Renewal::Lost(LostReason::KeyDeleted)),
                _ => return Ok(Renewal::Lost(LostReason::KeyOverwritten)),
            };
            let mut next = base;
            let spec = next.spec.get_or_insert_with(Default::default);
            spec.renew_time = Some(now_micro());
            let ttl = duration_of(&next, term.ttl);
            // The roster again each time: a hand edit is undone here.
            self.carry_roster(&mut next);
            match self.cas(conn, &next).await? {
                Cas::Written(_) => return Ok(Renewal::Renewed { ttl, servers: None }),
                // Someone else wrote: re-read and decide; never overwrite.
                Cas::Conflict => {
                    if self.get(conn).await?.is_none() {
                        return Ok(Renewal::Lost(LostReason::KeyDeleted));
                    }
                }
                Cas::Gone => {
                    self.observe_deleted(None);
                    return Ok(Renewal::Lost(LostReason::KeyDeleted));
                }
            }
        }
        Err(self.contended(conn))
    }

    /// Release `term` naming `successor` in [`SUCCESSOR_ANNOTATION`]
    /// (`None`: nobody).
    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        self.release_to(term, successor).await
    }

    async fn read(&self) -> Result<Option<Holder>> {
        let conn = self.conn().await?;
        Ok(self
            .get(conn)
            .await?
            .filter(|l| !holder_of(l).is_empty())
            .map(|l| holder_view(&l)))
    }

    /// Like `read`, with `expires_in` estimated by this machine's wall
    /// clock: `renewTime + leaseDurationSeconds − now`, zero when past. A
    /// one-shot read cannot observe expiry the way followers do (by
    /// silence), so this is an estimate that clock skew can move; only
    /// `leader-elector status` uses it.
    async fn inspect(&self) -> Result<Option<Holder>> {
        let conn = self.conn().await?;
        let Some(lease) = self.get(conn).await?.filter(|l| !holder_of(l).is_empty()) else {
            return Ok(None);
        };
        let mut holder = holder_view(&lease);
        let spec = lease.spec.as_ref();
        let renewed = spec
            .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
            .map(|t| t.0);
        let duration = duration_of(&lease, Duration::from_secs(15));
        holder.expires_in = renewed.map(|at| {
            let age_ms = k8s_openapi::jiff::Timestamp::now()
                .duration_since(at)
                .as_millis()
                .max(0) as u64;
            duration.saturating_sub(Duration::from_millis(age_ms))
        });
        Ok(Some(holder))
    }

    /// Every renewal is a write, so a watch delivers each as a new
    /// `resourceVersion`: the arrival of the last new version of `holder`'s
    /// term (never a re-read, a relist or a poll).
    fn heard_at(&self, holder: &Holder) -> Option<Instant> {
        self.view(|v| v.heard_at(holder.term_id.as_str()))
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        let conn = self.conn().await?;
        let mut broken = false;
        loop {
            let Some(view) = self.watch_view(seen) else {
                return Ok(());
            };
            if view.poll {
                return self.poll(conn, seen, view.leading).await;
            }
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", self.name))
                .timeout(WATCH_TIMEOUT_SECS);
            // A hung API must not hold a follower past the silence deadline.
            let wake = if view.leading { None } else { view.deadline };
            let opened = tokio::select! {
                r = conn.api.watch(&params, &view.rv) => r,
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    debug!(holder = %seen.term_id, "no change of the lease for its duration: expired");
                    return Ok(());
                }
            };
            let stream = match opened {
                Ok(stream) => stream,
                Err(kube::Error::Api(s)) if s.code == 410 => {
                    if self.relist(conn, seen, view.leading).await? {
                        return Ok(());
                    }
                    continue;
                }
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    self.watch_forbidden(conn, &s.message);
                    continue;
                }
                Err(e) => return Err(self.classify(conn, "watch", e)),
            };
            futures_util::pin_mut!(stream);
            let _open = self.election_watch_open();
            match self.follow_stream(conn, seen, view, &mut stream).await {
                Ok(Some(done)) => return Ok(done),
                Ok(None) => continue,
                // A stream broken mid-way (a reset connection) is reopened
                // once at once from where it was; a second break is the
                // caller's to report and back off from.
                Err(e) if !broken && matches!(e, BackendError::Unreachable { .. }) => {
                    debug!(error = %e.report(), "watch broke; reopening it");
                    broken = true;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[async_trait]
impl CandidateRegistry for KubeLeaseBackend {
    async fn publish_candidate(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        self.publish(candidate, ttl).await
    }

    async fn withdraw_candidate(&self, identity: &str) -> Result<()> {
        self.withdraw(identity).await
    }

    async fn candidates(&self) -> Result<Vec<Listed>> {
        self.list_candidates().await
    }

    /// One LIST by label; the watched copy is left as it is.
    async fn candidates_now(&self) -> Result<Vec<Listed>> {
        self.list_registry_now().await
    }

    /// One watch of the candidate Leases by label, resumed between calls.
    async fn watch_candidates(&self) -> Result<()> {
        self.follow_candidates().await
    }
}

#[async_trait]
impl ControlStore for KubeLeaseBackend {
    /// The annotations of the election Lease (none set when it is absent).
    async fn controls(&self) -> Result<Controls> {
        self.read_controls().await
    }

    async fn watch_controls(&self, seen: &Controls) -> Result<Controls> {
        self.follow_controls(seen).await
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        self.set_note(PAUSED_ANNOTATION, paused.then_some("true"))
            .await
    }

    async fn request_switchover(&self, to: Option<&str>) -> Result<()> {
        self.set_note(SWITCHOVER_ANNOTATION, to.filter(|t| !t.is_empty()))
            .await
    }
}

/// How soon a campaign that found the election paused may look again
/// (one GET each time; a resume is seen at the next one).
const PAUSED_POLL: Duration = Duration::from_secs(1);

/// A campaign's answer while the election is paused: look again soon.
fn paused(previous: Holder) -> Campaign {
    Campaign::Waiting {
        previous: Some(previous),
        retry_after: PAUSED_POLL,
        why: WaitReason::Paused,
    }
}

/// Write parameters: our field manager on every write.
pub(super) fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// What one round of a campaign came to.
enum Round {
    /// The campaign's answer.
    Done(Campaign),
    /// The CAS lost a race: read again (once).
    Again,
    /// The second round found the race lost: report what is there now.
    Lost,
}

/// What a compare-and-swap of the Lease came to.
pub(super) enum Cas {
    /// Written: the answer (already observed).
    Written(Box<Lease>),
    /// 409: someone else wrote since the version read.
    Conflict,
    /// 404: the Lease is gone.
    Gone,
}

impl KubeLeaseBackend {
    /// Replace the Lease by `next`, on the condition that it is still at
    /// `next`'s `resourceVersion` (the API server's optimistic concurrency:
    /// a PUT carrying the version answers 409 when it moved on).
    pub(super) async fn cas(&self, conn: &Conn, next: &Lease) -> Result<Cas> {
        match conn.api.replace(&self.name, &post_params(), next).await {
            Ok(written) => {
                self.observe(&written);
                Ok(Cas::Written(Box::new(written)))
            }
            Err(e) if Self::is_conflict(&e) => Ok(Cas::Conflict),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Cas::Gone),
            Err(e) => Err(self.classify(conn, "update", e)),
        }
    }

    /// The Lease is absent. If we saw a holder whose term may still run (the
    /// Lease was deleted by hand), wait its duration from when we found the
    /// Lease gone; else create it as `mine` with a seeded fencing token, and
    /// claim it only if no term we never saw ran since the absence point
    /// ([`Self::after_create`]).
    async fn take_absent(
        &self,
        conn: &Conn,
        round: usize,
        mine: String,
        ttl: Duration,
    ) -> Result<Round> {
        let now = Instant::now();
        if let Standing::Held { holder, until, .. } = self.view(|v| v.classify(None, now)) {
            return Ok(Round::Done(Campaign::Waiting {
                previous: Some(holder),
                retry_after: until - now,
                why: WaitReason::PreviousTerm,
            }));
        }
        if round > 0 {
            // Someone created it between our reads and we lost.
            return Ok(Round::Lost);
        }
        let (max_token, from, known) =
            self.view(|v| (v.max_token(), v.absent_from(), v.last_holder()));
        let token = (max_token + 1).max(unix_millis());
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(conn.namespace.clone()),
                annotations: Some([(TOKEN_ANNOTATION.to_owned(), token.to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(Self::new_spec(&mine, ttl, 0)),
        };
        self.carry_roster(&mut lease);
        self.view(|v| v.sent(&mine));
        match conn.api.create(&post_params(), &lease).await {
            Ok(created) => {
                let known = known.map(|h| h.term_id.to_string());
                let c = self
                    .after_create(conn, created, mine, ttl, from, known)
                    .await;
                Ok(Round::Done(c))
            }
            Err(e) => {
                self.view(|v| v.answered(&mine));
                if Self::is_conflict(&e) {
                    Ok(Round::Again)
                } else {
                    Err(self.classify(conn, "create", e))
                }
            }
        }
    }

    /// The Lease exists: follow its holder, or, when it is free, silent for
    /// its duration or an acquisition of ours that was never answered, take
    /// it by CAS as `mine` with the next fencing token.
    async fn take_over(
        &self,
        conn: &Conn,
        round: usize,
        lease: Lease,
        mine: String,
        ttl: Duration,
    ) -> Result<Round> {
        let now = Instant::now();
        let previous = match self.view(|v| v.campaign_standing(&lease, now)) {
            Standing::Pending { previous, until } => {
                return Ok(Round::Done(Campaign::Waiting {
                    previous: Some(previous),
                    retry_after: until - now,
                    why: WaitReason::UnseenTerm,
                }));
            }
            Standing::Held {
                holder,
                until,
                how: Hold::Cleared,
            } => {
                // Cleared by someone other than its holder: that holder's
                // promise still runs.
                return Ok(Round::Done(Campaign::Waiting {
                    previous: Some(holder),
                    retry_after: until - now,
                    why: WaitReason::PreviousTerm,
                }));
            }
            Standing::Held {
                holder,
                how: Hold::Renewing,
                ..
            } => return Ok(Round::Done(Campaign::Following(holder))),
            Standing::Paused { previous } => return Ok(Round::Done(paused(previous))),
            Standing::Free { previous } => match self.yield_to_successor(&mine, previous, now) {
                Ok(wait) => return Ok(Round::Done(wait)),
                Err(previous) => previous,
            },
            // Deleted since our read (a watch told us): read again.
            _ => return Ok(if round > 0 { Round::Lost } else { Round::Again }),
        };
        // A second round finds it still free: the write that beat our first
        // compare-and-swap took nobody's term (an operator's annotation, a
        // switchover request cleared), so try once more on the fresh version
        // rather than back off and let the named successor's head start
        // lapse (ops_controls::kubernetes_switchover_by_command).
        debug!(previous = %previous.term_id, round, "lease free or silent for its duration; taking it");
        let next = self.acquisition(lease, &mine, ttl);
        self.view(|v| v.sent(&mine));
        let r = self.cas(conn, &next).await;
        self.view(|v| v.answered(&mine));
        Ok(match r? {
            Cas::Written(updated) => Round::Done(self.elected(&updated, mine, ttl)),
            Cas::Conflict | Cas::Gone => Round::Again,
        })
    }

    /// `lease` taken over as `mine`: a new term with one more transition and
    /// the next fencing token.
    fn acquisition(&self, lease: Lease, mine: &str, ttl: Duration) -> Lease {
        let old = lease.spec.clone().unwrap_or_default();
        let transitions = old.lease_transitions.unwrap_or(0).saturating_add(1);
        let token = token_of(&lease).max(self.view(|v| v.max_token())) + 1;
        let mut next = lease;
        // A third party's `strategy` and `preferredHolder` (Coordinated
        // Leader Election) are kept: ours is not the only writer's spec.
        next.spec = Some(LeaseSpec {
            strategy: old.strategy,
            preferred_holder: old.preferred_holder,
            ..Self::new_spec(mine, ttl, transitions)
        });
        let annotations = next
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(TOKEN_ANNOTATION.to_owned(), token.to_string());
        // A new term: the previous release's mark goes (else a hand edit
        // clearing this term's holder would pass for its release).
        annotations.remove(RELEASED_ANNOTATION);
        annotations.remove(SUCCESSOR_ANNOTATION);
        self.carry_roster(&mut next);
        next
    }
}
