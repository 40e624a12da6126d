//! Wiring: build the backend (the one `match` on the backend kind), the
//! metrics, the Elector and the HTTP server; own every task; shut down in the
//! written order: unready → stop claiming → release → drain HTTP → return.

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::backend::LeaseBackend;
use crate::backend::etcd::EtcdBackend;
use crate::backend::redis::RedisBackend;
use crate::config::{BackendConfig, Config};
use crate::elector::Elector;
use crate::http::{AppState, router};
use crate::metrics::Metrics;

/// How long open HTTP requests (long-polls) may take to finish at shutdown.
const HTTP_DRAIN: Duration = Duration::from_secs(1);

/// Errors that stop the sidecar (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The HTTP address could not be bound.
    #[error("cannot listen on --http-addr {addr}")]
    Bind {
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

/// Build the backend chosen at start-up. Never switched while running.
///
/// # Errors
/// [`RunError::Backend`] when the backend settings cannot be used.
pub fn connect(cfg: &BackendConfig) -> Result<Arc<dyn LeaseBackend>, RunError> {
    Ok(match cfg {
        BackendConfig::Etcd { key, options } => EtcdBackend::new(key.clone(), options.clone()),
        BackendConfig::Redis {
            prefix,
            election,
            options,
        } => RedisBackend::new(prefix, election, options.clone()).map_err(RunError::Backend)?,
    })
}

/// Run the sidecar until `shutdown` is cancelled (by a signal, or by the caller).
///
/// # Errors
/// [`RunError`] for failures that make running impossible; backend faults are
/// never errors here.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), RunError> {
    let backend = connect(&cfg.backend)?;
    let metrics = Metrics::new(Registry::new(), &cfg.elector.election, backend.name())
        .map_err(RunError::Metrics)?;
    let listener = TcpListener::bind(cfg.http_addr)
        .await
        .map_err(|source| RunError::Bind {
            addr: cfg.http_addr,
            source,
        })?;
    info!(
        election = %cfg.elector.election,
        identity = %cfg.elector.identity,
        backend = backend.name(),
        http_addr = %cfg.http_addr,
        lease_duration = %humantime::format_duration(cfg.elector.lease_duration),
        renew_interval = %humantime::format_duration(cfg.elector.renew_interval),
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
    let (elector, state) = Elector::new(cfg.elector.clone(), backend, Some(metrics.clone()));
    let span = info_span!("elector", election = %cfg.elector.election);
    let mut elector_task = tokio::spawn(elector.run(shutdown.clone()).instrument(span));

    let http_stop = CancellationToken::new();
    let app = router(AppState {
        state,
        metrics: Some(metrics),
    });
    let stop = http_stop.clone();
    let mut http_task = tokio::spawn(
        async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        }
        .instrument(info_span!("http")),
    );

    let mut signals = tokio::spawn(crate::shutdown::on_signals(shutdown.clone()));

    // Wait for shutdown, or for a task that ended on its own (a bug or a panic).
    tokio::select! {
        _ = shutdown.cancelled() => {}
        r = &mut elector_task => {
            error!(result = ?r, "the elector task ended unexpectedly");
            shutdown.cancel();
        }
        r = &mut http_task => {
            error!(result = ?r, "the HTTP server ended unexpectedly");
            shutdown.cancel();
        }
        r = &mut signals => {
            shutdown.cancel();
            if let Ok(Err(e)) = r {
                return Err(RunError::Signals(e));
            }
        }
    }
    // The Elector stops claiming and resigns under its own call timeout.
    if !elector_task.is_finished() {
        let limit = cfg.elector.call_timeout() + Duration::from_secs(1);
        if tokio::time::timeout(limit, &mut elector_task)
            .await
            .is_err()
        {
            warn!("the elector did not finish resigning in time; the lease will expire by TTL");
            elector_task.abort();
        }
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
    info!("stopped");
    Ok(())
}
