//! [`ElectorConfig`]: the timing and identity of one candidate, validated
//! together (client-go's rules), and the backoff and jitter the loop uses
//! between attempts.

use std::time::Duration;

use rand::Rng;

/// Timing and identity of one candidate. Durations are validated by
/// [`crate::config`]; see [`ElectorConfig::validate`].
#[derive(Clone, Debug)]
pub struct ElectorConfig {
    /// Election name (the key suffix).
    pub election: String,
    /// This candidate's holder identity.
    pub identity: String,
    /// Requested lease TTL. The backend may grant more (etcd: whole seconds, at least its minimum).
    pub lease_duration: Duration,
    /// How often the leader renews (client-go's retry of the renew loop; default TTL/3).
    pub renew_interval: Duration,
    /// Upper bound of the backoff between failed attempts, and of a follower's
    /// wait when the backend cannot notify it.
    pub retry_period: Duration,
    /// Fixed drift margin; `None` means max(1% of TTL, 2 × renew round trip, 50 ms).
    pub drift_margin: Option<Duration>,
    /// On shutdown, keep the lease (while no longer claiming) until
    /// [`ElectorHandle::release`] is called or this much time passes; `None`
    /// resigns at once.
    pub drain_timeout: Option<Duration>,
    /// How long the candidacy gate (see [`Elector::with_candidacy`]) may stay
    /// closed while leading before this candidate resigns.
    pub health_grace: Duration,
    /// After a step-down other than shutdown or the validity deadline, wait up
    /// to this long (and never past `valid_until`) for
    /// [`ElectorHandle::release`] before releasing the key, so a supervised
    /// child is gone first (run mode). `None` releases at once.
    pub release_wait: Option<Duration>,
}

impl ElectorConfig {
    /// A configuration with the defaults of the CLI: renew every TTL/3,
    /// retry period 2 s, automatic drift margin, no drain, health grace = TTL,
    /// release at once.
    pub fn new(
        election: impl Into<String>,
        identity: impl Into<String>,
        lease_duration: Duration,
    ) -> Self {
        ElectorConfig {
            election: election.into(),
            identity: identity.into(),
            lease_duration,
            renew_interval: lease_duration / 3,
            retry_period: Duration::from_secs(2),
            drift_margin: None,
            drain_timeout: None,
            health_grace: lease_duration,
            release_wait: None,
        }
    }

    /// Deadline of every backend call: two thirds of the renew interval, so a
    /// hung call cannot delay the next renewal past its slot.
    pub fn call_timeout(&self) -> Duration {
        self.renew_interval * 2 / 3
    }

    /// Check the timing rules (client-go: RenewDeadline < LeaseDuration).
    ///
    /// # Errors
    /// A message naming the flags involved and their values.
    pub fn validate(&self) -> Result<(), String> {
        if self.election.is_empty() {
            return Err("--election must not be empty".into());
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_duration {
            return Err(format!(
                "--renew-interval ({}) must be shorter than --lease-duration ({})\nhint: the default is a third of the lease duration",
                humantime::format_duration(self.renew_interval),
                humantime::format_duration(self.lease_duration)
            ));
        }
        if let Some(m) = self.drift_margin
            && m + self.renew_interval >= self.lease_duration
        {
            return Err(format!(
                "--drift-margin ({}) plus --renew-interval ({}) must be shorter than --lease-duration ({})",
                humantime::format_duration(m),
                humantime::format_duration(self.renew_interval),
                humantime::format_duration(self.lease_duration)
            ));
        }
        Ok(())
    }

    /// How long a follower may keep naming the leader after the send instant
    /// of the last backend answer that showed it: one lease duration plus one
    /// call timeout. A follower checks at least that often while all is well
    /// (etcd: a read every renew interval; Redis: a campaign when the key's
    /// `PTTL` runs out), so only a silent backend lets the bound pass.
    pub fn silence_bound(&self) -> Duration {
        self.lease_duration + self.call_timeout()
    }

    /// The drift margin subtracted from a granted TTL: the fixed one, or the
    /// largest of 1% of `ttl`, two round trips `rtt` and 50 ms.
    pub(super) fn margin(&self, ttl: Duration, rtt: Duration) -> Duration {
        self.drift_margin
            .unwrap_or_else(|| (ttl / 100).max(rtt * 2).max(Duration::from_millis(50)))
    }
}

/// Capped, jittered exponential backoff (full jitter between half and all of the step).
#[derive(Debug)]
pub(super) struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub(super) fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }
    pub(super) fn next(&mut self) -> Duration {
        let step = self
            .base
            .saturating_mul(1u32 << self.attempt.min(16))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        step.mul_f64(rand::rng().random_range(0.5..=1.0))
    }
    pub(super) fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A random duration between zero and `max`, so candidates do not retry in step.
pub(super) fn jitter(max: Duration) -> Duration {
    max.mul_f64(rand::rng().random_range(0.0..=1.0))
}
