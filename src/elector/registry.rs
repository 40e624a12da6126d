//! Keeping this candidate's record in the backend's candidate registry
//! (`backend::candidates`) while the Elector runs: written at start, renewed
//! every [`RENEW_IN_LEASES`](crate::backend::candidates::RENEW_IN_LEASES)
//! lease durations, written at once when readiness (the candidacy gate)
//! changes, and withdrawn when the Elector stops. While this candidate
//! leads it is not renewed (a releasing leader names another candidate,
//! never itself; the leader's writes stay one per renew interval) and it
//! is written again at once when leadership ends — except on a backend
//! that deletes a lapsed record (etcd, whose record is bound to a lease
//! of 12 lease durations): there it is renewed while leading too (each
//! renewal writes it again), or the leader's record
//! would vanish from the registry 12 lease durations into its term. A backend without a
//! registry gets no calls at all.
//!
//! The record is a hint for a releasing leader's choice of successor; a
//! failed write only leaves the previous record until its TTL, so errors
//! are logged and retried, never reported as the election's.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::agree::PreemptAfter;
use crate::backend::CandidateRegistry;
use crate::backend::candidates::{Candidate, timing};
use crate::elector::LeaderState;

/// The task that keeps the record, and how to stop it.
pub(super) struct Registry {
    backend: Arc<dyn CandidateRegistry>,
    task: JoinHandle<()>,
    stop: CancellationToken,
}

impl Registry {
    /// Start keeping `candidate`'s record through `backend` for an election
    /// whose lease lasts `lease_duration`; each call gets `call_timeout`.
    /// `gates` are the candidacy gate (`None`: always ready) and the
    /// published leadership state (`None`: never skip while leading).
    /// `None` when the backend has no registry. The keeper stops with
    /// `shutdown`: a leader shutting down writes no record after its
    /// release (that write and its lease would race the successor's
    /// campaign on the backend); [`Registry::withdraw`] removes it.
    pub(super) fn start(
        shutdown: &CancellationToken,
        registry: Option<Arc<dyn CandidateRegistry>>,
        candidate: Candidate,
        (ready, leading, frozen): Gates,
        lease_duration: Duration,
        call_timeout: Duration,
    ) -> Option<Registry> {
        let backend = registry?;
        let stop = shutdown.child_token();
        let agree = candidate.preempt_after.map(PreemptAfter::new);
        let keeper = Keeper {
            backend: backend.clone(),
            candidate,
            ready,
            leader: leading.clone(),
            agree,
            leading,
            frozen,
            lease_duration,
            call_timeout,
        };
        let task = tokio::spawn(keeper.run(stop.clone()));
        Some(Registry {
            backend,
            task,
            stop,
        })
    }

    /// Stop renewing and withdraw the record (bounded by the call timeout).
    pub(super) async fn withdraw(mut self, identity: &str, limit: Duration) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
        match timeout(limit, self.backend.withdraw_candidate(identity)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                debug!(error = %e.report(), "could not withdraw the candidate record; it lapses by its TTL")
            }
            Err(_) => debug!("withdrawing the candidate record timed out; it lapses by its TTL"),
        }
    }
}

/// A keeper dropped without [`Registry::withdraw`] (a dropped `run`)
/// stops renewing at once; its record lapses by its TTL.
impl Drop for Registry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The candidacy gate, the published leadership state and the freeze.
pub(super) type Gates = (
    Option<watch::Receiver<bool>>,
    Option<watch::Receiver<LeaderState>>,
    watch::Receiver<Option<(Instant, SystemTime)>>,
);

struct Keeper {
    backend: Arc<dyn CandidateRegistry>,
    candidate: Candidate,
    ready: Option<watch::Receiver<bool>>,
    leading: Option<watch::Receiver<LeaderState>>,
    /// The published state again, to see a new leader ([`PreemptAfter`]).
    leader: Option<watch::Receiver<LeaderState>>,
    /// The comparison of `--preempt-after` with the leader's.
    agree: Option<PreemptAfter>,
    frozen: watch::Receiver<Option<(Instant, SystemTime)>>,
    lease_duration: Duration,
    call_timeout: Duration,
}

