//! At most once per period: a period of `every` is the job named by its
//! start (Unix seconds) in a queue derived from the schedule's name, claimed
//! and completed with the ordinary job verbs (`claim`, `complete`).
//!
//! Invariants:
//! - Periods are aligned to the Unix epoch: a start is a whole multiple of
//!   `every` (whole seconds) since 1970-01-01T00:00:00Z, so every sidecar
//!   names the same period alike whatever its time zone.
//! - A claim lasts at least until the period ends plus [`SKEW_MARGIN`]
//!   (ShedLock's `lockAtLeastFor`): a sidecar whose clock is behind the
//!   claimant's by up to the margin still finds the period taken, even when
//!   the run was short or its sidecar died.
//! - A completed period stays completed for `--completed-retention`, and at
//!   least until its end plus [`SKEW_MARGIN`].
//! - A period whose end plus the margin has passed cannot be claimed: a
//!   period that did not run then is skipped, never caught up.
//!
//! The queue of schedule `NAME` is `periods~NAME`: `~` is not allowed in
//! ordinary queue names, so no ordinary job queue shares its keys.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The most two sidecars' wall clocks are assumed to differ: 5 s. NTP keeps
/// hosts within milliseconds of each other and Kubernetes nodes are rarely
/// more than a second apart; 5 s covers a node whose time sync lags (and
/// the ±2 s skew the tests apply, a 4 s spread) while keeping a crashed
/// run's period blocked for only 5 s past its end.
pub const SKEW_MARGIN: Duration = Duration::from_secs(5);

/// Longest period: 366 days.
pub const MAX_EVERY: Duration = Duration::from_secs(366 * 24 * 3600);

/// The job queue of schedule `name` (see the module docs).
pub fn queue(name: &str) -> String {
    format!("periods~{name}")
}

/// Check a period length: whole seconds, from 1 s to [`MAX_EVERY`].
///
/// # Errors
/// A message naming `field` and the rule.
pub fn check_every(field: &str, every: Duration) -> Result<Duration, String> {
    if every < Duration::from_secs(1) || every > MAX_EVERY || every.subsec_nanos() != 0 {
        return Err(format!(
            "{field} ({}) must be whole seconds from 1s to 366 days",
            crate::flags::format_duration(every),
        ));
    }
    Ok(every)
}

/// One period of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    /// Its start, in seconds since the Unix epoch (a multiple of `every`).
    pub start: u64,
    /// Its length (whole seconds, at least 1 s).
    pub every: Duration,
}

/// Where a period is, seen from a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Claimable now: the claim's TTL (at least `ttl` asked for, and until
    /// the period's end plus [`SKEW_MARGIN`]).
    Open(Duration),
    /// Its end plus [`SKEW_MARGIN`] has passed.
    Ended,
    /// It starts more than [`SKEW_MARGIN`] from now.
    NotStarted,
}

impl Period {
    /// The period of `every` that contains `now`.
    pub fn containing(now: SystemTime, every: Duration) -> Period {
        let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let len = every.as_secs().max(1);
        Period {
            start: secs - secs % len,
            every,
        }
    }

    /// The period of `every` starting at `start` (RFC 3339 in UTC, e.g.
    /// `2026-12-02T04:00:00Z`).
    ///
    /// # Errors
    /// A message naming the field: not an RFC 3339 UTC time, before the
    /// epoch, with a fraction of a second, or not a multiple of `every`.
    pub fn parse(start: &str, every: Duration) -> Result<Period, String> {
        let at = humantime::parse_rfc3339(start).map_err(|e| {
            format!("period start ({start}) is not an RFC 3339 UTC time ({e}); use e.g. 2026-12-02T04:00:00Z")
        })?;
        let since = at
            .duration_since(UNIX_EPOCH)
            .map_err(|_| format!("period start ({start}) is before 1970-01-01T00:00:00Z"))?;
        let len = every.as_secs().max(1);
        if since.subsec_nanos() != 0 || since.as_secs() % len != 0 {
            return Err(format!(
                "period start ({start}) is not a whole multiple of every ({}) from the Unix epoch; the period containing it starts at {}",
                crate::flags::format_duration(every),
                Period::containing(at, every)
            ));
        }
        Ok(Period {
            start: since.as_secs(),
            every,
        })
    }

    /// The job id of this period in its queue: the start in Unix seconds.
    pub fn job(&self) -> String {
        self.start.to_string()
    }

