//! Wiring: [`App::build`] reads the configuration, builds the backend (see
//! [`backends`]) and the metrics and binds the listeners, with nothing
//! spawned; [`App::run`] spawns every task into one table ([`tasks`]) and,
//! at shutdown, stops them in the written order under one budget: unready →
//! stop claiming → release → notify → drain HTTP → return.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

pub mod backends;
mod failsafe_tasks;
mod pod_tasks;
mod shard_tasks;
pub mod tasks;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, info_span, warn};

use crate::backend::registry::Connected;
use crate::config::Config;
use crate::control::{ControlState, control_router};
use crate::coord::http::CoordState;
use crate::coord::{CoordMetrics, Coordinator, Service};
use crate::elector::Elector;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::shards::http::{ShardsState, shards_router};
pub use backends::{Backends, connect};
use tasks::{Stop, Task, Tasks};

/// How long open HTTP requests (long-polls) may take to finish at shutdown.
const HTTP_DRAIN: Duration = Duration::from_secs(1);
/// Timeout of one notification POST, and of delivering the last ones at exit.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the run-mode supervisor may take to finish at shutdown (it has
/// stopped the child already while the Elector drained).
const SUPERVISOR_STOP: Duration = Duration::from_secs(2);
/// How long an aborted task may take to go.
const ABORT_WAIT: Duration = Duration::from_millis(100);

/// Errors that stop the sidecar (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listen address could not be bound.
    #[error(
        "cannot listen on {flag} {addr}\nhint: another process holds this address: choose another {flag}; several sidecars on one host (e.g. with hostNetwork) need distinct --http-addr, --control-addr and (with --failsafe) --peer-addr"
    )]
    Bind {
        /// The flag the address came from (`--http-addr`, `--control-addr`,
        /// `--peer-addr`).
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
    /// A second SIGTERM or SIGINT came during shutdown, later than
    /// [`REPEAT_WINDOW`](crate::shutdown::REPEAT_WINDOW) (500 ms) after the
    /// first: exit at once (code 1) without waiting for the rest of the
    /// shutdown (already logged).
    #[error("second signal ({signal}): exiting at once")]
    SecondSignal {
        /// `SIGTERM` or `SIGINT`.
        signal: &'static str,
    },
}

/// The sidecar, built but not running: configuration read, backend and
/// metrics set up, listeners bound; nothing spawned yet.
pub struct App {
    cfg: Config,
    /// The election backend, its registry and its controls.
    backend: Connected,
    metrics: Arc<Metrics>,
    serving: Serving,
    /// Failsafe and its peer listener (`None`: off).
    failsafe: failsafe_tasks::Built,
}

/// What the two HTTP listeners are built from.
struct Serving {
    listener: TcpListener,
    control_listener: Option<TcpListener>,
    /// The coordination service: for the control API and `run --every`.
    coord: Option<CoordState>,
}

impl App {
    /// Build the backend and the metrics and bind the listeners (a port of
    /// 0 in a flag: the kernel chooses, see [`App::http_addr`]).
    ///
    /// # Errors
    /// [`RunError::Backend`] when the backend settings cannot be used,
    /// [`RunError::Metrics`] when metrics cannot be registered,
    /// [`RunError::Bind`] naming the flag whose address cannot be bound.
    pub async fn build(cfg: Config) -> Result<App, RunError> {
        let (backend, coordinator) = connect(cfg.backend.as_ref())?;
        let registry = Registry::new();
        let metrics = Metrics::new(
            registry.clone(),
            &cfg.elector.election,
            backend.election.name(),
        )
        .map_err(RunError::Metrics)?;
        let failsafe = failsafe_tasks::build(&cfg, backend.roster.clone(), &registry).await?;
        let listener = bind("--http-addr", cfg.http_addr).await?;
        let control_listener = match cfg.control_addr {
            Some(addr) => Some(bind("--control-addr", addr).await?),
            None => None,
        };
        let every = cfg.run.as_ref().is_some_and(|r| r.every.is_some());
        let coord = (control_listener.is_some() || every)
            .then(|| coord_state(&cfg, coordinator, &registry));
        Ok(App {
            cfg,
            backend,
            metrics,
            failsafe,
            serving: Serving {
                listener,
                control_listener,
                coord,
            },
        })
    }

