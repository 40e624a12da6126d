//! A fleet: sidecars of one election on one backend (the Kubernetes
//! stand-in, etcd or Redis), each started with its own flags, and a
//! simulated rolling update measured under the overlap checker
//! ([`super::recorder`]). The operations scenarios (priority, preemption,
//! rolling updates) run on every backend through it, and the rolling
//! bench reuses the update.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::{Instant, sleep};

use super::backends::Backend;
use super::recorder::{Recorder, runs};
use super::{FAST, Sidecar, election, wait_for};

/// Sidecars of one election on one [`Backend`].
pub struct Fleet {
    /// The backend (on the stand-in it keeps the sidecars' endpoints open).
    pub backend: Backend,
    /// The election's name (unique per test).
    pub election: String,
    /// Flags every sidecar gets before its own ([`FAST`] by default).
    pub common: Vec<String>,
}

/// The lease duration of [`FAST`].
pub const FLEET_LEASE: Duration = Duration::from_secs(2);

impl Fleet {
    fn new(backend: Backend, test: &str) -> Fleet {
        Fleet {
            backend,
            election: election(test),
            common: FAST.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// A fleet on the Kubernetes API stand-in.
    pub async fn kubernetes(test: &str) -> Fleet {
        Self::new(Backend::kubernetes("team-a"), test)
    }

    /// A fleet on a fresh etcd.
    pub async fn etcd(test: &str) -> Fleet {
        Self::new(Backend::start("etcd").await, test)
    }

    /// A fleet on a fresh Redis server.
    pub async fn redis(test: &str) -> Fleet {
        Self::new(Backend::start("redis").await, test)
    }

    /// A fleet on Redlock over three fresh Redis servers.
    pub async fn redlock(test: &str) -> Fleet {
        Self::new(Backend::start("redlock").await, test)
    }

    /// Start sidecar `id` with `flags` after the common ones.
    pub async fn start(&mut self, id: &str, flags: &[&str]) -> Sidecar {
        let mut args = self.common.clone();
        args.extend(flags.iter().map(|s| s.to_string()));
        self.backend.sidecar(&self.election, id, &args).await
    }
}

/// Wait until `s` answers `/leader` with a healthy backend (it has
/// campaigned or followed once, so its record is written).
pub async fn until_answering(s: &Sidecar, limit: Duration) {
    wait_for(limit, "the sidecar's first backend answer", || async {
        matches!(s.leader().await, Some((_, b)) if b["backend_healthy"] == true)
    })
    .await;
}

/// What a rolling update did to the election.
#[derive(Clone, Debug)]
pub struct Rolled {
    /// Changes of leader (term) from the first leader on.
    pub changes: usize,
    /// Time without a leader from the first leader on, summed.
    pub leaderless: Duration,
    /// The longest of those gaps.
    pub longest_gap: Duration,
    /// The overlap checker's problems (must be empty).
    pub problems: Vec<String>,
}

/// A rolling update of `replicas` replicas: start them (revision `old` when
/// `revisions`, else none), wait for a leader; then `replicas` times start a
/// new replica (revision `new`), wait `settle` after its first answer (the
/// time a Pod takes to turn ready and a Deployment to move on), SIGTERM
/// the oldest old replica and wait for it to exit.
pub async fn rolling_update(
    fleet: &mut Fleet,
    replicas: usize,
    revisions: bool,
    settle: Duration,
) -> Rolled {
    let rec = Recorder::new(FLEET_LEASE);
    let revision = |r: &'static str| {
        if revisions {
            vec!["--revision", r]
        } else {
            vec![]
        }
    };
    let mut old = Vec::new();
    for i in 0..replicas {
        let s = fleet.start(&format!("old-{i}"), &revision("old")).await;
        old.push((rec.add(&s.identity, s.port), s));
    }
    rec.wait_leader(Duration::from_secs(30))
        .await
        .expect("a first leader");
    let mut new = Vec::new();
    for (i, (slot, mut o)) in old.into_iter().enumerate() {
        let s = fleet.start(&format!("new-{i}"), &revision("new")).await;
        rec.add(&s.identity, s.port);
        until_answering(&s, Duration::from_secs(30)).await;
        sleep(settle).await;
        new.push(s);
        o.signal(Signal::SIGTERM);
        o.wait_exit(Duration::from_secs(15)).await;
        rec.stop_polling(slot);
    }
    rec.wait_leader(Duration::from_secs(30))
        .await
        .expect("a leader after the update");
    sleep(FLEET_LEASE).await;
    measure(&rec, "rolling update")
}

/// Leader changes and leaderless time in `rec`'s recording so far.
pub fn measure(rec: &Recorder, scenario: &str) -> Rolled {
    let report = rec.check(scenario);
    let mut all: Vec<_> = rec
        .snapshot()
        .iter()
        .enumerate()
        .flat_map(|(i, (label, samples))| runs(i, label, samples))
        .collect();
    all.sort_by_key(|r| r.latest_start());
    let (mut leaderless, mut longest) = (Duration::ZERO, Duration::ZERO);
    let mut covered: Option<Instant> = None;
    for r in &all {
        if let Some(end) = covered {
            let gap = r.latest_start().saturating_duration_since(end);
            leaderless += gap;
            longest = longest.max(gap);
        }
        covered = Some(covered.map_or(r.earliest_end(), |c| c.max(r.earliest_end())));
    }
    Rolled {
        changes: report.transitions,
        leaderless,
        longest_gap: longest,
        problems: report.problems,
    }
}
