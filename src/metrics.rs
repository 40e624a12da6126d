//! Prometheus metrics of one candidate, registered on a registry passed in
//! (never the global one). Names follow client-go where it has one
//! (`leader_election_master_status`, `leader_election_slowpath_total`); every
//! series carries the election as the constant label `name`.
//!
//! The metrics observe the Elector: it reports each step as an
//! [`Observation`] to the [`Observer`] implemented here and knows no metric
//! names (the dependency runs from this module to the Elector, never back);
//! the gauges that depend on the clock
//! (`master_status`, `valid_for_seconds`) are computed at scrape time by
//! [`Metrics::refresh`], so they can never be staler than the answer of `/leader`.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::sync::Arc;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use tokio::time::Instant;

use crate::elector::{LeaderState, Observation, Observer};

/// The metric handles of one candidate.
pub struct Metrics {
    registry: Registry,
    /// `leader_election_master_status{name}`: 1 while this candidate leads, else 0.
    pub master_status: IntGauge,
    /// `leader_election_slowpath_total{name}`: renewals that failed and had to
    /// be retried inside a renew cycle (client-go counts its slow path, a
    /// renewal that needed more than the fast optimistic update).
    pub slowpath: IntCounter,
    /// `leader_election_transitions_total{name}`: leader changes observed (including to nobody).
    pub transitions: IntCounter,
    /// `leader_election_acquire_attempts_total{name}`: campaign attempts.
    pub acquire_attempts: IntCounter,
    /// `leader_election_acquire_failures_total{name,reason}`: campaign attempts that failed, by error reason.
    pub acquire_failures: IntCounterVec,
    /// `leader_election_renew_attempts_total{name}`: renewals sent.
    pub renew_attempts: IntCounter,
    /// `leader_election_renew_failures_total{name,reason}`: renewals that failed, by error reason.
    pub renew_failures: IntCounterVec,
    /// `leader_election_renew_duration_seconds{name}`: round trip of acknowledged renewals, in seconds.
    pub renew_latency: Histogram,
    /// `leader_election_backend_up{name,backend}`: 1 if the last backend call succeeded.
    pub backend_up: IntGauge,
    /// `leader_election_valid_for_seconds{name}`: seconds until `valid_until` (0 when not leading).
    pub valid_for: Gauge,
    /// `leader_election_pod_label_patches_total{name}`: successful patches of our Pod's leader label.
    pub label_patches: IntCounter,
    /// `leader_election_last_failover_seconds{name}`: duration of the last
    /// failover this candidate observed, in seconds: from the send instant of
    /// the last backend answer that showed the previous term alive to the
    /// observation of the next term. Never shorter than the real gap; longer
    /// by at most one follower check (etcd: a renew interval; Redis: a TTL).
    pub last_failover: Gauge,
    /// `leader_election_pod_label_failures_total{name,reason}`: failed label patches (`forbidden`, `not_found`, `api_error`, `unreachable`).
    pub label_patch_failures: IntCounterVec,
    /// The operations' metrics (pause, freeze, registry, priority, handovers).
    pub ops: OpsMetrics,
}

/// The metrics of the operations controls (see `OpsMetrics::new`).
pub struct OpsMetrics {
    /// `leader_election_paused{name}`: 1 while the election is paused.
    pub paused: IntGauge,
    /// `leader_election_frozen_seconds{name}`: seconds this candidate stays frozen.
    pub frozen_seconds: Gauge,
    /// `leader_election_candidates{name,ready}`: the registry as the leader lists it.
    pub candidates: IntGaugeVec,
    /// `leader_election_priority{name}`: this candidate's `--priority`.
    pub priority: IntGauge,
    /// `leader_election_handovers_total{name,reason}`: terms this leader handed over.
    pub handovers: IntCounterVec,
    /// `leader_election_failsafe_active{name}`: 1 while this leader claims
    /// on its members' promises (failsafe), else 0.
    pub failsafe_active: IntGauge,
    /// The end of the freeze, on the monotonic clock (read at scrape time).
    frozen_until: std::sync::Mutex<Option<Instant>>,
}

/// The reasons of `leader_election_handovers_total`, each series present from the start.
pub const HANDOVER_REASONS: [&str; 6] = [
    "shutdown",
    "resign",
    "switchover",
    "preemption",
    "revision",
    "unhealthy",
];

/// `leader_election_failsafe_active{name}`.
fn failsafe_gauge(registry: &Registry, election: &str) -> Result<IntGauge, prometheus::Error> {
    let opts = Opts::new(
        "leader_election_failsafe_active",
        "1 while this leader claims on its failsafe members' promises (its renewals find the backend unreachable); else 0.",
    )
    .const_label("name", election);
    register(registry, IntGauge::with_opts(opts))
}