impl Keeper {
    async fn run(mut self, stop: CancellationToken) {
        let (renew, ttl) = timing(self.lease_duration);
        loop {
            if self.wait_while_leading(&stop).await {
                return;
            }
            let healthy = self.ready.as_mut().is_none_or(|g| *g.borrow_and_update());
            // A frozen member is not eligible: its record says until when,
            // and `ready` false keeps it out of every choice on backends
            // that do not store the freeze.
            // Counted on the monotonic clock, shown by the wall clock.
            let frozen = (*self.frozen.borrow_and_update()).filter(|(t, _)| *t > Instant::now());
            self.candidate.frozen_until = frozen.map(|(_, wall)| wall);
            self.candidate.ready = healthy && frozen.is_none();
            let thaw = frozen.map(|(t, _)| t - Instant::now());
            let call = self.backend.publish_candidate(&self.candidate, ttl);
            let wait = match timeout(self.call_timeout, call).await {
                Ok(Ok(())) => renew,
                Ok(Err(e)) => {
                    debug!(error = %e.report(), "could not write the candidate record; retrying");
                    self.lease_duration
                }
                Err(_) => self.lease_duration,
            };
            let gate = self.ready.clone();
            let until = Instant::now() + thaw.map_or(wait, |t| wait.min(t));
            loop {
                self.compare_with_leader().await;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = sleep_until(until) => {}
                    closed = readiness_changed(gate.clone(), healthy) => if closed { self.ready = None },
                    _ = freeze_changed(&mut self.frozen) => {}
                    // A new leader: compare, and keep waiting (no write).
                    _ = leader_changed(self.leader.as_mut()) => continue,
                }
                break;
            }
        }
    }

    /// Compare this candidate's `--preempt-after` with the leader's record
    /// (once per leader; see [`PreemptAfter`]).
    async fn compare_with_leader(&mut self) {
        let (Some(agree), Some(state)) = (self.agree.as_mut(), self.leader.as_mut()) else {
            return;
        };
        let leader = state.borrow_and_update().leader.clone();
        let me = self.candidate.identity.as_str();
        let limit = self.call_timeout;
        agree
            .check(&*self.backend, (me, leader.as_deref()), limit)
            .await;
    }
}

