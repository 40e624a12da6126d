//! Holding a term: renew every renew interval, step down when `valid_until`
//! passes without an acknowledged renewal, when the backend says the term is
//! lost, on resign or on shutdown; then stop claiming, let the gates delay
//! the release (see [`super::gates`]), and resign the key.

use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::config::Backoff;
use super::observe::Observation;
use super::transition::Change;
use super::{Command, Elector};
use crate::backend::{BackendError, LostReason, Renewal, Term};

/// How a term ended, for logs and for which waits apply before the release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StepDown {
    /// Shutdown (or the end of a drain).
    Shutdown,
    /// `valid_until` passed without an acknowledged renewal.
    Deadline,
    /// The term ended without our resigning.
    Lost(Loss),
    /// Resigned on request.
    Resigned,
    /// The candidacy gate stayed closed past the health grace.
    Unhealthy,
}

/// Why a held term ended without our resigning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loss {
    /// A renewal's answer: the backend ended the term.
    Renewal(LostReason),
    /// The watch on our own key saw it deleted, overwritten or edited.
    KeyChanged,
    /// The key vanished (or its lease ended) while failsafe held the term
    /// through a backend outage: the backend expired the lease it could
    /// not hear renewed, not a foreign edit.
    ExpiredInOutage,
}

impl Loss {
    /// The `reason` field of the step-down log line.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Loss::Renewal(r) => r.as_str(),
            Loss::KeyChanged => "key deleted, overwritten or edited by someone else",
            Loss::ExpiredInOutage => {
                "the backend expired the term's lease during the outage failsafe bridged"
            }
        }
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The timing of the term being held.
struct Held {
    /// No claim at or after this instant (the safety rule).
    valid_until: Instant,
    next_renew: Instant,
    /// Backoff between failed renewals within one renew cycle.
    retry: Backoff,
    /// Set while draining after shutdown: the lease is kept until the app
    /// releases or this instant passes.
    drain_until: Option<Instant>,
    /// The failsafe of this term (`None`: failsafe off).
    fs: Option<super::failsafe::Guard>,
}

impl Held {
    /// How a loss reads: while failsafe bridges an outage, the backend
    /// removing the key or its lease is the lease it could not hear
    /// renewed expiring (e.g. a frozen etcd thawing), not a foreign edit.
    fn loss(&self, seen: Loss) -> Loss {
        let bridging = self.fs.as_ref().is_some_and(|g| g.bridging());
        match seen {
            Loss::KeyChanged | Loss::Renewal(LostReason::KeyDeleted | LostReason::LeaseExpired)
                if bridging =>
            {
                Loss::ExpiredInOutage
            }
            other => other,
        }
    }
}

/// The outcome of one renewal.
enum Renew {
    Renewed,
    Lost(Loss),
    Failed,
}

/// The reopening of a leader's watch of its own key. A broken watch is
/// reopened at once, then with backoff (see the README's safety argument);
/// its failure is said once (WARN) until a renewal succeeds again, then at
/// DEBUG: an outage bridged by failsafe would otherwise log it several
/// times a second for as long as it lasts.
struct Rewatch {
    /// When to reopen it; `None` while it is open.
    at: Option<Instant>,
    backoff: Backoff,
    said: bool,
}

impl Rewatch {
    fn new(renew_interval: Duration) -> Rewatch {
        Rewatch {
            at: None,
            backoff: Backoff::new(Duration::from_millis(20), renew_interval / 4),
            said: false,
        }
    }

    /// The watch failed with `e`: say so (once) and the backoff's next wait.
    fn failed(&mut self, e: &BackendError) -> Duration {
        if std::mem::replace(&mut self.said, true) {
            debug!(error = %e.report(), "watch on own key failed again; reopening it");
        } else {
            warn!(error = %e.report(), "watch on own key failed; reopening it (said once until a renewal succeeds)");
        }
        self.backoff.next()
    }

    /// A renewal succeeded: the next failure starts the backoff afresh.
    fn renewed(&mut self) {
        self.backoff.reset();
        self.said = false;
    }
}