impl OpsMetrics {
    fn new(registry: &Registry, election: &str) -> Result<OpsMetrics, prometheus::Error> {
        let opts = |name: &str, help: &str| Opts::new(name, help).const_label("name", election);
        let ops = OpsMetrics {
            paused: register(
                registry,
                IntGauge::with_opts(opts(
                    "leader_election_paused",
                    "1 while the election is paused (leader-elector pause): no voluntary handover, no new term; else 0.",
                )),
            )?,
            frozen_seconds: register(
                registry,
                Gauge::with_opts(opts(
                    "leader_election_frozen_seconds",
                    "Seconds this candidate stays frozen (POST /resign?freeze=): not eligible as leader until then; 0 when not frozen.",
                )),
            )?,
            candidates: register(
                registry,
                IntGaugeVec::new(
                    opts(
                        "leader_election_candidates",
                        "Candidates in the registry as this leader last listed it, by ready (ready and not frozen); 0 on followers.",
                    ),
                    &["ready"],
                ),
            )?,
            priority: register(
                registry,
                IntGauge::with_opts(opts(
                    "leader_election_priority",
                    "This candidate's --priority (0 never leads).",
                )),
            )?,
            handovers: register(
                registry,
                IntCounterVec::new(
                    opts(
                        "leader_election_handovers_total",
                        "Terms this candidate handed over on purpose, by reason (shutdown, resign, switchover, preemption, revision, unhealthy).",
                    ),
                    &["reason"],
                ),
            )?,
            failsafe_active: failsafe_gauge(registry, election)?,
            frozen_until: std::sync::Mutex::new(None),
        };
        for reason in HANDOVER_REASONS {
            ops.handovers.with_label_values(&[reason]);
        }
        for ready in ["true", "false"] {
            ops.candidates.with_label_values(&[ready]);
        }
        Ok(ops)
    }

    /// Set the gauges that follow the state or the clock.
    fn refresh(&self, state: &LeaderState, now: Instant) {
        self.paused.set(i64::from(state.paused));
        self.priority.set(i64::from(state.priority));
        let failsafe = state.failsafe.is_some_and(|f| f.active) && state.is_leader(now);
        self.failsafe_active.set(i64::from(failsafe));
        let until = *self.frozen_until.lock().unwrap_or_else(|e| e.into_inner());
        let left = until.map_or(0.0, |u| u.saturating_duration_since(now).as_secs_f64());
        self.frozen_seconds.set(left);
        if !state.is_leader(now) {
            for ready in ["true", "false"] {
                self.candidates.with_label_values(&[ready]).set(0);
            }
        }
    }

    /// Record an operations observation; `false` when `o` is none.
    fn observe(&self, o: Observation) -> bool {
        match o {
            Observation::Handover { reason } => self.handovers.with_label_values(&[reason]).inc(),
            Observation::Frozen(until) => {
                *self.frozen_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
            }
            Observation::Candidates { ready, not_ready } => {
                self.candidates
                    .with_label_values(&["true"])
                    .set(i64::from(ready));
                self.candidates
                    .with_label_values(&["false"])
                    .set(i64::from(not_ready));
            }
            _ => return false,
        }
        true
    }
}

/// Buckets of the renewal round trip histogram, in seconds: from half a
/// millisecond (a loopback backend) to 2.5 s (past any renew deadline).
const RENEW_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The counters, in the order `Metrics::new` takes them: name, help.
const COUNTERS: [(&str, &str); 5] = [
    (
        "leader_election_slowpath_total",
        "Renewals that failed and were retried within a renew cycle.",
    ),
    (
        "leader_election_transitions_total",
        "Leader changes observed by this candidate, including to nobody.",
    ),
    (
        "leader_election_acquire_attempts_total",
        "Campaign attempts.",
    ),
    (
        "leader_election_renew_attempts_total",
        "Lease renewals sent.",
    ),
    (
        "leader_election_pod_label_patches_total",
        "Successful patches of this Pod's leader label.",
    ),
];

/// The counters by `reason`, in the order `Metrics::new` takes them.
const BY_REASON: [(&str, &str); 3] = [
    (
        "leader_election_acquire_failures_total",
        "Campaign attempts that failed, by reason.",
    ),
    (
        "leader_election_renew_failures_total",
        "Lease renewals that failed, by reason.",
    ),
    (
        "leader_election_pod_label_failures_total",
        "Failed patches of Pod leader labels, by reason.",
    ),
];

/// The gauges in seconds, in the order `Metrics::new` takes them.
const GAUGES: [(&str, &str); 2] = [
    (
        "leader_election_valid_for_seconds",
        "Seconds until this candidate's leadership validity ends (0 when not leading).",
    ),
    (
        "leader_election_last_failover_seconds",
        "Seconds from the last backend answer showing the previous term alive to the observation of the next term, for the last change of term.",
    ),
];

/// `f` over each element, in order; the first error ends it.
fn try_map<T: Copy, U, const N: usize>(
    items: [T; N],
    mut f: impl FnMut(T) -> Result<U, prometheus::Error>,
) -> Result<[U; N], prometheus::Error> {
    let mut out = Vec::with_capacity(N);
    for item in items {
        out.push(f(item)?);
    }
    Ok(out
        .try_into()
        .unwrap_or_else(|_| unreachable!("one result per item")))
}

