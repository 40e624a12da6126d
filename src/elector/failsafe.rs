//! The Elector's narrow hooks into [`crate::failsafe`]: the gate before a
//! campaign, the roster staged with each write of a held term, and the
//! heartbeat rounds while renewals find the backend unreachable. The
//! protocol's rules live in the failsafe module; here only when to call it
//! and what to publish.
//!
//! Invariant: the published claim (`own_term.valid_until`) is the later of
//! the lease's validity and the bound every required member confirmed;
//! once both have passed the term is over for good (a late
//! acknowledgement never resumes it).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use std::sync::Arc;

use super::Elector;
use super::state::FailsafeView;
use super::transition::Change;
use crate::backend::{BackendError, Campaign, Term, WaitReason};
use crate::failsafe::{Confirmations, Hold, Roster};

/// The leader's failsafe for one term.
pub(super) struct Guard {
    confirm: Confirmations,
    /// Every member's peer address from every roster sent this term.
    addresses: BTreeMap<String, String>,
    /// The roster of a write whose answer is awaited.
    pending: Option<Roster>,
    /// The roster last acknowledged.
    acked: Roster,
    /// The lease's own validity (the claim without failsafe).
    pub(super) lease_until: Instant,
    /// The next heartbeat round, while failsafe is active.
    pub(super) next_heartbeat: Option<Instant>,
    /// Members whose refusal was warned of this term (once each, until
    /// they confirm again).
    warned: std::collections::BTreeSet<String>,
}

impl Guard {
    /// Whether failsafe is bridging an outage now (renewals unreachable).
    pub(super) fn bridging(&self) -> bool {
        self.confirm.active()
    }

    fn remember(&mut self, roster: &Roster) {
        for m in &roster.members {
            self.addresses
                .insert(m.identity.clone(), m.peer_addr.clone());
        }
    }
}

/// Whether a failed renewal means the backend is unreachable (connection
/// refused, a timeout, 5xx, 429 past its deadline) rather than a refused
/// write (409, a foreign edit, a lost term, 403), which keeps today's rules.
pub(crate) fn is_outage(e: &BackendError) -> bool {
    matches!(
        e,
        BackendError::Unreachable { .. }
            | BackendError::Timeout { .. }
            | BackendError::Throttled { .. }
            | BackendError::Server { .. }
    )
}

impl Elector {
    /// Turn failsafe on: campaign only as its gate allows, and lead on
    /// through a backend outage while every roster member confirms
    /// (see [`crate::failsafe`]). Serve its peer listener yourself
    /// ([`Failsafe::serve`](crate::failsafe::Failsafe::serve)).
    pub fn with_failsafe(mut self, failsafe: Arc<crate::failsafe::Failsafe>) -> Self {
        self.failsafe = Some(failsafe);
        self.publish(Change::Failsafe {
            view: FailsafeView::default(),
            claim: None,
        });
        self
    }

    /// Tell failsafe a campaign's answer came back.
    pub(super) fn campaign_answered(&mut self, attempt: &Result<Campaign, BackendError>) {
        let (elected, token) = match attempt {
            Ok(Campaign::Elected(t)) => (true, Some(t.holder.fencing_token)),
            Ok(Campaign::Following(h)) => (false, Some(h.fencing_token)),
            _ => (false, None),
        };
        self.failsafe_campaign_ended(elected, token);
    }

    /// Before a campaign: `None` to campaign now; else wait while failsafe
    /// holds this member back, answering a resign or freeze asked meanwhile
    /// (an outage may hold it for as long as it lasts), and `Some(true)` on
    /// shutdown, `Some(false)` to look again.
    pub(super) async fn failsafe_hold(&mut self, shutdown: &CancellationToken) -> Option<bool> {
        let wait = self.failsafe_gate().await?;
        tokio::select! {
            _ = shutdown.cancelled() => Some(true),
            _ = tokio::time::sleep(wait) => Some(false),
            cmd = self.commands.recv() => {
                self.handle_idle_command(cmd);
                Some(false)
            }
        }
    }