    /// The bound address of the read-only API (`--http-addr`).
    pub fn http_addr(&self) -> SocketAddr {
        (self.serving.listener.local_addr()).unwrap_or(self.cfg.http_addr)
    }

    /// The bound address of the control API (`--control-addr`), `None` when off.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        (self.serving.control_listener.as_ref()).and_then(|l| l.local_addr().ok())
    }

    /// Run until `shutdown` is cancelled (by a signal, or by the caller) or a
    /// critical task (the Elector, the read API) ends on its own; then stop
    /// every task under one budget.
    ///
    /// # Errors
    /// [`RunError::Signals`] when signal handlers cannot be installed,
    /// [`RunError::SecondSignal`] when a second signal cut the shutdown
    /// short; backend faults are never errors here.
    /// Returns the exit code to use when run mode ended because of the child
    /// (`--on-child-exit exit`), else `None` (exit 0).
    pub async fn run(self, shutdown: CancellationToken) -> Result<Option<i32>, RunError> {
        self.log_start();
        let http_stop = CancellationToken::new();
        let tasks = self.spawn(&shutdown, &http_stop).await;
        let mut tasks = tasks;
        let mut signals = tokio::spawn(crate::shutdown::on_signals(shutdown.clone()));
        tokio::select! {
            biased;
            () = tasks.until_shutdown(&shutdown) => {}
            r = &mut signals => {
                shutdown.cancel();
                return Err(signal_end(r));
            }
        }
        // The Elector stops claiming, drains if configured (run mode: until
        // the child is gone), and resigns; then the other rows in order.
        let exit_code = tokio::select! {
            code = tasks.stop(&http_stop) => code,
            r = &mut signals => return Err(signal_end(r)),
        };
        signals.abort();
        info!("stopped");
        Ok(exit_code)
    }

    /// The "starting" line, with the bound addresses (for a port of 0 in a
    /// flag, the one the kernel chose: tests and scripts read it from this
    /// line instead of probing for a port).
    fn log_start(&self) {
        let cfg = &self.cfg;
        info!(
            election = %cfg.elector.election,
            identity = %cfg.elector.identity,
            backend = self.backend.election.name(),
            http_addr = %self.http_addr(),
            control_addr = %self.control_addr().map(|a| a.to_string()).unwrap_or_default(),
            // Whole milliseconds: a third of 5s is 1s 666ms, not 1s 666ms 666us 666ns.
            lease_duration = %crate::flags::format_duration(whole_ms(cfg.elector.lease_duration)),
            renew_interval = %crate::flags::format_duration(whole_ms(cfg.elector.renew_interval)),
            "starting"
        );
    }

    /// Spawn every task into the table, in shutdown order.
    async fn spawn(self, shutdown: &CancellationToken, http_stop: &CancellationToken) -> Tasks {
        let cfg = &self.cfg;
        let observer: Option<Arc<dyn crate::elector::Observer>> = Some(self.metrics.clone());
        let (elector, state) = Elector::connected(cfg.elector.clone(), &self.backend, observer);
        let handle = elector.handle();
        let mut tasks = Tasks::default();
        let stops = (shutdown, http_stop);
        let elector = failsafe_tasks::spawn(cfg, self.failsafe, elector, &mut tasks, stops);
        let (mut elector, health, notify, gate) = hook_rows(cfg, elector, shutdown);
        let (keeper, shards) =
            shard_tasks::spawn_keeper(cfg, self.backend.shards.clone(), gate, shutdown);
        let labeler =
            pod_tasks::spawn_labeler(cfg, &mut elector, &state, &self.metrics, shutdown).await;
        let slice_writer = pod_tasks::spawn_slice_writer(cfg, &mut elector, &state, shutdown).await;
        tasks.push(elector_task(cfg, elector, shutdown));
        tasks.push_opt(keeper);
        tasks.push_opt(labeler);
        tasks.push_opt(slice_writer);
        let service = self.serving.coord.as_ref().map(|c| c.service.clone());
        tasks.push_opt(cfg.run.clone().map(|opts| {
            let fut = run_mode(cfg, opts, service, &state, &handle, shutdown);
            Task::spawn(
                "run",
                Stop::Shutdown,
                SUPERVISOR_STOP,
                info_span!("run"),
                fut,
            )
            .late("the run-mode supervisor did not finish in time")
            .failed("the run-mode supervisor failed")
        }));
        tasks.push_opt(notify);
        tasks.push_opt(health);
        let app_state = AppState {
            state: state.clone(),
            metrics: Some(self.metrics),
        };
        let control = ControlState {
            handle,
            state,
            resign_cooldown: cfg.resign_cooldown,
            coord: None,
        };
        let (http, control) = self
            .serving
            .spawn(cfg, (app_state, shards), control, http_stop);
        tasks.push(http);
        tasks.push_opt(control);
        tasks
    }
}

