//! The failsafe rows of the task table: the peer listener (the heartbeat
//! only, on `--peer-addr`) and the member's application for the roster.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info_span;

use super::tasks::{Stop, Task, Tasks};
use super::{RunError, bind, none};
use crate::backend::roster::{Member, RosterStore};
use crate::config::Config;
use crate::elector::Elector;
use crate::failsafe::Failsafe;

/// Failsafe, built: its state and its bound peer listener.
pub(super) type Built = Option<(Arc<Failsafe>, TcpListener)>;

/// Bind the peer listener and build failsafe when `--failsafe` is on; the
/// address published in the roster is the one bound.
///
/// # Errors
/// [`RunError::Backend`] when the backend keeps no roster, [`RunError::Bind`]
/// naming `--peer-addr`, [`RunError::Metrics`] when the peer channel's
/// counters cannot be registered on `registry`.
pub(super) async fn build(
    cfg: &Config,
    roster: Option<Arc<dyn RosterStore>>,
    registry: &prometheus::Registry,
) -> Result<Built, RunError> {
    let Some(fs) = &cfg.failsafe else {
        return Ok(None);
    };
    let roster = roster.ok_or_else(|| {
        RunError::Backend("--failsafe: this backend keeps no failsafe roster".into())
    })?;
    let listener = bind("--peer-addr", fs.peer_addr).await?;
    let addr = listener.local_addr().unwrap_or(fs.peer_addr);
    tracing::info!(peer_addr = %addr, "failsafe on: serving the peer heartbeat");
    let me = Member {
        identity: cfg.elector.identity.clone(),
        peer_addr: addr.to_string(),
    };
    let max_promise = cfg.elector.lease_duration;
    let built = Failsafe::new(
        &cfg.elector.election,
        me,
        fs.keys.clone(),
        roster,
        (max_promise, fs.max_outage),
    );
    built
        .counters()
        .register(registry)
        .map_err(RunError::Metrics)?;
    Ok(Some((Arc::new(built), listener)))
}

/// Spawn the peer listener (stopped with the HTTP listeners, so it answers
/// while the Elector resigns) and the application task, and turn failsafe
/// on in `elector` (`stops`: the shutdown and the HTTP stop tokens).
pub(super) fn spawn(
    cfg: &Config,
    built: Built,
    elector: Elector,
    tasks: &mut Tasks,
    (shutdown, http_stop): (&CancellationToken, &CancellationToken),
) -> Elector {
    let Some((fs, listener)) = built else {
        return elector;
    };
    let (f, stop) = (fs.clone(), http_stop.clone());
    let serve = async move {
        if let Err(e) = f.serve(listener, stop).await {
            tracing::warn!(error = %e, "the failsafe peer listener failed");
        }
    };
    let span = info_span!("failsafe-peer");
    tasks.push(Task::spawn(
        "failsafe-peer",
        Stop::Http,
        Duration::from_secs(1),
        span,
        none(serve),
    ));
    let (f, stop) = (fs.clone(), shutdown.clone());
    let every = cfg.elector.renew_interval;
    let limit = cfg.elector.call_timeout();
    let apply = async move { f.keep_applying(every, limit, stop).await };
    let span = info_span!("failsafe-apply");
    tasks.push(Task::spawn(
        "failsafe-apply",
        Stop::Shutdown,
        limit + Duration::from_secs(1),
        span,
        none(apply),
    ));
    elector.with_failsafe(fs)
}