    /// Before a campaign: `None` to campaign now, else how long to wait
    /// (a promise holds, this member is not on the roster, or the roster
    /// cannot be read). Stages the roster the campaign writes.
    pub(super) async fn failsafe_gate(&mut self) -> Option<Duration> {
        let fs = self.failsafe.clone()?;
        let hold = match fs.before_campaign(self.cfg.call_timeout()).await {
            Ok(()) => {
                self.staged = Some(fs.stage_next());
                return None;
            }
            Err(hold) => hold,
        };
        let now = Instant::now();
        if let Some((leader, until)) = fs.vouched()
            && self.publisher.state().leader.as_deref() == Some(leader.as_str())
        {
            // Promised to the leader we name: keep naming it meanwhile.
            self.publish(Change::Heard(until));
        }
        let retry = self.cfg.retry_period;
        match hold {
            Hold::StartWait(until) => {
                let left = until.saturating_duration_since(now);
                self.set_waiting(Some((WaitReason::FailsafeStartWait, left)));
                // Name the leader meanwhile (a follower is ready once it
                // knows one), reading once per renew interval.
                self.look_at_holder().await;
                Some(
                    left.min(self.cfg.renew_interval)
                        .max(Duration::from_millis(10)),
                )
            }
            Hold::Promised(until) => {
                let left = until.saturating_duration_since(now);
                self.set_waiting(Some((WaitReason::FailsafePromise, left)));
                // Read the backend meanwhile: a member that sees the term
                // gone refuses the next heartbeat (a forger's, or a leader
                // cut off from a backend its members still reach).
                self.look_at_holder().await;
                // Look again each renew interval: a new heartbeat extends
                // the promise, and the leader stays named meanwhile.
                Some(
                    left.min(self.cfg.renew_interval)
                        .max(Duration::from_millis(10)),
                )
            }
            Hold::NotOnRoster => {
                self.set_waiting(Some((WaitReason::NotOnRoster, retry)));
                self.look_at_holder().await;
                Some(retry)
            }
            Hold::Unknown => {
                let wait = self.next_backoff();
                self.set_waiting(Some((WaitReason::RosterUnreadable, wait)));
                Some(wait)
            }
        }
    }

    /// Read and show the holder while not campaigning.
    async fn look_at_holder(&mut self) {
        let backend = self.backend.clone();
        let sent = Instant::now();
        match self.call("read", backend.read()).await {
            Ok(h) => {
                self.backend_ok();
                self.heard(h.as_ref().map(|h| h.fencing_token), sent);
                self.observe(h.as_ref());
            }
            Err(e) => self.backend_failed(e),
        }
    }

    /// A campaign's answer came back (`elected` or not).
    pub(super) fn failsafe_campaign_ended(&mut self, elected: bool, token: Option<u64>) {
        if let Some(fs) = &self.failsafe {
            fs.campaign_ended(elected);
            if let Some(t) = token {
                fs.saw_token(t);
            }
        }
    }

    /// A term began with the roster its campaign wrote, valid (by its
    /// lease) until `lease_until`.
    pub(super) fn failsafe_begin(&mut self, lease_until: Instant) -> Option<Guard> {
        let fs = self.failsafe.as_ref()?;
        let roster = self
            .staged
            .take()
            .unwrap_or_else(|| Roster::new([fs.me().clone()]));
        let mut g = Guard {
            confirm: Confirmations::new(&self.cfg.identity, &roster),
            addresses: BTreeMap::new(),
            pending: None,
            acked: roster.clone(),
            lease_until,
            next_heartbeat: None,
            warned: Default::default(),
        };
        g.remember(&roster);
        Some(g)
    }

