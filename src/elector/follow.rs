//! Not leading: follow the current holder until its term may have ended, and
//! wait out the gates (cooldown, candidacy) as a read-only follower that still
//! answers who leads.

use std::ops::ControlFlow;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::config::jitter;
use super::{Command, Elector};
use crate::backend::{BackendError, Holder, WaitReason};

impl Elector {
    /// Answer a command received while not leading.
    pub(super) fn handle_idle_command(&mut self, cmd: Option<Command>) {
        match cmd {
            Some(Command::Resign {
                cooldown, reply, ..
            }) => {
                self.cool_down(cooldown);
                self.show_freeze();
                let _ = reply.send(false);
            }
            Some(Command::Release) | None => {}
        }
    }

    /// Stay out of campaigns, serving commands and following the current
    /// holder read-only, until the cooldown ends and the candidacy gate opens.
    /// Returns `false` on shutdown.
    pub(super) async fn wait_until_eligible(&mut self, shutdown: &CancellationToken) -> bool {
        let backend = self.backend.clone();
        while !self.gates.may_campaign() {
            let until = self.gates.cooldown_until().unwrap_or_else(Instant::now);
            self.show_freeze();
            let gate = self.gates.candidacy_changed();
            // Who leads meanwhile? Read it, then watch it (and read again
            // every renew interval, so a silent backend is noticed).
            let sent = Instant::now();
            let mut look_again = self.cfg.retry_period.min(Duration::from_millis(200));
            let seen = match self.call("read", backend.read()).await {
                Ok(h) => {
                    self.backend_ok();
                    self.heard(h.as_ref().map(|h| h.fencing_token), sent);
                    self.observe(h.as_ref());
                    h
                }
                Err(e) => {
                    look_again = self.retry_wait(&e, |_| look_again);
                    self.backend_failed(e);
                    None
                }
            };
            let watch = async {
                match &seen {
                    Some(h) => {
                        let _ = backend.watch(h).await;
                    }
                    // Nobody leads (yet: right after our resign a follower
                    // is about to take over), or the backend failed: look
                    // again shortly.
                    None => sleep(look_again).await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                cmd = self.commands.recv() => self.handle_idle_command(cmd),
                _ = sleep_until(until), if Instant::now() < until => {}
                _ = watch => {}
                _ = sleep(self.cfg.renew_interval) => {}
                // The health checker is gone: stop gating rather than never campaign.
                gone = gate => if gone { self.gates.drop_candidacy() },
            }
        }
        true
    }

    /// Name the freeze (the cooldown after a resign) as what keeps this
    /// candidate from campaigning, with its end; else a closed health gate
    /// (which ends when the app answers, so `/leader` shows no `until`);
    /// nothing once both are over.
    fn show_freeze(&mut self) {
        let now = Instant::now();
        let left = self
            .gates
            .cooldown_until()
            .map(|t| t.saturating_duration_since(now));
        let frozen = left
            .filter(|d| !d.is_zero())
            .map(|d| (WaitReason::Frozen, d));
        let unhealthy = self
            .gates
            .health_gate_closed()
            .then_some((WaitReason::HealthGate, self.cfg.renew_interval));
        self.set_waiting(frozen.or(unhealthy));
    }

    /// Follow `holder` until its key changes, the backend's hint of its expiry
    /// passes, shutdown, or the watch fails.
    pub(super) async fn follow(&mut self, holder: &Holder, shutdown: &CancellationToken) {
        let backend = self.backend.clone();
        // A backend without a watch (Redis) tells when the key expires: wake
        // right then (crash failover ≈ TTL, about one command per follower
        // per TTL); its release notice covers graceful handovers. An expiry
        // hint longer than two TTLs (a key without TTL) is capped by the
        // retry period.
        let recheck = holder.expires_in.map(|d| {
            let d = if d > self.cfg.lease_duration * 2 {
                self.cfg.retry_period
            } else {
                d
            };
            d + jitter(Duration::from_millis(20))
        });
        let watch = backend.watch(holder);
        tokio::pin!(watch);
        // A candidate whose app turns unhealthy stops following (and
        // campaigning) until it is healthy again.
        let closes = self.gates.candidacy_closes();
        tokio::pin!(closes);
        // A backend with a watch is silent while nothing changes, and a
        // frozen server or a member without quorum stays silent too: check
        // the term every renew interval (see `check_term`).
        let mut next_check = recheck
            .is_none()
            .then(|| Instant::now() + self.cfg.renew_interval);
        let mut last = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sleep_until(next_check.unwrap_or_else(Instant::now)), if next_check.is_some() => {
                    match self.check_term(holder, &mut last, shutdown).await {
                        ControlFlow::Continue(next) => next_check = Some(next),
                        ControlFlow::Break(()) => return,
                    }
                }
                cmd = self.commands.recv() => self.handle_idle_command(cmd),
                _ = &mut closes => return,
                r = &mut watch => { self.after_watch(r, shutdown).await; return; }
                _ = sleep(recheck.unwrap_or(Duration::MAX)), if recheck.is_some() => return,
            }
        }
    }

    /// How much longer than a renew interval a follower lets its backend's
    /// watch stay silent before it reads the key: half a call timeout (a
    /// third of the renew interval), for the leader's write latency and the
    /// watch's delivery.
    fn watch_slack(&self) -> Duration {
        self.cfg.call_timeout() / 2
    }

    /// Whether `holder`'s term is still alive, checked once by a follower.
    /// A renewal the backend's own watch delivered after `last` (the
    /// instant the term was last heard) and within the last renew interval
    /// plus [`Elector::watch_slack`] counts as heard at its arrival, and the
    /// next check waits for the next renewal. Otherwise the key is read (a
    /// linearizable read needs the quorum), so a frozen server or a member
    /// without quorum is noticed within a renew interval plus the slack plus
    /// one call timeout. `Continue(next)`: alive, check again at `next`;
    /// `Break`: the term changed or the backend failed (campaign).
    async fn check_term(
        &mut self,
        holder: &Holder,
        last: &mut Instant,
        shutdown: &CancellationToken,
    ) -> ControlFlow<(), Instant> {
        let backend = self.backend.clone();
        let quiet = self.cfg.renew_interval + self.watch_slack();
        let heard = backend.heard_at(holder);
        if let Some(at) = heard.filter(|at| *at > *last && at.elapsed() < quiet) {
            self.backend_ok();
            self.heard(Some(holder.fencing_token), at);
            *last = at;
            return ControlFlow::Continue(at + quiet);
        }
        let sent = Instant::now();
        match self.call("read", backend.read()).await {
            Ok(Some(h)) if h.term_id == holder.term_id => {
                self.backend_ok();
                self.heard(Some(h.fencing_token), sent);
                *last = sent;
                ControlFlow::Continue(sent + self.cfg.renew_interval)
            }
            // The key changed and the watch did not say so: campaign.
            Ok(_) => ControlFlow::Break(()),
            // Throttled: wait as asked before the campaign.
            Err(e) if e.retry_after().is_some() => {
                self.after_watch(Err(e), shutdown).await;
                ControlFlow::Break(())
            }
            Err(e) => {
                self.backend_failed(e);
                ControlFlow::Break(())
            }
        }
    }

    /// After the watch (or, throttled, a read) ended with `r`: back off
    /// (the backend's `Retry-After` when it throttles) before the campaign.
    async fn after_watch(&mut self, r: Result<(), BackendError>, shutdown: &CancellationToken) {
        match r {
            Ok(()) => debug!("the key changed; campaigning"),
            Err(e) => {
                let wait = self.retry_wait(&e, Self::next_backoff);
                self.backend_failed(e);
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = sleep(wait) => {}
                }
            }
        }
    }
}
