//! The tasks that act on this Pod's own Kubernetes objects beside the
//! election: the Pod labeler and the EndpointSlice writer. Each is a
//! participant of the Elector (the term is released after it lets go), and
//! each is off, said once, in a build without the `kubernetes` feature.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info_span, warn};

use super::none;
use super::tasks::{Stop, Task};
use crate::config::Config;
use crate::elector::{Elector, LeaderState};
use crate::metrics::Metrics;

/// Pod labelling (Kubernetes only): a task, or `None` when it is off.
#[cfg(feature = "kubernetes")]
pub(super) async fn spawn_labeler(
    cfg: &Config,
    elector: &mut Elector,
    state: &tokio::sync::watch::Receiver<LeaderState>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> Option<Task> {
    let Some(lc) = &cfg.labeler else {
        debug!("pod labelling is off (empty --pod-label-key, or POD_NAME/POD_NAMESPACE not set)");
        return None;
    };
    let client = match crate::kube_label::client().await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "pod labelling is off: no Kubernetes client (in-cluster config or KUBECONFIG)");
            return None;
        }
    };
    let acting = elector.add_participant();
    let (lc, state, metrics, shutdown) =
        (lc.clone(), state.clone(), metrics.clone(), shutdown.clone());
    let fut = async move {
        crate::kube_label::check_permissions(&client, &lc).await;
        crate::kube_label::run_labeler(client, lc, state, acting, Some(metrics), shutdown).await
    };
    let limit = crate::kube_label::CALL_TIMEOUT;
    Some(
        Task::spawn(
            "labeler",
            Stop::Shutdown,
            limit,
            info_span!("labeler"),
            none(fut),
        )
        .late("the Pod labeler did not finish in time"),
    )
}

/// Pod labelling needs the `kubernetes` feature: without it, say so once.
#[cfg(not(feature = "kubernetes"))]
pub(super) async fn spawn_labeler(
    cfg: &Config,
    _: &mut Elector,
    _: &tokio::sync::watch::Receiver<LeaderState>,
    _: &Arc<Metrics>,
    _: &CancellationToken,
) -> Option<Task> {
    if cfg.labeler.is_some() {
        warn!("pod labelling is off: this build has no Kubernetes client (the kubernetes feature)");
    }
    None
}

/// The EndpointSlice writer (Kubernetes only): a task, or `None` when it
/// is off (no `--endpointslice-service`).
#[cfg(feature = "kubernetes")]
pub(super) async fn spawn_slice_writer(
    cfg: &Config,
    elector: &mut Elector,
    state: &tokio::sync::watch::Receiver<LeaderState>,
    shutdown: &CancellationToken,
) -> Option<Task> {
    let sc = cfg.endpoint_slice.clone()?;
    let client = match crate::kube_label::client().await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "the EndpointSlice writer is off: no Kubernetes client (in-cluster config or KUBECONFIG)");
            return None;
        }
    };
    let acting = elector.add_participant();
    let (state, shutdown) = (state.clone(), shutdown.clone());
    let fut = async move {
        crate::endpoint_slice::check_permissions(&client, &sc).await;
        crate::endpoint_slice::run_slice_writer(client, sc, state, acting, shutdown).await
    };
    Some(
        Task::spawn(
            "endpointslice",
            Stop::Shutdown,
            crate::kube_label::CALL_TIMEOUT * 2,
            info_span!("endpointslice"),
            none(fut),
        )
        .late("the EndpointSlice writer did not finish in time"),
    )
}

/// The EndpointSlice writer needs the `kubernetes` feature: without it,
/// say so once.
#[cfg(not(feature = "kubernetes"))]
pub(super) async fn spawn_slice_writer(
    cfg: &Config,
    _: &mut Elector,
    _: &tokio::sync::watch::Receiver<LeaderState>,
    _: &CancellationToken,
) -> Option<Task> {
    if cfg.endpoint_slice.is_some() {
        warn!(
            "the EndpointSlice writer is off: this build has no Kubernetes client (the kubernetes feature)"
        );
    }
    None
}