    /// The instant the period starts.
    pub fn start_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.start)
    }

    /// The instant the period ends (the next one starts).
    pub fn end_time(&self) -> SystemTime {
        self.start_time() + self.every
    }

    /// The next period.
    pub fn next(&self) -> Period {
        Period {
            start: self.start + self.every.as_secs(),
            every: self.every,
        }
    }

    /// Whether the period can be claimed at `now`, and for how long: at
    /// least `ttl`, and until its end plus [`SKEW_MARGIN`] (whole
    /// milliseconds, at least 1 s).
    pub fn when(&self, now: SystemTime, ttl: Duration) -> When {
        let until = self.end_time() + SKEW_MARGIN;
        let Ok(left) = until.duration_since(now) else {
            return When::Ended;
        };
        if left.is_zero() {
            return When::Ended;
        }
        if self.start_time() > now + SKEW_MARGIN {
            return When::NotStarted;
        }
        let left = Duration::from_millis(left.as_millis() as u64).max(Duration::from_secs(1));
        When::Open(left.max(ttl))
    }

    /// How long a completion made at `now` is kept: `retention`, and at
    /// least until the period's end plus [`SKEW_MARGIN`] (whole seconds,
    /// rounded up).
    pub fn retention(&self, now: SystemTime, retention: Duration) -> Duration {
        let until = self.end_time() + SKEW_MARGIN;
        let left = until.duration_since(now).unwrap_or_default();
        let left = Duration::from_secs(left.as_secs() + u64::from(left.subsec_nanos() > 0));
        retention.max(left)
    }
}

impl std::fmt::Display for Period {
    /// The start in RFC 3339 (UTC, whole seconds).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}",
            humantime::format_rfc3339_seconds(self.start_time())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_MIN: Duration = Duration::from_secs(300);

    #[test]
    fn a_start_on_the_grid_is_its_unix_seconds() {
        let p = Period::parse("2026-12-02T04:00:00Z", FIVE_MIN).unwrap();
        assert_eq!(p.job(), "1796184000");
        assert_eq!(p.to_string(), "2026-12-02T04:00:00Z");
        assert_eq!(p.next().to_string(), "2026-12-02T04:05:00Z");
        assert_eq!(
            Period::containing(p.start_time() + FIVE_MIN / 2, FIVE_MIN),
            p
        );
    }

    #[test]
    fn a_start_off_the_grid_or_not_rfc3339_is_refused() {
        let off = Period::parse("2026-12-02T04:01:00Z", FIVE_MIN).unwrap_err();
        assert!(
            off.contains("not a whole multiple") && off.contains("04:00:00Z"),
            "{off}"
        );
        let frac = Period::parse("2026-12-02T04:00:00.5Z", FIVE_MIN).unwrap_err();
        assert!(frac.contains("not a whole multiple"), "{frac}");
        let bad = Period::parse("yesterday", FIVE_MIN).unwrap_err();
        assert!(bad.contains("RFC 3339"), "{bad}");
        assert!(check_every("every", Duration::ZERO).is_err());
        assert!(check_every("every", Duration::from_millis(1500)).is_err());
        assert!(check_every("every", FIVE_MIN).is_ok());
    }

    #[test]
    fn a_claim_lasts_until_the_end_plus_the_margin_and_ended_periods_are_closed() {
        let p = Period::parse("2026-12-02T04:00:00Z", FIVE_MIN).unwrap();
        let s = p.start_time();
        let one = Duration::from_secs(1);
        assert_eq!(p.when(s, one), When::Open(FIVE_MIN + SKEW_MARGIN));
        assert_eq!(
            p.when(s, Duration::from_secs(900)),
            When::Open(Duration::from_secs(900))
        );
        // A clock behind by less than the margin still gets a claim.
        assert_eq!(
            p.when(s + FIVE_MIN + one, one),
            When::Open(SKEW_MARGIN - one)
        );
        assert_eq!(p.when(s + FIVE_MIN + SKEW_MARGIN, one), When::Ended);
        // A clock ahead by less than the margin may claim early.
        assert!(matches!(p.when(s - one, one), When::Open(_)));
        assert_eq!(p.when(s - SKEW_MARGIN - one, one), When::NotStarted);
    }

    #[test]
    fn a_completion_is_kept_at_least_until_the_end_plus_the_margin() {
        let p = Period::parse("2026-12-02T04:00:00Z", FIVE_MIN).unwrap();
        let s = p.start_time();
        let short = Duration::from_secs(1);
        assert_eq!(p.retention(s, short), FIVE_MIN + SKEW_MARGIN);
        let day = Duration::from_secs(86_400);
        assert_eq!(p.retention(s, day), day);
        assert_eq!(p.retention(s + FIVE_MIN + SKEW_MARGIN, short), short);
    }
}
