//! Run mode with `--every`: `leader-elector run --every 5m -- COMMAND` runs
//! COMMAND at most once per period across all sidecars of the election,
//! whichever claims the period first (see `crate::coord::periods`). Not
//! gated by leadership: every sidecar competes for every period.
//!
//! Invariants:
//! - Periods are aligned to the Unix epoch on this sidecar's wall clock;
//!   the waits between them are on the monotonic clock.
//! - The command starts only once the period's claim was granted and
//!   before the period's end by this sidecar's clock; a period whose claim
//!   fails (backend unreachable, a timeout) does not run, and is never
//!   caught up: the next period is claimed at its own start.
//! - While the command runs, the claim is renewed every third of its TTL
//!   (ShedLock's `lockAtMostFor` with a keep-alive); each renewal moves the
//!   deadline to its send instant + the TTL it got. The command is gone by
//!   the claim's deadline (minus a slack): SIGTERM `--kill-grace` before it
//!   (at most half the claim in), SIGKILL at it; a claim found lost (gone,
//!   or another's) stops it at once. A run that outlived its claim would no
//!   longer be exclusive.
//! - Once the command exits, by itself or stopped, the period is completed
//!   with the claim's token, a failed run too: a run is a run, and a retry
//!   by another sidecar would be a second one. It stays completed for
//!   `--completed-retention`, and at least until its end plus the skew
//!   margin.
//! - At shutdown a running command is stopped and its period is not
//!   completed: its claim runs out at the period's end plus the margin.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Forwarded, KILL_SLACK, RunOptions, Running, exit_code, recv, signal_group, stop};
use crate::coord::periods::{self, Period, When};
use crate::coord::{Acquire, Grant, Object, Service, Try};
use nix::sys::signal::Signal;

/// What `run --every` needs besides the run options.
pub struct Every {
    /// Run mode's options (command, kill grace; `every` is set).
    pub opts: RunOptions,
    /// The period's length.
    pub every: Duration,
    /// The coordination service of this sidecar's backend.
    pub service: Arc<Service>,
    /// The schedule's name: the election's.
    pub name: String,
    /// This sidecar's identity (the claims' owner label).
    pub identity: String,
    /// `--completed-retention`.
    pub retention: Duration,
}

/// Claim and run each period until `shutdown`. Returns `None` (the run
/// ends only at shutdown).
pub async fn run_every(e: Every, shutdown: CancellationToken) -> Option<i32> {
    let mut signals = Forwarded::install();
    let mut done: Option<u64> = None;
    loop {
        let period = Period::containing(SystemTime::now(), e.every);
        if done.is_none_or(|d| period.start > d) {
            done = Some(period.start);
            e.one(period, &shutdown, &mut signals).await?;
        }
        // Until the next period by this sidecar's clock.
        let left = (period.end_time().duration_since(SystemTime::now())).unwrap_or_default();
        tokio::select! {
            _ = sleep(left.max(Duration::from_millis(1))) => {}
            _ = shutdown.cancelled() => return None,
        }
    }
}

impl Every {
    /// Claim `period` and, when granted, run the command once and complete
    /// the period. `None` at shutdown.
    async fn one(
        &self,
        period: Period,
        shutdown: &CancellationToken,
        signals: &mut Forwarded,
    ) -> Option<()> {
        let queue = periods::queue(&self.name);
        let job = period.job();
        let sent = Instant::now();
        let When::Open(ttl) = period.when(SystemTime::now(), Duration::from_secs(1)) else {
            return Some(());
        };
        let what = Acquire::Job {
            queue: &queue,
            job: &job,
        };
        let claim = self
            .service
            .acquire(what, &self.identity, ttl, Duration::ZERO);
        let grant = tokio::select! {
            c = claim => c,
            _ = shutdown.cancelled() => return None,
        };
        let grant = match grant {
            Ok(Try::Acquired(g)) => g,
            Ok(Try::Held(holder)) => {
                debug!(%period, holder, "the period is claimed by another sidecar");
                return Some(());
            }
            Ok(Try::Completed | Try::Full(_)) => {
                debug!(%period, "the period was run already");
                return Some(());
            }
            Err(e) => {
                warn!(%period, error = %e, "cannot claim the period: it does not run here (no catch-up; the next period is claimed at its start)");
                return Some(());
            }
        };
        if SystemTime::now() >= period.end_time() {
            warn!(%period, "the claim was granted after the period ended: not running it");
            return Some(());
        }
        let held = Held {
            period,
            queue: queue.clone(),
            job: job.clone(),
            grant: grant.clone(),
        };
        let stopped = self.run(&held, sent, shutdown, signals).await;
        if stopped {
            return None;
        }
        self.complete(period, &queue, &job, &grant).await;
        Some(())
    }

