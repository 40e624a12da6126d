//! Wiring: build the backend (the one `match` on the backend kind), the
//! metrics, the Elector and the HTTP server; own every task; shut down in the
//! written order: unready → stop claiming → release → drain HTTP → return.

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::backend::LeaseBackend;
use crate::backend::etcd::EtcdBackend;
use crate::backend::kubernetes::{KubeCoord, KubeLeaseBackend};
use crate::backend::redis::RedisBackend;
use crate::config::{BackendConfig, Config};
use crate::control::{ControlState, control_router};
use crate::coord::etcd::EtcdCoord;
use crate::coord::http::CoordState;
use crate::coord::redis::RedisCoord;
use crate::coord::{CoordMetrics, Coordinator, Service};
use crate::elector::Elector;
use crate::http::{AppState, router};
use crate::metrics::Metrics;

/// How long open HTTP requests (long-polls) may take to finish at shutdown.
const HTTP_DRAIN: Duration = Duration::from_secs(1);
/// Timeout of one notification POST, and of delivering the last ones at exit.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors that stop the sidecar (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listen address could not be bound.
    #[error(
        "cannot listen on {flag} {addr}\nhint: another process holds this address; several sidecars on one host (e.g. with hostNetwork) need distinct --http-addr and --control-addr"
    )]
    Bind {
        /// The flag the address came from (`--http-addr`, `--control-addr`).
        flag: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Metrics could not be registered.
    #[error("cannot register metrics")]
    Metrics(#[source] prometheus::Error),
    /// The backend settings cannot be used.
    #[error("cannot set up the backend: {0}")]
    Backend(String),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
}

/// The election backend and the coordination API over the same connection.
pub type Backends = (Arc<dyn LeaseBackend>, Box<dyn Coordinator>);

/// Build the backend chosen at start-up. Never switched while running.
///
/// # Errors
/// [`RunError::Backend`] when the backend settings cannot be used.
/// Also returns the coordination API over the same connection.
pub fn connect(cfg: &BackendConfig) -> Result<Backends, RunError> {
    Ok(match cfg {
        BackendConfig::Etcd {
            key,
            prefix,
            options,
        } => {
            let backend = EtcdBackend::new(key.clone(), options.clone());
            // Coordination calls are not on the election's renew path: the
            // election's call timeout, but at least the coordination default.
            let coord = Box::new(
                EtcdCoord::new(backend.clone(), prefix).with_deadline(
                    options
                        .connect_timeout
                        .max(crate::coord::etcd::DEFAULT_DEADLINE),
                ),
            );
            (backend, coord)
        }
        BackendConfig::Redis {
            prefix,
            election,
            options,
        } => {
            let backend =
                RedisBackend::new(prefix, election, options.clone()).map_err(RunError::Backend)?;
            let coord = Box::new(RedisCoord::new(backend.clone()));
            (backend, coord)
        }
        BackendConfig::Kubernetes { name, options } => (
            KubeLeaseBackend::new(name.clone(), options.clone()),
            Box::new(KubeCoord),
        ),
    })
}

/// Run the sidecar until `shutdown` is cancelled (by a signal, or by the caller).
///
/// # Errors
/// [`RunError`] for failures that make running impossible; backend faults are
/// never errors here.
/// Returns the exit code to use when run mode ended because of the child
/// (`--on-child-exit exit`), else `None` (exit 0).
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<Option<i32>, RunError> {
    let (backend, coordinator) = connect(&cfg.backend)?;
    let registry = Registry::new();
    let metrics = Metrics::new(registry.clone(), &cfg.elector.election, backend.name())
        .map_err(RunError::Metrics)?;
    let listener = TcpListener::bind(cfg.http_addr)
        .await
        .map_err(|source| RunError::Bind {
            flag: "--http-addr",
            addr: cfg.http_addr,
            source,
        })?;
    let control_listener = match cfg.control_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::Bind {
                    flag: "--control-addr",
                    addr,
                    source,
                })?,
        ),
        None => None,
    };
    // The bound addresses: for a port of 0 in a flag, the one the kernel chose
    // (tests and scripts read it from this line instead of probing for a port).
    let http_bound = listener.local_addr().map_or(cfg.http_addr, |a| a);
    let control_bound = control_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(
        election = %cfg.elector.election,
        identity = %cfg.elector.identity,
        backend = backend.name(),
        http_addr = %http_bound,
        control_addr = %control_bound,
        // Whole milliseconds: a third of 5s is 1s 666ms, not 1s 666ms 666us 666ns.
        lease_duration = %humantime::format_duration(whole_ms(cfg.elector.lease_duration)),
        renew_interval = %humantime::format_duration(whole_ms(cfg.elector.renew_interval)),
        "starting"
    );
    if let BackendConfig::Redis { options, .. } = &cfg.backend {
        let n = options.urls.len();
        if n > 1 && n % 2 == 0 {
            warn!(
                servers = n,
                quorum = n / 2 + 1,
                "an even number of Redlock servers tolerates no more failures than one server fewer; use an odd number (3 or 5)"
            );
        }
    }
    let (mut elector, state) = Elector::new(cfg.elector.clone(), backend, Some(metrics.clone()));
    let handle = elector.handle();

    // Health-gated candidacy.
    let mut health_task = None;
    if let Some((url, interval)) = &cfg.candidate_health {
        let (gate_tx, gate_rx) = tokio::sync::watch::channel(false);
        elector = elector.with_candidacy(gate_rx);
        health_task = Some(tokio::spawn(
            crate::hooks::health_checker(url.clone(), *interval, gate_tx, shutdown.clone())
                .instrument(info_span!("health")),
        ));
    }
    // Transition notifications; ends when the Elector is gone.
    let notify_task = cfg.notify_url.as_ref().map(|url| {
        tokio::spawn(
            crate::hooks::notifier(url.clone(), elector.events(), NOTIFY_TIMEOUT)
                .instrument(info_span!("notify")),
        )
    });
    // Pod labelling (Kubernetes only).
    let mut labeler_task = None;
    match &cfg.labeler {
        Some(lc) => match kube::Client::try_default().await {
            Ok(client) => {
                let acting = elector.add_participant();
                labeler_task = Some(tokio::spawn(
                    crate::kube_label::run_labeler(
                        client,
                        lc.clone(),
                        state.clone(),
                        acting,
                        Some(metrics.clone()),
                        shutdown.clone(),
                    )
                    .instrument(info_span!("labeler")),
                ));
            }
            Err(e) => {
                warn!(error = %e, "pod labelling is off: no Kubernetes client (in-cluster config or KUBECONFIG)")
            }
        },
        None => debug!(
            "pod labelling is off (empty --pod-label-key, or POD_NAME/POD_NAMESPACE not set)"
        ),
    }
    let span = info_span!("elector", election = %cfg.elector.election);
    let mut elector_task = tokio::spawn(elector.run(shutdown.clone()).instrument(span));

    // Run mode.
    let supervisor_task = cfg.run.clone().map(|opts| {
        tokio::spawn(
            crate::supervisor::supervise(opts, state.clone(), handle.clone(), shutdown.clone())
                .instrument(info_span!("run")),
        )
    });

    let http_stop = CancellationToken::new();
    let control_task = control_listener.map(|listener| {
        let coord = CoordState {
            service: Arc::new(
                Service::new(
                    coordinator,
                    CoordMetrics::new(&registry)
                        .map_err(|e| warn!(error = %e, "coordination metrics are off"))
                        .ok(),
                    cfg.elector.identity.clone(),
                )
                .with_max_waiters(cfg.coord_max_waiters),
            ),
            completed_retention: cfg.completed_retention,
        };
        let app = control_router(ControlState {
            handle: handle.clone(),
            state: state.clone(),
            resign_cooldown: cfg.resign_cooldown,
            coord: Some(coord),
        });
        tokio::spawn(
            crate::serve::serve(
                crate::serve::Listener {
                    listener,
                    flag: "--control-addr",
                    router: app,
                    healthz: false,
                    limits: cfg.limits,
                },
                http_stop.clone(),
            )
            .instrument(info_span!("control")),
        )
    });
    let app = router(AppState {
        state,
        metrics: Some(metrics),
    });
    let mut http_task = tokio::spawn(
        crate::serve::serve(
            crate::serve::Listener {
                listener,
                flag: "--http-addr",
                router: app,
                healthz: true,
                limits: cfg.limits,
            },
            http_stop.clone(),
        )
        .instrument(info_span!("http")),
    );

    let mut signals = tokio::spawn(crate::shutdown::on_signals(shutdown.clone()));

    // Wait for shutdown, or for a task that ended on its own (a bug or a panic).
    match wait_for_shutdown(&shutdown, &mut elector_task, &mut http_task, &mut signals).await {
        Woke::Shutdown => {}
        Woke::ElectorEnded(r) => {
            error!(result = ?r, "the elector task ended unexpectedly");
            shutdown.cancel();
        }
        Woke::HttpEnded(r) => {
            error!(result = ?r, "the HTTP server ended unexpectedly");
            shutdown.cancel();
        }
        Woke::Signals(r) => {
            shutdown.cancel();
            if let Ok(Err(e)) = r {
                return Err(RunError::Signals(e));
            }
        }
    }
    // The Elector stops claiming, drains if configured (run mode: until the
    // child is gone), and resigns under its own call timeout.
    if !elector_task.is_finished() {
        let limit = cfg.elector.call_timeout()
            + cfg.elector.drain_timeout.unwrap_or_default()
            + Duration::from_secs(1);
        if tokio::time::timeout(limit, &mut elector_task)
            .await
            .is_err()
        {
            warn!("the elector did not finish resigning in time; the lease will expire by TTL");
            elector_task.abort();
        }
    }
    if let Some(task) = labeler_task
        && tokio::time::timeout(crate::kube_label::CALL_TIMEOUT, task)
            .await
            .is_err()
    {
        warn!("the Pod labeler did not finish in time");
    }
    let mut exit_code = None;
    if let Some(task) = supervisor_task {
        match tokio::time::timeout(Duration::from_secs(2), task).await {
            Ok(Ok(code)) => exit_code = code,
            Ok(Err(e)) => error!(error = %e, "the run-mode supervisor failed"),
            Err(_) => warn!("the run-mode supervisor did not finish in time"),
        }
    }
    if let Some(task) = notify_task {
        // Deliver the last transitions (e.g. "stopped_leading"), briefly.
        if tokio::time::timeout(NOTIFY_TIMEOUT, task).await.is_err() {
            warn!("pending notifications were not delivered before exit");
        }
    }
    if let Some(task) = health_task {
        task.abort();
    }
    http_stop.cancel();
    if !http_task.is_finished()
        && tokio::time::timeout(HTTP_DRAIN, &mut http_task)
            .await
            .is_err()
    {
        warn!("open HTTP requests did not finish within {HTTP_DRAIN:?}; closing them");
        http_task.abort();
    }
    if let Some(task) = control_task {
        let _ = tokio::time::timeout(HTTP_DRAIN, task).await;
    }
    info!("stopped");
    Ok(exit_code)
}