impl Serving {
    /// The read API's row and the control API's (`None` when off).
    fn spawn(
        self,
        cfg: &Config,
        (app_state, shards): (AppState, ShardsState),
        mut control: ControlState,
        http_stop: &CancellationToken,
    ) -> (Task, Option<Task>) {
        let control = self
            .control_listener
            .zip(self.coord)
            .map(|(listener, coord)| {
                let service = coord.service.clone();
                let limit = HTTP_DRAIN + service.close_limit();
                control.coord = Some(coord);
                let router = control_router(control);
                let served = serve(listener, "--control-addr", router, false, cfg, http_stop);
                // Once no request is served, wait for the coordination backend's
                // off-path work (etcd: lease revokes after releases), at most one
                // call deadline.
                let fut = async move {
                    let out = served.await;
                    service.close().await;
                    out
                };
                let span = info_span!("control");
                Task::spawn("control", Stop::Http, limit, span, fut)
            });
        let router = router(app_state).merge(shards_router(shards));
        let http = serve(self.listener, "--http-addr", router, true, cfg, http_stop);
        let http = Task::spawn("http", Stop::Http, HTTP_DRAIN, info_span!("http"), http)
            .critical("the HTTP server ended unexpectedly")
            .late("open HTTP requests did not finish within 1s; closing them");
        (http, control)
    }
}

/// Run mode's task: the command once per period with `--every` (over the
/// coordination service), else while leading.
/// The elector's row: critical, and given its call timeout plus its drain
/// to resign at the stop.
fn elector_task(cfg: &Config, elector: Elector, shutdown: &CancellationToken) -> Task {
    let limit = cfg.elector.call_timeout()
        + cfg.elector.drain_timeout.unwrap_or_default()
        + Duration::from_secs(1);
    let span = info_span!("elector", election = %cfg.elector.election);
    Task::spawn(
        "elector",
        Stop::Shutdown,
        limit,
        span,
        none(elector.run(shutdown.clone())),
    )
    .critical("the elector task ended unexpectedly")
    .late("the elector did not finish resigning in time; the lease will expire by TTL")
}

