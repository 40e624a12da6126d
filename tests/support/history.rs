//! The partition suite's history beside the [`Recorder`](super::recorder):
//! a fenced register written by every sidecar that says it leads, and the
//! longest time with no leader after each heal.
//!
//! The register is the downstream store fencing tokens exist for: it accepts
//! a write only when the write's token is at least the last one it accepted,
//! and counts every refusal (a holder that thought it held after a newer
//! term had written). A write accepted with the token of the last accepted
//! write but from another process would be one term held twice: the checker
//! reports it.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::http::{HTTP_LIMIT, http_request_at};
use super::recorder::{Sample, parse};

/// What the register saw.
#[derive(Clone, Debug, Default)]
pub struct RegisterStats {
    /// Writes accepted.
    pub accepted: u64,
    /// Writes refused: their token was below the last accepted one.
    pub refused_stale: u64,
    /// Writes accepted with the last accepted token from another process
    /// (one token, two holders); must be empty.
    pub shared_token: Vec<String>,
    /// The highest token accepted.
    pub last: u64,
}

/// A store that refuses writes carrying a token below the last it accepted.
#[derive(Default)]
pub struct Register {
    state: Mutex<(RegisterStats, Option<usize>)>,
}

impl Register {
    /// Write from `writer` (a sidecar slot) carrying fencing `token`;
    /// whether it was accepted.
    pub fn write(&self, writer: usize, token: u64) -> bool {
        let mut g = self.state.lock().unwrap();
        let (stats, last_writer) = &mut *g;
        if token < stats.last {
            stats.refused_stale += 1;
            return false;
        }
        if token == stats.last && last_writer.is_some_and(|w| w != writer) {
            stats.shared_token.push(format!(
                "token {token} written by slot {writer} after slot {last_writer:?}"
            ));
        }
        stats.accepted += 1;
        stats.last = token;
        *last_writer = Some(writer);
        true
    }

    /// A copy of what it saw.
    pub fn stats(&self) -> RegisterStats {
        self.state.lock().unwrap().0.clone()
    }
}

/// One writer task per sidecar: ask `/leader`; on a 200, work for a random
/// 0–`hold` ms (the client's own pause), then write the answer's token.
pub struct Writers {
    tasks: Vec<JoinHandle<()>>,
}

impl Writers {
    /// Writers for the sidecars at `addrs` (slot = index) into `register`.
    pub fn start(register: Arc<Register>, addrs: &[(IpAddr, u16)], hold: Duration) -> Writers {
        let tasks = addrs
            .iter()
            .enumerate()
            .map(|(slot, &(ip, port))| {
                let register = register.clone();
                tokio::spawn(async move {
                    loop {
                        let answer = http_request_at(ip, port, "GET", "/leader", None, HTTP_LIMIT)
                            .await
                            .ok()
                            .and_then(|(s, b)| parse(s, &b));
                        if let Some(a) = answer.filter(|a| a.is_leader) {
                            let work = rand::rng().random_range(0..=hold.as_millis() as u64);
                            sleep(Duration::from_millis(work)).await;
                            register.write(slot, a.fencing_token.unwrap_or(0));
                        }
                        sleep(Duration::from_millis(10)).await;
                    }
                })
            })
            .collect();
        Writers { tasks }
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The longest time with no leader in `[heal, until)`: from `heal` to the
/// first claim received after it, and between consecutive claims after it
/// (receive instants of `is_leader: true` answers, any slot; a claim answered
/// across `heal` counts as a leader at `heal`). A window with no claim at
/// all is leaderless throughout.
pub fn leaderless_after(
    slots: &[(String, Vec<Sample>)],
    heal: Instant,
    until: Instant,
) -> Duration {
    let mut claims: Vec<Instant> = slots
        .iter()
        .flat_map(|(_, s)| s.iter())
        .filter(|s| s.is_true() && s.recv >= heal && s.send < until)
        .map(|s| if s.send <= heal { heal } else { s.recv })
        .collect();
    claims.sort();
    let mut prev = heal;
    let mut worst = Duration::ZERO;
    for c in claims.iter().copied().chain(std::iter::once(until)) {
        let c = c.min(until);
        worst = worst.max(c.saturating_duration_since(prev));
        prev = prev.max(c);
    }
    worst
}
