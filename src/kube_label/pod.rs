//! The labeler's calls to the Kubernetes API (the `kubernetes` feature).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{CALL_TIMEOUT, LabelerConfig};
use crate::elector::LeaderState;
use crate::kube_client::FIELD_MANAGER;
use crate::kube_client::explain::{Doing, explain as explain_call};
use crate::kube_client::review::Reviews;
use crate::metrics::Metrics;

/// `err` of `verb` on pods (or "create events in"), in words, with the fix,
/// and its kind (the metric's `reason`).
fn explain(err: &kube::Error, cfg: &LabelerConfig, verb: &str) -> (String, &'static str) {
    let what = format!("{verb} pods");
    let doing = Doing {
        what: &what,
        namespace: &cfg.namespace,
        forbidden_fix: "add a Role with list, patch on pods (and create on events) bound to them (the Helm chart and manifests/ ship one)",
    };
    let not_found = format!(
        "pod {}/{} not found: POD_NAME and POD_NAMESPACE must come from the Downward API (fieldRef metadata.name / metadata.namespace)",
        cfg.namespace, cfg.pod
    );
    let e = explain_call(err, doing, Some(not_found));
    (e.why, e.kind)
}

/// Set our own Pod's label to `value` (JSON merge patch).
async fn patch_label(
    pods: &Api<Pod>,
    cfg: &LabelerConfig,
    pod: &str,
    value: &str,
) -> Result<(), kube::Error> {
    let patch = json!({ "metadata": { "labels": { cfg.key.as_str(): value } } });
    match timeout(
        CALL_TIMEOUT,
        pods.patch(
            pod,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        ),
    )
    .await
    {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(kube::Error::Service(
            format!("PATCH pod {pod} timed out after {CALL_TIMEOUT:?}").into(),
        )),
    }
}