fn run_mode(
    cfg: &Config,
    opts: crate::config::RunOptions,
    service: Option<Arc<Service>>,
    state: &tokio::sync::watch::Receiver<crate::elector::LeaderState>,
    handle: &crate::elector::ElectorHandle,
    shutdown: &CancellationToken,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = tasks::TaskOutput> + Send>> {
    match (opts.every, service) {
        (Some(every), Some(service)) => {
            let every = crate::supervisor::Every {
                opts,
                every,
                service,
                name: cfg.elector.election.clone(),
                identity: cfg.elector.identity.clone(),
                retention: cfg.completed_retention,
            };
            Box::pin(crate::supervisor::run_every(every, shutdown.clone()))
        }
        _ => Box::pin(crate::supervisor::supervise(
            opts,
            state.clone(),
            handle.clone(),
            shutdown.clone(),
        )),
    }
}

/// Build the sidecar and run it until `shutdown` is cancelled: [`App::build`]
/// then [`App::run`].
///
/// # Errors
/// [`RunError`] for failures that make running impossible; backend faults are
/// never errors here.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<Option<i32>, RunError> {
    App::build(cfg).await?.run(shutdown).await
}

/// Bind `addr`, naming `flag` in the error.
async fn bind(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Bind { flag, addr, source })
}

/// What the end of the signal task means: a second signal, or no handlers.
fn signal_end(r: Result<std::io::Result<&'static str>, tokio::task::JoinError>) -> RunError {
    match r {
        Ok(Ok(signal)) => RunError::SecondSignal { signal },
        Ok(Err(e)) => RunError::Signals(e),
        Err(e) => RunError::Signals(std::io::Error::other(e)),
    }
}

/// A task that asks for no exit code.
pub(super) async fn none(fut: impl std::future::Future<Output = ()>) -> tasks::TaskOutput {
    fut.await;
    None
}

/// The hooks' rows: health-gated candidacy (aborted at shutdown) and
/// transition notifications (end when the Elector is gone).
fn hook_rows(
    cfg: &Config,
    mut elector: Elector,
    shutdown: &CancellationToken,
) -> (Elector, Option<Task>, Option<Task>, Option<Gate>) {
    let (mut health, mut gate) = (None, None);
    if let Some((url, interval)) = &cfg.candidate_health {
        let (gate_tx, gate_rx) = tokio::sync::watch::channel(false);
        gate = Some(gate_rx.clone());
        elector = elector.with_candidacy(gate_rx);
        let fut = crate::hooks::health_checker(url.clone(), *interval, gate_tx, shutdown.clone());
        let span = info_span!("health");
        health = Some(Task::spawn(
            "health",
            Stop::Abort,
            ABORT_WAIT,
            span,
            none(fut),
        ));
    }
    let notify = cfg.notify_url.as_ref().map(|url| {
        let fut = crate::hooks::notifier(url.clone(), elector.events(), NOTIFY_TIMEOUT);
        Task::spawn(
            "notify",
            Stop::Shutdown,
            NOTIFY_TIMEOUT,
            info_span!("notify"),
            none(fut),
        )
        .late("pending notifications were not delivered before exit")
    });
    (elector, health, notify, gate)
}

/// The candidacy gate of `--candidate-health-url` (`true`: ready).
type Gate = tokio::sync::watch::Receiver<bool>;

/// The coordination service of the control API.
fn coord_state(cfg: &Config, coordinator: Box<dyn Coordinator>, registry: &Registry) -> CoordState {
    let metrics = CoordMetrics::new(registry)
        .map_err(|e| warn!(error = %e, "coordination metrics are off"))
        .ok();
    let service = Service::new(coordinator, metrics, cfg.elector.identity.clone())
        .with_max_waiters(cfg.coord_max_waiters);
    CoordState {
        service: Arc::new(service),
        completed_retention: cfg.completed_retention,
    }
}

/// Serve `router` on `listener` until `stop`.
fn serve(
    listener: TcpListener,
    flag: &'static str,
    router: axum::Router,
    healthz: bool,
    cfg: &Config,
    stop: &CancellationToken,
) -> impl std::future::Future<Output = tasks::TaskOutput> + use<> {
    let l = crate::serve::Listener {
        listener,
        flag,
        router,
        healthz,
        limits: cfg.limits,
    };
    none(crate::serve::serve(l, stop.clone()))
}

/// A duration truncated to whole milliseconds, for logs.
fn whole_ms(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
#[path = "app_tests.rs"]
mod tests;