/// Resolves when the published state changes; pends forever without one
/// or once its sender is gone.
async fn leader_changed(state: Option<&mut watch::Receiver<LeaderState>>) {
    let Some(s) = state else {
        return std::future::pending().await;
    };
    if s.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Keeper {
    /// While this candidate holds a term, wait (no renewals); `true` when
    /// `stop` came first.
    async fn wait_while_leading(&mut self, stop: &CancellationToken) -> bool {
        // A backend that deletes a lapsed record (etcd) renews it while
        // leading too: otherwise it vanishes from the registry mid-term.
        if self.backend.deletes_lapsed() {
            return stop.is_cancelled();
        }
        let Some(state) = self.leading.as_mut() else {
            return false;
        };
        while state.borrow_and_update().own_term.is_some() {
            tokio::select! {
                _ = stop.cancelled() => return true,
                r = state.changed() => if r.is_err() { self.leading = None; return false },
            }
        }
        false
    }
}

/// Resolves when the freeze changes; pends forever once its sender is gone.
async fn freeze_changed(frozen: &mut watch::Receiver<Option<(Instant, SystemTime)>>) {
    if frozen.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves when the gate says other than `written` (`false`), or with
/// `true` when its sender is gone; pends forever without a gate. A send of
/// the same answer (the health checker sends one every interval) is not a
/// change: it writes nothing.
async fn readiness_changed(gate: Option<watch::Receiver<bool>>, written: bool) -> bool {
    let Some(mut g) = gate else {
        return std::future::pending().await;
    };
    loop {
        if g.changed().await.is_err() {
            return true;
        }
        if *g.borrow_and_update() != written {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use tokio::time::sleep;

    use super::*;
    use crate::backend::Result;
    use crate::backend::candidates::Listed;

    /// A backend that only records what the registry keeper asks of it.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl CandidateRegistry for Recorder {
        async fn publish_candidate(&self, c: &Candidate, ttl: Duration) -> Result<()> {
            let call = format!(
                "publish {} ready={} ttl={}s",
                c.identity,
                c.ready,
                ttl.as_secs()
            );
            self.calls.lock().unwrap().push(call);
            Ok(())
        }
        async fn withdraw_candidate(&self, identity: &str) -> Result<()> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("withdraw {identity}"));
            Ok(())
        }
        async fn candidates(&self) -> Result<Vec<Listed>> {
            Ok(Vec::new())
        }
        async fn watch_candidates(&self) -> Result<()> {
            std::future::pending().await
        }
    }

    /// A keeper of `pod-a`'s record behind a candidacy gate (open), lease
    /// 15 s: the recording backend, the gate and the keeper.
    fn gated_keeper() -> (Arc<Recorder>, watch::Sender<bool>, Registry) {
        let backend = Arc::new(Recorder::default());
        let (gate, ready) = watch::channel(true);
        let registry = Registry::start(
            &CancellationToken::new(),
            Some(backend.clone()),
            Candidate::new("pod-a"),
            (Some(ready), None, watch::channel(None).1),
            Duration::from_secs(15),
            Duration::from_secs(3),
        )
        .expect("a backend with a registry");
        (backend, gate, registry)
    }

    #[tokio::test(start_paused = true)]
    async fn the_record_is_renewed_rewritten_on_readiness_and_withdrawn() {
        let (backend, gate, registry) = gated_keeper();
        let calls = || backend.calls.lock().unwrap().clone();
        sleep(Duration::from_secs(1)).await;
        assert_eq!(calls(), ["publish pod-a ready=true ttl=180s"]);
        sleep(Duration::from_secs(60)).await;
        assert_eq!(
            calls().len(),
            2,
            "renewed after 4 lease durations: {:?}",
            calls()
        );
        gate.send(false).unwrap();
        sleep(Duration::from_millis(10)).await;
        assert_eq!(calls()[2], "publish pod-a ready=false ttl=180s", "at once");
        registry.withdraw("pod-a", Duration::from_secs(3)).await;
        assert_eq!(calls().last().unwrap(), "withdraw pod-a");
        assert_eq!(calls().len(), 4);
    }

    /// A health check that says again what it said (the checker sends
    /// every `--health-interval`) writes nothing: only a change of
    /// readiness is written at once. (Before, every check rewrote the
    /// record: with the default 1 s interval one write per second per
    /// member, and on etcd each write moved the adopter mark, so a
    /// handover put that landed between a write and the successor's
    /// adoption read was not adopted: a lease duration with no leader.)
    #[tokio::test(start_paused = true)]
    async fn a_health_check_that_repeats_its_answer_writes_nothing() {
        let (backend, gate, registry) = gated_keeper();
        let calls = || backend.calls.lock().unwrap().clone();
        for _ in 0..30 {
            sleep(Duration::from_secs(1)).await;
            gate.send_replace(true);
        }
        assert_eq!(calls().len(), 1, "one write in 30 s: {:?}", calls());
        gate.send_replace(false);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(calls().len(), 2, "a change is written at once");
        gate.send_replace(false);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(calls().len(), 2, "{:?}", calls());
        registry.withdraw("pod-a", Duration::from_secs(3)).await;
    }

    /// While this candidate leads its record is not renewed; it is written
    /// at once when leadership ends.
    #[tokio::test(start_paused = true)]
    async fn the_leaders_record_waits_until_it_stops_leading() {
        use crate::elector::{ElectorConfig, OwnTerm};
        let backend = Arc::new(Recorder::default());
        let lease = Duration::from_secs(15);
        let cfg = ElectorConfig::new("e", "pod-a", lease);
        let (state, leading) = watch::channel(LeaderState::new(&cfg, "memory"));
        let registry = Registry::start(
            &CancellationToken::new(),
            Some(backend.clone()),
            Candidate::new("pod-a"),
            (None, Some(leading), watch::channel(None).1),
            lease,
            Duration::from_secs(3),
        )
        .expect("a backend with a registry");
        let calls = || backend.calls.lock().unwrap().clone();
        sleep(Duration::from_secs(1)).await;
        assert_eq!(calls().len(), 1, "written at start");
        state.send_modify(|s| {
            s.own_term = Some(OwnTerm {
                valid_until: tokio::time::Instant::now() + lease,
                fencing_token: 1,
                suspended_at_send: Duration::ZERO,
            })
        });
        sleep(Duration::from_secs(300)).await;
        assert_eq!(calls().len(), 1, "no renewal while leading: {:?}", calls());
        state.send_modify(|s| s.own_term = None);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(calls().len(), 2, "written again at once: {:?}", calls());
        registry.withdraw("pod-a", Duration::from_secs(3)).await;
    }
}