async fn record_event(client: &Client, cfg: &LabelerConfig, reason: &str, message: String) {
    let events: Api<Event> = Api::namespaced(client.clone(), &cfg.namespace);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", cfg.pod)),
            namespace: Some(cfg.namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(cfg.pod.clone()),
            namespace: Some(cfg.namespace.clone()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message),
        type_: Some("Normal".into()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        reporting_component: Some("leader-elector".into()),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("leader-elector".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match timeout(CALL_TIMEOUT, events.create(&pp, &event)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            let (why, _) = explain(&e, cfg, "create events in");
            debug!(reason, error = %why, "could not record a Kubernetes Event");
        }
        Err(_) => debug!(reason, "recording a Kubernetes Event timed out"),
    }
}

/// The labeler's Kubernetes client: the in-cluster config when present,
/// else KUBECONFIG, built as the Lease backend builds its own.
///
/// # Errors
/// Why no client could be built (no configuration, unreadable kubeconfig).
pub async fn client() -> Result<Client, String> {
    crate::kube_client::connect(None)
        .await
        .map(|c| c.client)
        .map_err(|e| e.to_string())
}

/// Ask once (SelfSubjectAccessReview) whether the labeler may do what it
/// does: patch and list Pods, and create Events (when it records
/// them), in the Pod's namespace. Each missing verb is one warning naming
/// it; labelling never changes who leads, so nothing stops. A review that
/// cannot be made checks nothing (debug).
pub async fn check_permissions(client: &Client, cfg: &LabelerConfig) {
    let mut wanted = vec![("", "pods", "patch"), ("", "pods", "list")];
    if cfg.events {
        wanted.push(("", "events", "create"));
    }
    let missing = match Reviews::default()
        .missing(client, &cfg.namespace, &wanted, CALL_TIMEOUT)
        .await
    {
        Ok(missing) => missing,
        Err(e) => return debug!(error = %e, "cannot review the labeler's permissions"),
    };
    for (_, resource, verb) in missing {
        warn!(
            verb,
            resource,
            namespace = %cfg.namespace,
            "the Pod labeler may not {verb} {resource} in namespace {}: {}",
            cfg.namespace,
            match resource {
                "events" => "transitions are not recorded as Events; add create on events to the Role",
                _ => "the leader label cannot be kept; add list and patch on pods to the Role",
            }
        );
    }
}

/// Keep our Pod's label in step with `state` until `shutdown`, publishing on
/// `acting` the fencing token we label `"true"` for (or `None`).
pub async fn run_labeler(
    client: Client,
    cfg: LabelerConfig,
    mut state: watch::Receiver<LeaderState>,
    acting: watch::Sender<Option<u64>>,
    metrics: Option<std::sync::Arc<Metrics>>,
    shutdown: CancellationToken,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut label = Label::new();
    let mut was_leading = false;
    loop {
        let (leading, token, renewed) = {
            let s = state.borrow_and_update();
            (
                s.is_leader(Instant::now()),
                s.fencing_token,
                s.own_term.map(|t| t.valid_until),
            )
        };
        if leading != was_leading {
            if cfg.events {
                announce(&client, &cfg, leading, token).await;
            }
            was_leading = leading;
        }
        if leading {
            acting.send_replace(token);
        }
        // Reconcile: patch when the wanted value differs from what we set, or
        // (leader) when a renewal happened and the live label drifted.
        let want_patch = label.applied != Some(leading)
            || (leading
                && renewed.is_some()
                && label_drifted(&pods, &cfg, metrics.as_deref()).await);
        if want_patch && label.retry_at.is_none_or(|t| Instant::now() >= t) {
            label
                .patch(&pods, &cfg, leading, &acting, metrics.as_deref())
                .await;
        } else if !leading && label.applied == Some(false) {
            acting.send_replace(None);
        }
        let wait = label
            .retry_at
            .map(|t| t.saturating_duration_since(Instant::now()));
        tokio::select! {
            _ = shutdown.cancelled() => {
                let pod = (&client, &pods, &cfg);
                return leave(pod, was_leading, label.applied, &acting).await;
            }
            r = state.changed() => if r.is_err() { return },
            _ = sleep(wait.unwrap_or(Duration::MAX)), if wait.is_some() => {}
        }
    }
}

/// On shutdown: the last transition gets its Event too, even when shutdown
/// came before the labeler saw the state change; then leave the Service
/// (the Elector waits for `acting` to say `None`).
async fn leave(
    (client, pods, cfg): (&Client, &Api<Pod>, &LabelerConfig),
    was_leading: bool,
    applied: Option<bool>,
    acting: &watch::Sender<Option<u64>>,
) {
    if was_leading && cfg.events {
        announce(client, cfg, false, None).await;
    }
    if applied != Some(false) {
        let _ = patch_label(pods, cfg, &cfg.pod, "false").await;
    }
    acting.send_replace(None);
}

/// Record the Event of a change of our leadership (`BecameLeader` with the
/// fencing token, or `StoppedLeading`).
async fn announce(client: &Client, cfg: &LabelerConfig, leading: bool, token: Option<u64>) {
    let (reason, msg) = if leading {
        (
            "BecameLeader",
            format!(
                "{} became leader (fencing token {})",
                cfg.pod,
                token.unwrap_or(0)
            ),
        )
    } else {
        ("StoppedLeading", format!("{} stopped leading", cfg.pod))
    };
    record_event(client, cfg, reason, msg).await;
}

/// At a renewal of ours: whether our Pod's live label is no longer
/// `"true"` (changed by hand), from one LIST of the Pods labelled `"true"`,
/// which also sets `"false"` on any other Pod found there (a follower
/// labelled by hand, or a dead leader's). A failed read counts as no drift
/// (logged at debug).
async fn label_drifted(pods: &Api<Pod>, cfg: &LabelerConfig, metrics: Option<&Metrics>) -> bool {
    let Some(names) = labelled_true(pods, cfg, false).await else {
        return false;
    };
    let ours = names.contains(&cfg.pod);
    clear(pods, cfg, names, metrics).await;
    if !ours {
        info!(key = %cfg.key, "the leader label was changed by hand; putting it back");
    }
    !ours
}

/// What the labeler believes of our Pod's label, and its retry backoff.
struct Label {
    /// The value we last set: `None` = unknown (patch on the next pass).
    applied: Option<bool>,
    backoff: Duration,
    retry_at: Option<Instant>,
    /// A 403 was already logged at WARN.
    said_forbidden: bool,
}

impl Label {
    fn new() -> Self {
        Label {
            applied: None,
            backoff: Duration::from_millis(200),
            retry_at: None,
            said_forbidden: false,
        }
    }

    /// Set our Pod's label to `leading`; on success clear stale labels of
    /// others (leader) or let go of the term (follower); on failure back off.
    async fn patch(
        &mut self,
        pods: &Api<Pod>,
        cfg: &LabelerConfig,
        leading: bool,
        acting: &watch::Sender<Option<u64>>,
        metrics: Option<&Metrics>,
    ) {
        let value = if leading { "true" } else { "false" };
        match patch_label(pods, cfg, &cfg.pod, value).await {
            Ok(()) => {
                info!(key = %cfg.key, value, pod = %cfg.pod, "labelled our Pod");
                self.applied = Some(leading);
                self.backoff = Duration::from_millis(200);
                self.retry_at = None;
                if let Some(m) = metrics {
                    m.label_patches.inc();
                }
                if leading {
                    clear_stale(pods, cfg, metrics).await;
                } else {
                    acting.send_replace(None);
                }
            }
            Err(e) => {
                let (why, reason) = explain(&e, cfg, "patch");
                let forbidden = reason == "forbidden";
                if forbidden {
                    // A refusal retrying cannot fix: said once, retried
                    // slowly (a Role may be fixed while we run).
                    self.backoff = self.backoff.max(Duration::from_secs(5));
                }
                let retry_in = self.backoff;
                if forbidden && self.said_forbidden {
                    debug!(key = %cfg.key, value, error = %why, ?retry_in, "could not label our Pod (forbidden, said before)");
                } else {
                    warn!(key = %cfg.key, value, error = %why, ?retry_in, "could not label our Pod; leadership is unaffected");
                }
                self.said_forbidden |= forbidden;
                if let Some(m) = metrics {
                    m.label_patch_failures.with_label_values(&[reason]).inc();
                }
                self.applied = None;
                self.retry_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// As the new leader, set `"false"` on other Pods still labelled `"true"`
/// (a leader that died keeps its stale label).
async fn clear_stale(pods: &Api<Pod>, cfg: &LabelerConfig, metrics: Option<&Metrics>) {
    if let Some(names) = labelled_true(pods, cfg, true).await {
        clear(pods, cfg, names, metrics).await;
    }
}

/// The names of the Pods labelled `"true"`; `None` when the LIST failed
/// (a warning when `loud`, else debug).
async fn labelled_true(pods: &Api<Pod>, cfg: &LabelerConfig, loud: bool) -> Option<Vec<String>> {
    let selector = format!("{}=true", cfg.key);
    let why = match timeout(
        CALL_TIMEOUT,
        pods.list(&ListParams::default().labels(&selector)),
    )
    .await
    {
        Ok(Ok(l)) => {
            return Some(
                l.items
                    .into_iter()
                    .filter_map(|p| p.metadata.name)
                    .collect(),
            );
        }
        Ok(Err(e)) => explain(&e, cfg, "list").0,
        Err(_) => "timed out".to_owned(),
    };
    if loud {
        warn!(error = %why, "could not look for stale leader labels");
    } else {
        debug!(error = %why, "could not list the Pods labelled as leader");
    }
    None
}

/// Set `"false"` on each of `names` but our own Pod.
async fn clear(
    pods: &Api<Pod>,
    cfg: &LabelerConfig,
    names: Vec<String>,
    metrics: Option<&Metrics>,
) {
    for name in names.into_iter().filter(|n| *n != cfg.pod) {
        match patch_label(pods, cfg, &name, "false").await {
            Ok(()) => {
                info!(pod = %name, key = %cfg.key, "cleared a leader label that is not the leader's")
            }
            Err(e) => {
                let (why, reason) = explain(&e, cfg, "patch");
                warn!(pod = %name, error = %why, "could not clear a stale leader label");
                if let Some(m) = metrics {
                    m.label_patch_failures.with_label_values(&[reason]).inc();
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