impl Elector {
    /// Hold `term` (acquired by a request sent at `sent`) until it is lost,
    /// its deadline passes, or shutdown; then stop claiming and resign.
    /// While paused an unhealthy app does not end the term (nobody could
    /// take it until resume); the loop wakes when the controls change.
    pub(super) async fn lead(&mut self, term: Term, sent: Instant, shutdown: &CancellationToken) {
        let backend = self.backend.clone();
        let mut held = self.begin_term(&term, sent);
        let mut watch = Some(Box::pin(backend.watch(&term.holder)));
        let mut rewatch = Rewatch::new(self.cfg.renew_interval);
        let unhealthy = self.gates.unhealthy_past_grace();
        let preempt = self.preemption();
        tokio::pin!(unhealthy, preempt);
        let mut known = self.known.subscribe();
        let why = loop {
            let may_step_down = super::known::may_step_down(&mut known, &self.cfg.identity);
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if held.drain_until.is_none() => match self.gates.drain() {
                    Some(d) => held.drain_until = Some(self.begin_drain(d)),
                    None => break StepDown::Shutdown,
                },
                _ = sleep_until(held.drain_until.unwrap_or_else(Instant::now)), if held.drain_until.is_some() => {
                    warn!(election = %self.cfg.election, "drain timeout passed without POST /release; releasing");
                    break StepDown::Shutdown;
                }
                _ = sleep_until(held.valid_until) => break StepDown::Deadline,
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Resign { cooldown, successor, reply }) => {
                        self.resign_on_request(cooldown, successor, reply);
                        break StepDown::Resigned;
                    }
                    Some(Command::Release) if held.drain_until.is_some() => break StepDown::Shutdown,
                    Some(Command::Release) | None => {}
                },
                _ = &mut unhealthy, if may_step_down => break StepDown::Unhealthy,
                _ = known.changed() => {}
                to = &mut preempt, if held.drain_until.is_none() => { self.successor = Some(to); break StepDown::Resigned }
                r = async { watch.as_mut().expect("guarded by the select condition").await }, if watch.is_some() => match r {
                    Ok(()) => break StepDown::Lost(held.loss(Loss::KeyChanged)),
                    Err(e) => {
                        watch = None;
                        let next = rewatch.failed(&e);
                        rewatch.at = Some(Instant::now() + self.retry_wait(&e, |_| next));
                    }
                },
                _ = sleep_until(rewatch.at.unwrap_or_else(Instant::now)), if rewatch.at.is_some() => {
                    rewatch.at = None;
                    watch = Some(Box::pin(backend.watch(&term.holder)));
                }
                _ = sleep_until(heartbeat_at(&held)), if heartbeat_due(&held) => if !self.heartbeat(&term, &mut held).await { break StepDown::Deadline },
                _ = sleep_until(held.next_renew) => match self.renew(&term, &mut held).await {
                    Renew::Renewed => rewatch.renewed(),
                    Renew::Failed => {}
                    Renew::Lost(reason) => break StepDown::Lost(held.loss(reason)),
                },
            }
        };
        drop(watch);
        self.end_term(term, why, held).await;
    }

    /// The term is over (`why`): failsafe ends, then the step-down.
    async fn end_term(&mut self, term: Term, why: StepDown, held: Held) {
        self.failsafe_ended(held.fs.as_ref());
        self.step_down(term, why, held.valid_until).await;
    }

    /// A resign (or a handover naming `successor`) was asked for: stay out
    /// for `cooldown`; a resign is answered now, a handover once its
    /// release was sent (in `step_down`).
    fn resign_on_request(
        &mut self,
        cooldown: Duration,
        successor: Option<String>,
        reply: tokio::sync::oneshot::Sender<bool>,
    ) {
        self.cool_down(cooldown);
        match successor {
            Some(_) => self.handed_over = Some(reply),
            None => {
                let _ = reply.send(true);
            }
        }
        self.successor = successor.map(|to| (to, "switchover"));
    }

    /// Stay out of campaigns for `cooldown` (a freeze when not zero, which
    /// the metrics show).
    pub(super) fn cool_down(&mut self, cooldown: Duration) {
        self.gates.cool_down(cooldown);
        if !cooldown.is_zero() {
            let until = self.gates.cooldown_until();
            self.report(super::Observation::Frozen(until));
        }
    }

    /// Publish our new term (acquired by a request sent at `sent`) and its
    /// validity deadline.
    fn begin_term(&mut self, term: &Term, sent: Instant) -> Held {
        let now = Instant::now();
        let ttl = term.ttl;
        let asked = self.cfg.lease_duration;
        if ttl > asked && self.publisher.state().lease_duration == asked {
            // First grant that differs (etcd: at least 2 s, whole seconds).
            warn!(
                election = %self.cfg.election,
                asked = %crate::flags::format_duration(asked),
                granted = %crate::flags::format_duration(ttl),
                "the backend granted a longer lease than --lease-duration; failover takes up to the granted TTL"
            );
        }
        let valid_until = sent + ttl.saturating_sub(self.cfg.margin(ttl, now - sent));
        self.elected(term, valid_until);
        let me = self.cfg.identity.as_str();
        self.known.send_if_modified(|k| {
            k.alive.took_term(me);
            false
        });
        self.last_seen = Some(term.holder.clone());
        Held {
            valid_until,
            next_renew: sent + self.cfg.renew_interval,
            retry: Backoff::new(Duration::from_millis(50), self.cfg.renew_interval / 4),
            drain_until: None,
            fs: self.failsafe_begin(valid_until),
        }
    }

    /// Stop claiming at once but keep the lease (and renew it) so no one else
    /// starts while the app finishes; returns the end of the drain.
    fn begin_drain(&mut self, d: Duration) -> Instant {
        self.publish(Change::Stopping);
        // Record the end of our claim now, not at release: long-polls return
        // and `stopped_leading` goes out.
        self.observe(None);
        if self.gates.waits_for_command() {
            info!(election = %self.cfg.election, "not claiming; stopping the command before releasing the lease");
        } else {
            info!(election = %self.cfg.election, drain_timeout = ?d, "draining: not claiming, keeping the lease until POST /release or the drain timeout");
        }
        Instant::now() + d
    }

    /// Send one renewal of `term`, bounded by the call timeout and by
    /// `valid_until`; on success move `valid_until` to the send instant plus
    /// the granted TTL minus the drift margin.
    async fn renew(&mut self, term: &Term, held: &mut Held) -> Renew {
        let backend = self.backend.clone();
        let send = Instant::now();
        let suspended_at_send = super::suspend::suspended();
        let deadline = self
            .cfg
            .call_timeout()
            .min(held.valid_until.saturating_duration_since(send));
        if let Some(g) = &mut held.fs {
            self.failsafe_before_write(g);
        }
        self.report(Observation::RenewSent);
        let r = match timeout(deadline, backend.renew(term)).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::Timeout {
                backend: backend.about(),
                call: "renew",
                timeout_ms: deadline.as_millis() as u64,
            }),
        };
        match r {
            Ok(Renewal::Renewed { ttl, servers }) => {
                let rtt = send.elapsed();
                held.valid_until = send + ttl.saturating_sub(self.cfg.margin(ttl, rtt));
                held.next_renew = send + self.cfg.renew_interval;
                if let Some(g) = &mut held.fs {
                    self.failsafe_renewed(g, held.valid_until);
                }
                held.retry.reset();
                self.report(Observation::Renewed { round_trip: rtt });
                self.backend_ok();
                self.heard(Some(term.holder.fencing_token), send);
                self.publish(Change::Renewed {
                    valid_until: held.valid_until,
                    suspended_at_send,
                    ttl,
                    servers,
                });
                Renew::Renewed
            }
            Ok(Renewal::Lost(reason)) => Renew::Lost(Loss::Renewal(reason)),
            Err(e) => {
                self.report(Observation::RenewFailed { reason: e.reason() });
                // Throttled: again after the Retry-After; `valid_until`
                // still ends the term if that is too late.
                let wait = self.retry_wait(&e, |_| held.retry.next());
                if let Some(g) = &mut held.fs {
                    self.failsafe_renew_failed(g, &e);
                }
                self.backend_failed(e);
                held.next_renew = Instant::now() + wait;
                Renew::Failed
            }
        }
    }

    /// One failsafe heartbeat round; `false` when the claim has passed for good.
    async fn heartbeat(&mut self, term: &Term, held: &mut Held) -> bool {
        let Some(mut g) = held.fs.take() else {
            return true;
        };
        let claim = self.failsafe_heartbeat(term, &mut g).await;
        held.fs = Some(g);
        match claim {
            Some(until) => {
                held.valid_until = until;
                true
            }
            None => false,
        }
    }

    /// Stop claiming first, then (after the gates' waits) release the key.
    async fn step_down(&mut self, term: Term, why: StepDown, valid_until: Instant) {
        // A drain already set `stopping` when it began; the transition is
        // recorded now.
        if matches!(why, StepDown::Shutdown) {
            self.publish(Change::Stopping);
        }
        self.observe(None);
        self.log_step_down(&term, &why);
        let token = term.holder.fencing_token;
        self.gates
            .before_release(&mut self.commands, token, valid_until, &why)
            .await;
        // Chosen after the waits, from the registry already known: the
        // release itself is the only request.
        let reason = match (&why, &self.successor) {
            (StepDown::Shutdown, _) => Some("shutdown"),
            (StepDown::Unhealthy, _) => Some("unhealthy"),
            (StepDown::Resigned, Some((_, why))) => Some(*why),
            (StepDown::Resigned, None) => Some("resign"),
            (StepDown::Deadline | StepDown::Lost(_), _) => None,
        };
        let successor = self.release_successor(&why);
        if let Some(reason) = reason {
            self.report(super::Observation::Handover { reason });
        }
        if let Some(to) = &successor {
            info!(election = %self.cfg.election, successor = %to, "releasing the term to the named successor");
            self.known.send_if_modified(|k| {
                k.alive.released_to(to, Instant::now());
                false
            });
        }
        let backend = self.backend.clone();
        let released = self
            .call("release", backend.release(&term, successor.as_deref()))
            .await;
        if let Some(reply) = self.handed_over.take() {
            let _ = reply.send(true);
        }
        if let Err(e) = released {
            debug!(error = %e.report(), "resign failed; the lease will expire by TTL");
            if !matches!(why, StepDown::Shutdown) {
                self.abandoned = Some(term);
            }
        }
    }

    fn log_step_down(&self, term: &Term, why: &StepDown) {
        let (election, identity) = (&self.cfg.election, &self.cfg.identity);
        let fencing_token = term.holder.fencing_token;
        match why {
            StepDown::Resigned => {
                info!(%election, %identity, fencing_token, "resigned on request")
            }
            StepDown::Unhealthy => {
                let grace = self.gates.health_grace();
                warn!(%election, %identity, fencing_token, ?grace, "resigning: the app stayed unhealthy past the health grace")
            }
            StepDown::Shutdown => {
                info!(%election, %identity, fencing_token, "resigning for shutdown")
            }
            StepDown::Deadline if self.failsafe.is_some() => {
                warn!(%election, %identity, fencing_token, "stepped down: neither a renewal nor every roster member's promise covers the term any longer (failsafe: an earlier line names the member that stopped confirming, if one did; at --failsafe-max-outage the members' own logs say so)")
            }
            StepDown::Deadline => {
                warn!(%election, %identity, fencing_token, "stepped down: no renewal acknowledged before the validity deadline")
            }
            StepDown::Lost(loss) => {
                let reason = loss.as_str();
                warn!(%election, %identity, fencing_token, reason, "stepped down: term lost")
            }
        }
    }
}

/// Whether a failsafe heartbeat round is due at some instant.
fn heartbeat_due(held: &Held) -> bool {
    held.fs.as_ref().is_some_and(|g| g.next_heartbeat.is_some())
}

/// When the next failsafe heartbeat round is due (now when none is).
fn heartbeat_at(held: &Held) -> Instant {
    held.fs
        .as_ref()
        .and_then(|g| g.next_heartbeat)
        .unwrap_or_else(Instant::now)
}