/// A duration truncated to whole milliseconds, for logs.
fn whole_ms(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis() as u64)
}

/// What ended [`wait_for_shutdown`].
#[derive(Debug)]
enum Woke {
    /// Shutdown was requested (a signal, or the caller).
    Shutdown,
    /// The Elector ended although no shutdown was requested (a bug or a panic).
    ElectorEnded(Result<(), tokio::task::JoinError>),
    /// The read listener ended on its own.
    HttpEnded(Result<(), tokio::task::JoinError>),
    /// The signal task ended (it only returns when it cannot install handlers).
    Signals(Result<std::io::Result<()>, tokio::task::JoinError>),
}

/// Wait for shutdown or for a task that ended on its own. A task that ends
/// *because* shutdown was requested is not unexpected: the token is checked
/// first (`biased`), and again when a task wins the race, since the Elector
/// may finish in the same poll as the signal task cancels the token.
async fn wait_for_shutdown(
    shutdown: &CancellationToken,
    elector_task: &mut tokio::task::JoinHandle<()>,
    http_task: &mut tokio::task::JoinHandle<()>,
    signals: &mut tokio::task::JoinHandle<std::io::Result<()>>,
) -> Woke {
    let woke = tokio::select! {
        biased;
        _ = shutdown.cancelled() => Woke::Shutdown,
        r = &mut *elector_task => Woke::ElectorEnded(r),
        r = &mut *http_task => Woke::HttpEnded(r),
        r = &mut *signals => Woke::Signals(r),
    };
    match woke {
        Woke::ElectorEnded(Ok(())) | Woke::HttpEnded(Ok(())) if shutdown.is_cancelled() => {
            Woke::Shutdown
        }
        w => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race of issue 13: the Elector ends cleanly right as shutdown is
    /// requested. Before the fix, an unbiased `select!` picked the Elector's
    /// branch about half the time and logged an ERROR.
    #[tokio::test]
    async fn a_clean_shutdown_is_not_an_unexpected_end() {
        for _ in 0..32 {
            let shutdown = CancellationToken::new();
            let mut elector = tokio::spawn(async {});
            let mut http = tokio::spawn(std::future::pending::<()>());
            let mut signals = tokio::spawn(std::future::pending::<std::io::Result<()>>());
            tokio::task::yield_now().await;
            shutdown.cancel();
            while !elector.is_finished() {
                tokio::task::yield_now().await;
            }
            let woke = wait_for_shutdown(&shutdown, &mut elector, &mut http, &mut signals).await;
            assert!(matches!(woke, Woke::Shutdown), "{woke:?}");
            http.abort();
            signals.abort();
        }
    }

    #[tokio::test]
    async fn an_elector_that_ends_on_its_own_is_reported() {
        let shutdown = CancellationToken::new();
        let mut elector = tokio::spawn(async {});
        let mut http = tokio::spawn(std::future::pending::<()>());
        let mut signals = tokio::spawn(std::future::pending::<std::io::Result<()>>());
        let woke = wait_for_shutdown(&shutdown, &mut elector, &mut http, &mut signals).await;
        assert!(matches!(woke, Woke::ElectorEnded(Ok(()))), "{woke:?}");
    }
}
