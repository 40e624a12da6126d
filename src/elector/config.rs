//! [`ElectorConfig`]: the timing and identity of one candidate, validated
//! together (client-go's rules) into a typed [`ElectorConfigError`], and the backoff and jitter the loop uses
//! between attempts.

use std::time::Duration;

use rand::Rng;

/// Timing and identity of one candidate, checked by
/// [`ElectorConfig::validate`]. Build one with [`Elector::builder`](super::Elector::builder)
/// (which validates), or with [`ElectorConfig::new`] and
/// [`Elector::new`](super::Elector::new).
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
    /// [`ElectorHandle::release`](super::ElectorHandle::release) is called or this much time passes; `None`
    /// resigns at once.
    pub drain_timeout: Option<Duration>,
    /// How long the candidacy gate (see [`Elector::with_candidacy`](super::Elector::with_candidacy)) may stay
    /// closed while leading before this candidate resigns.
    pub health_grace: Duration,
    /// After a step-down other than shutdown or the validity deadline, wait up
    /// to this long (and never past `valid_until`) for
    /// [`ElectorHandle::release`](super::ElectorHandle::release) before releasing the key, so a supervised
    /// child is gone first (run mode). `None` releases at once.
    pub release_wait: Option<Duration>,
    /// This candidate's priority, revision and preemption wait.
    pub standing: Standing,
}

/// How long a leader waits, by default, before it hands over to a ready
/// candidate of a higher priority that stays in the registry
/// ([`Standing::preempt_after`]).
pub const DEFAULT_PREEMPT_AFTER: Duration = Duration::from_secs(10);

/// This candidate's place among the others, as it publishes it in the
/// candidate registry (backends without one ignore it, except that
/// priority 0 never campaigns on any backend).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    /// Higher is preferred as leader; 0 never campaigns (it follows and
    /// reports). Default [`DEFAULT_PRIORITY`](crate::backend::candidates::DEFAULT_PRIORITY).
    pub priority: u32,
    /// The revision this candidate runs (a Pod template hash); empty when
    /// unknown. A leader hands over to a ready candidate of a newer one.
    pub revision: String,
    /// While leading: how long a ready candidate of a higher priority must
    /// have been seen in the registry before this leader hands over to it.
    pub preempt_after: Duration,
}

impl Default for Standing {
    fn default() -> Self {
        Standing {
            priority: crate::backend::candidates::DEFAULT_PRIORITY,
            revision: String::new(),
            preempt_after: DEFAULT_PREEMPT_AFTER,
        }
    }
}

impl ElectorConfig {
    /// A configuration with the defaults of the CLI: renew every TTL/3,
    /// retry period 2 s, automatic drift margin, no drain, health grace = TTL,
    /// release at once, priority 1, no revision, preempt after 10 s.
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
            standing: Standing::default(),
        }
    }

    /// Deadline of every backend call: two thirds of the renew interval, so a
    /// hung call cannot delay the next renewal past its slot.
    pub fn call_timeout(&self) -> Duration {
        self.renew_interval * 2 / 3
    }

    /// Check the identity and the timing rules (client-go's: the renew
    /// deadline is shorter than the lease duration).
    ///
    /// # Errors
    /// [`ElectorConfigError`], naming the fields involved and their values.
    pub fn validate(&self) -> Result<(), ElectorConfigError> {
        if self.election.is_empty() {
            return Err(ElectorConfigError::EmptyElection);
        }
        if self.identity.is_empty() {
            return Err(ElectorConfigError::EmptyIdentity);
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_duration {
            return Err(ElectorConfigError::RenewNotShorter {
                renew_interval: self.renew_interval,
                lease_duration: self.lease_duration,
            });
        }
        if let Some(m) = self.drift_margin
            && m + self.renew_interval >= self.lease_duration
        {
            return Err(ElectorConfigError::DriftTooLarge {
                drift_margin: m,
                renew_interval: self.renew_interval,
                lease_duration: self.lease_duration,
            });
        }
        if self.retry_period.is_zero() {
            return Err(ElectorConfigError::ZeroRetryPeriod);
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

/// A rule of [`ElectorConfig::validate`] that a configuration breaks.
/// `Display` names the fields ([`ElectorConfig`]'s, which are also the
/// builder's methods); [`ElectorConfigError::cli_message`] names the
/// command-line flags instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ElectorConfigError {
    /// `election` is empty.
    #[error("election must not be empty")]
    EmptyElection,
    /// `identity` is empty.
    #[error("identity must not be empty")]
    EmptyIdentity,
    /// `renew_interval` is zero or not shorter than `lease_duration`.
    #[error("renew_interval ({}) must be shorter than lease_duration ({})", fmt(*renew_interval), fmt(*lease_duration))]
    RenewNotShorter {
        /// The renew interval given.
        renew_interval: Duration,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// `drift_margin` plus `renew_interval` is not shorter than `lease_duration`.
    #[error("drift_margin ({}) plus renew_interval ({}) must be shorter than lease_duration ({})", fmt(*drift_margin), fmt(*renew_interval), fmt(*lease_duration))]
    DriftTooLarge {
        /// The drift margin given.
        drift_margin: Duration,
        /// The renew interval given.
        renew_interval: Duration,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// `retry_period` is zero.
    #[error("retry_period must be longer than zero")]
    ZeroRetryPeriod,
}

fn fmt(d: Duration) -> String {
    crate::flags::format_duration(d)
}

impl ElectorConfigError {
    /// The field at fault (the first one named in the message).
    pub fn field(&self) -> &'static str {
        match self {
            ElectorConfigError::EmptyElection => "election",
            ElectorConfigError::EmptyIdentity => "identity",
            ElectorConfigError::RenewNotShorter { .. } => "renew_interval",
            ElectorConfigError::DriftTooLarge { .. } => "drift_margin",
            ElectorConfigError::ZeroRetryPeriod => "retry_period",
        }
    }

    /// The message in the words of the command line: the flags instead of
    /// the fields, with a hint where one helps.
    pub fn cli_message(&self) -> String {
        let message = self
            .to_string()
            .replace("lease_duration", "--lease-duration")
            .replace("renew_interval", "--renew-interval")
            .replace("drift_margin", "--drift-margin")
            .replace("retry_period", "--retry-period");
        match self {
            ElectorConfigError::EmptyElection | ElectorConfigError::EmptyIdentity => {
                format!("--{message}")
            }
            ElectorConfigError::RenewNotShorter { .. } => {
                format!("{message}\nhint: the default is a third of the lease duration")
            }
            _ => message,
        }
    }
}

/// The command line's wording ([`ElectorConfigError::cli_message`]).
impl From<ElectorConfigError> for String {
    fn from(e: ElectorConfigError) -> String {
        e.cli_message()
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