    /// Before a renewal: stage a roster that admits new applicants (only
    /// when it differs from the one acknowledged); its members are required
    /// from now on.
    pub(super) fn failsafe_before_write(&mut self, g: &mut Guard) {
        let Some(fs) = &self.failsafe else { return };
        let next = fs.peek_next();
        if next == g.acked {
            g.pending = None;
            return;
        }
        fs.stage(next.clone());
        g.confirm.sending(&self.cfg.identity, &next);
        g.remember(&next);
        g.pending = Some(next);
    }

    /// A renewal was acknowledged: its roster is the one in force, and
    /// failsafe ends (one INFO line when it was active).
    pub(super) fn failsafe_renewed(&mut self, g: &mut Guard, lease_until: Instant) {
        if let Some(r) = g.pending.take() {
            g.acked = r;
        }
        let was = g.confirm.active();
        g.confirm.acknowledged(&self.cfg.identity, &g.acked);
        g.lease_until = lease_until;
        g.next_heartbeat = None;
        if was {
            info!(election = %self.cfg.election, "the backend answers again; failsafe ended, the term continues");
            self.publish(Change::Failsafe {
                view: FailsafeView::default(),
                claim: None,
            });
        }
    }

    /// A renewal failed with `e`: failsafe starts when the backend is
    /// unreachable (one WARN line), and a heartbeat round is due at once.
    pub(super) fn failsafe_renew_failed(&mut self, g: &mut Guard, e: &BackendError) {
        if !is_outage(e) || g.next_heartbeat.is_some() {
            return;
        }
        if !g.confirm.start() {
            let members = g.confirm.required().count();
            warn!(election = %self.cfg.election, members, error = %e, "the backend is unreachable; failsafe: leading on as long as every roster member confirms");
        }
        g.next_heartbeat = Some(Instant::now());
    }

    /// One heartbeat round; returns the new claim, or `None` when the
    /// lease and every confirmed bound have passed (the term is over for
    /// good).
    pub(super) async fn failsafe_heartbeat(
        &mut self,
        term: &Term,
        g: &mut Guard,
    ) -> Option<Instant> {
        let fs = self.failsafe.clone()?;
        let suspended_at_send = super::suspend::suspended();
        let wait = self.cfg.call_timeout();
        let token = term.holder.fencing_token;
        let (sent, acks) = fs
            .heartbeat_round(&g.confirm, &g.addresses, token, wait)
            .await;
        let now = Instant::now();
        let margin = self.cfg.margin(fs.max_promise(), now - sent);
        if now >= g.lease_until && g.confirm.expire(now, margin) {
            return None;
        }
        for (member, answer) in acks {
            match answer {
                Ok(promise) => {
                    g.warned.remove(&member);
                    g.confirm.confirmed(&member, sent, promise);
                }
                Err(why) => {
                    if g.warned.insert(member.clone()) {
                        warn!(election = %self.cfg.election, %member, reason = %why, "a roster member did not confirm this leader; failsafe ends at its last promise");
                    }
                }
            }
        }
        let bound = g.confirm.valid_until(margin);
        let claim = bound.map_or(g.lease_until, |b| b.max(g.lease_until));
        g.next_heartbeat = Some(sent + self.cfg.renew_interval);
        let view = FailsafeView {
            active: true,
            until: bound,
            members_confirmed: g.confirm.confirmed_at(now),
        };
        self.publish(Change::Failsafe {
            view,
            claim: Some((claim, suspended_at_send)),
        });
        Some(claim)
    }

    /// The term is over: heartbeats are accepted again, and the metric
    /// shows failsafe off.
    pub(super) fn failsafe_ended(&mut self, g: Option<&Guard>) {
        if let Some(fs) = &self.failsafe {
            fs.stepped_down();
        }
        if g.is_some_and(|g| g.confirm.active()) {
            self.publish(Change::Failsafe {
                view: FailsafeView::default(),
                claim: None,
            });
        }
    }
}

#[cfg(test)]
#[path = "failsafe_tests.rs"]
mod tests;