impl Metrics {
    /// Register the metrics of election `election` on `backend` in `registry`.
    ///
    /// # Errors
    /// A [`prometheus::Error`] if a metric with the same name is already registered.
    pub fn new(
        registry: Registry,
        election: &str,
        backend: &str,
    ) -> Result<Arc<Self>, prometheus::Error> {
        let opts = |name: &str, help: &str| Opts::new(name, help).const_label("name", election);
        let r = &registry;
        let counter = |name: &str, help: &str| register(r, IntCounter::with_opts(opts(name, help)));
        let by_reason =
            |name: &str, help: &str| register(r, IntCounterVec::new(opts(name, help), &["reason"]));
        let gauge = |name: &str, help: &str| register(r, Gauge::with_opts(opts(name, help)));
        let latency = HistogramOpts::new(
            "leader_election_renew_duration_seconds",
            "Round trip of acknowledged lease renewals, in seconds.",
        )
        .const_label("name", election)
        .buckets(RENEW_BUCKETS.to_vec());
        let up = opts(
            "leader_election_backend_up",
            "1 if the last backend call succeeded, else 0.",
        )
        .const_label("backend", backend);
        let leading = opts(
            "leader_election_master_status",
            "1 while this candidate leads the election, else 0.",
        );
        let [
            slowpath,
            transitions,
            acquire_attempts,
            renew_attempts,
            label_patches,
        ] = try_map(COUNTERS, |(name, help)| counter(name, help))?;
        let [acquire_failures, renew_failures, label_patch_failures] =
            try_map(BY_REASON, |(name, help)| by_reason(name, help))?;
        let [valid_for, last_failover] = try_map(GAUGES, |(name, help)| gauge(name, help))?;
        let m = Metrics {
            master_status: register(r, IntGauge::with_opts(leading))?,
            slowpath,
            transitions,
            acquire_attempts,
            acquire_failures,
            renew_attempts,
            renew_failures,
            renew_latency: register(r, Histogram::with_opts(latency))?,
            backend_up: register(r, IntGauge::with_opts(up))?,
            valid_for,
            last_failover,
            label_patches,
            label_patch_failures,
            ops: OpsMetrics::new(&registry, election)?,
            registry,
        };
        Ok(Arc::new(m))
    }

    /// Set the clock-dependent gauges from `state` at `now`.
    pub fn refresh(&self, state: &LeaderState, now: Instant) {
        self.master_status.set(i64::from(state.is_leader(now)));
        self.valid_for.set(state.valid_for(now).as_secs_f64());
        self.ops.refresh(state, now);
    }

    /// The registry's metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Register `metric` (just built by `made`) on `registry` and hand it back.
fn register<M>(
    registry: &Registry,
    made: Result<M, prometheus::Error>,
) -> Result<M, prometheus::Error>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = made?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl Observer for Metrics {
    fn observe(&self, observation: Observation) {
        if self.ops.observe(observation) {
            return;
        }
        match observation {
            Observation::CampaignSent => self.acquire_attempts.inc(),
            Observation::CampaignFailed { reason } => {
                self.acquire_failures.with_label_values(&[reason]).inc()
            }
            Observation::RenewSent => self.renew_attempts.inc(),
            Observation::Renewed { round_trip } => {
                self.renew_latency.observe(round_trip.as_secs_f64())
            }
            Observation::RenewFailed { reason } => {
                self.renew_failures.with_label_values(&[reason]).inc();
                self.slowpath.inc();
            }
            Observation::BackendUp(up) => self.backend_up.set(i64::from(up)),
            Observation::Transition => self.transitions.inc(),
            Observation::Failover { took } => self.last_failover.set(took.as_secs_f64()),
            Observation::Handover { .. }
            | Observation::Frozen(_)
            | Observation::Candidates { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elector::ElectorConfig;

    #[test]
    fn the_operations_metrics_follow_the_observations_and_the_state() {
        let m = Metrics::new(Registry::new(), "e", "memory").unwrap();
        let text = m.render();
        for reason in HANDOVER_REASONS {
            let series =
                format!("leader_election_handovers_total{{name=\"e\",reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
        m.observe(Observation::Handover {
            reason: "preemption",
        });
        m.observe(Observation::Candidates {
            ready: 2,
            not_ready: 1,
        });
        let now = Instant::now();
        m.observe(Observation::Frozen(Some(
            now + std::time::Duration::from_secs(30),
        )));
        let mut state = LeaderState::new(
            &ElectorConfig::new("e", "a", std::time::Duration::from_secs(15)),
            "memory",
        );
        state.paused = true;
        state.priority = 5;
        m.ops.refresh(&state, now);
        let text = m.render();
        for line in [
            "leader_election_handovers_total{name=\"e\",reason=\"preemption\"} 1",
            "leader_election_paused{name=\"e\"} 1",
            "leader_election_priority{name=\"e\"} 5",
            "leader_election_frozen_seconds{name=\"e\"} 30",
            // Not leading: the registry counts are the leader's only.
            "leader_election_candidates{name=\"e\",ready=\"true\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        m.observe(Observation::Candidates {
            ready: 2,
            not_ready: 1,
        });
        assert!(
            m.render()
                .contains("leader_election_candidates{name=\"e\",ready=\"false\"} 1")
        );
    }
}
