//! Time the host spent suspended, for the safety rule.
//!
//! `valid_until` is an instant of tokio's clock, which is `CLOCK_MONOTONIC`
//! on Linux: it stops while the host or VM is suspended (rust-lang/rust#87906),
//! while the backend's TTL and the other candidates' clocks keep running. A
//! leader that resumes after a suspend longer than its lease would still see
//! `now < valid_until`. So every safety decision adds the time suspended since
//! the instant its deadline was measured from: `CLOCK_BOOTTIME` counts the
//! suspend, `CLOCK_MONOTONIC` does not, and their difference grows by exactly
//! the time suspended. Sleeping stays on tokio's clock (a timer that fires
//! late after a resume only delays the step-down; readers already answer
//! "not leader").
//!
//! Where `CLOCK_BOOTTIME` cannot be read (not Linux), the difference is
//! taken as zero: the rule is then the monotonic one, as before.

use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// The time this host has spent suspended since boot, as far as can be
/// measured: `CLOCK_BOOTTIME − CLOCK_MONOTONIC` (nanosecond clocks; the two
/// reads are microseconds apart, which only ever makes the value larger by
/// that jitter, i.e. more cautious). Plus, in tests, an injected suspend.
pub fn suspended() -> Duration {
    let boot = clock_gettime(ClockId::CLOCK_BOOTTIME).map(Duration::from);
    let mono = clock_gettime(ClockId::CLOCK_MONOTONIC).map(Duration::from);
    let measured = match (boot, mono) {
        (Ok(b), Ok(m)) => b.saturating_sub(m),
        _ => Duration::ZERO,
    };
    measured + injected()
}

/// How much of a suspend happened between a reference taken with
/// [`suspended`] and now.
pub fn since(reference: Duration) -> Duration {
    suspended().saturating_sub(reference)
}

#[cfg(not(test))]
fn injected() -> Duration {
    Duration::ZERO
}

#[cfg(test)]
thread_local! {
    static INJECTED: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

#[cfg(test)]
fn injected() -> Duration {
    INJECTED.with(|c| c.get())
}

/// Tests: pretend the host was suspended for `d` more (this thread only).
#[cfg(test)]
pub fn inject(d: Duration) {
    INJECTED.with(|c| c.set(c.get() + d));
}