    /// Run the command for the held period until it exits, its claim is
    /// lost, or the claim's deadline (moved on by each renewal, every third
    /// of the claim's TTL). Returns whether shutdown stopped it.
    async fn run(
        &self,
        held: &Held,
        sent: Instant,
        shutdown: &CancellationToken,
        signals: &mut Forwarded,
    ) -> bool {
        let (period, grant) = (held.period, &held.grant);
        let Some(mut child) = self.start(period, grant).await else {
            return false;
        };
        let ttl = Duration::from_millis(grant.ttl_ms);
        let mut until = Until::new(sent, ttl, self.opts.kill_grace);
        let (status, stopping) = loop {
            tokio::select! {
                s = watch(&mut child, signals) => break (s, false),
                _ = sleep_until(until.renew_at) => match self.renew(held, ttl).await {
                    Kept::Until(sent, left) => until = Until::new(sent, left, self.opts.kill_grace),
                    Kept::Failed => until.renew_at = Instant::now() + ttl / 3,
                    Kept::Lost => {
                        warn!(%period, "the period's claim is no longer ours: stopping the command now");
                        let by = (Instant::now() + self.opts.kill_grace).min(until.deadline);
                        break (stop(&mut child, by).await, false);
                    }
                },
                _ = sleep_until(until.term_at) => {
                    warn!(%period, "the command outlives its claim: stopping it by the claim's deadline");
                    break (stop(&mut child, until.deadline).await, false);
                }
                _ = shutdown.cancelled() => {
                    let by = (Instant::now() + self.opts.kill_grace).min(until.deadline);
                    break (stop(&mut child, by).await, true);
                }
            }
        };
        signal_group(&child, Signal::SIGKILL);
        info!(%period, code = ?status.map(exit_code), "the command exited");
        stopping
    }

    /// Start the command for `period` with the claim's environment.
    async fn start(&self, period: Period, grant: &Grant) -> Option<Running> {
        let env = [
            ("LEADER_ELECTOR_ELECTION", self.name.clone()),
            ("LEADER_ELECTOR_IDENTITY", self.identity.clone()),
            (
                "LEADER_ELECTOR_FENCING_TOKEN",
                grant.fencing_token.to_string(),
            ),
            ("LEADER_ELECTOR_PERIOD_START", period.to_string()),
            ("LEADER_ELECTOR_PERIOD_END", period.next().to_string()),
        ];
        match super::spawn_with(&self.opts.command, &env).await {
            Ok(child) => {
                info!(%period, pid = child.group.map(nix::unistd::Pid::as_raw), fencing_token = grant.fencing_token, "claimed the period; started the command");
                Some(child)
            }
            Err(e) => {
                warn!(%period, command = ?self.opts.command, error = %e, "cannot start the command");
                None
            }
        }
    }

    /// Renew the held claim for `ttl` (`lockAtMostFor` while it runs).
    async fn renew(&self, held: &Held, ttl: Duration) -> Kept {
        let sent = Instant::now();
        let token = &held.grant.token;
        let object = Object::Job {
            queue: &held.queue,
            job: &held.job,
        };
        match self.service.renew(object, token, ttl).await {
            Ok(crate::coord::Outcome::Ok(left)) => Kept::Until(sent, left.unwrap_or(ttl).min(ttl)),
            Ok(other) => {
                debug!(period = %held.period, outcome = ?other, "the period's claim was not renewed");
                Kept::Lost
            }
            Err(e) => {
                debug!(period = %held.period, error = %e, "cannot renew the period's claim yet");
                Kept::Failed
            }
        }
    }

    /// Complete `period`, so that no sidecar runs it again.
    async fn complete(&self, period: Period, queue: &str, job: &str, grant: &Grant) {
        let keep = period.retention(SystemTime::now(), self.retention);
        match self.service.complete(queue, job, &grant.token, keep).await {
            Ok(crate::coord::Outcome::Ok(_)) => debug!(%period, "completed the period"),
            Ok(other) => {
                warn!(%period, outcome = ?other, "the period's claim ended before its completion")
            }
            Err(e) => {
                warn!(%period, error = %e, "cannot complete the period; its claim runs out at the period's end plus the skew margin")
            }
        }
    }
}

/// A granted period: what its renewals and completion name.
struct Held {
    period: Period,
    queue: String,
    job: String,
    grant: Grant,
}

/// A renewal's outcome.
enum Kept {
    /// Renewed: sent at this instant, for this TTL.
    Until(Instant, Duration),
    /// Not renewed this time (the backend did not answer): try again.
    Failed,
    /// The claim is gone or another's: the run is no longer exclusive.
    Lost,
}

/// The instants of a claim held since `sent` for `ttl`: its deadline (less
/// the slack), the SIGTERM before it (`kill_grace` earlier, not before half
/// the claim), and the next renewal (a third in).
struct Until {
    deadline: Instant,
    term_at: Instant,
    renew_at: Instant,
}

impl Until {
    fn new(sent: Instant, ttl: Duration, kill_grace: Duration) -> Until {
        let deadline = sent + ttl;
        let deadline = deadline.checked_sub(KILL_SLACK).unwrap_or(deadline);
        let half = sent + deadline.saturating_duration_since(sent) / 2;
        let term_at = deadline.checked_sub(kill_grace).unwrap_or(half).max(half);
        Until {
            deadline,
            term_at,
            renew_at: sent + ttl / 3,
        }
    }
}

/// Wait for the command to exit, forwarding SIGHUP, SIGUSR1 and SIGUSR2.
async fn watch(child: &mut Running, signals: &mut Forwarded) -> Option<std::process::ExitStatus> {
    loop {
        tokio::select! {
            s = child.child.wait() => return s.ok(),
            Some(()) = recv(&mut signals.hup) => signal_group(child, Signal::SIGHUP),
            Some(()) = recv(&mut signals.usr1) => signal_group(child, Signal::SIGUSR1),
            Some(()) = recv(&mut signals.usr2) => signal_group(child, Signal::SIGUSR2),
        }
    }
}
