//! The EndpointSlice writer's calls to the Kubernetes API (the `kubernetes`
//! feature): read the Service's ports, write or empty the slice by
//! compare-and-swap, and follow the leadership state.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{SliceConfig, names_only, slice_body, slice_ports};
use crate::elector::LeaderState;
use crate::kube_client::FIELD_MANAGER;
use crate::kube_client::explain::{Doing, explain};
use crate::kube_client::review::Reviews;
use crate::kube_label::CALL_TIMEOUT;

/// Compare-and-swap attempts of one write before backing off.
const CAS_ATTEMPTS: usize = 3;

/// Why a write failed, for the log and the backoff.
#[derive(Debug)]
struct Failure {
    why: String,
    forbidden: bool,
}

fn failure(e: &kube::Error, cfg: &SliceConfig, what: &str) -> Failure {
    let doing = Doing {
        what,
        namespace: &cfg.namespace,
        forbidden_fix: "the Role needs get, list, create, update, patch, delete on endpointslices (discovery.k8s.io) and get on services (the Helm chart grants them with endpointSlice.service set)",
    };
    let not_found = what.contains("service").then(|| {
        format!(
            "Service {}/{} not found: create the selector-less Service first (--endpointslice-service names it)",
            cfg.namespace, cfg.service
        )
    });
    let e = explain(e, doing, not_found);
    Failure {
        forbidden: e.kind == "forbidden",
        why: e.why,
    }
}

fn params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

async fn bounded<T>(
    what: &str,
    f: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("{what} timed out after {CALL_TIMEOUT:?}").into(),
        )),
    }
}

/// The writer's calls and what it knows of the slice.
struct Writer {
    slices: Api<EndpointSlice>,
    services: Api<Service>,
    cfg: SliceConfig,
    /// The fencing token our address is in the slice for (`None`: not
    /// named, as far as we know).
    named_for: Option<u64>,
    /// Whether the slice may name us without our knowing (start-up, a
    /// failed write).
    unsure: bool,
}

impl Writer {
    /// Name this Pod alone in the slice (create it if missing), by
    /// compare-and-swap on what was read.
    async fn show(&mut self, token: Option<u64>) -> Result<(), Failure> {
        let svc = bounded("GET service", self.services.get(&self.cfg.service))
            .await
            .map_err(|e| failure(&e, &self.cfg, "get services"))?;
        let svc = serde_json::to_value(&svc).unwrap_or_default();
        let ports = slice_ports(&svc).map_err(|why| Failure {
            why,
            forbidden: false,
        })?;
        let uid = svc["metadata"]["uid"].as_str().unwrap_or("").to_owned();
        let body = slice_body(&self.cfg, &uid, &ports, true);
        self.unsure = true;
        self.write(body).await?;
        self.named_for = Some(token.unwrap_or(0));
        self.unsure = false;
        Ok(())
    }

    /// Empty the slice if it names this Pod (a compare-and-swap on what
    /// was read: another leader's newer write is left alone).
    async fn hide(&mut self) -> Result<(), Failure> {
        let name = self.cfg.slice_name();
        let cur = bounded("GET endpointslice", self.slices.get_opt(&name))
            .await
            .map_err(|e| failure(&e, &self.cfg, "get endpointslices"))?;
        if let Some(cur) = cur {
            let cur = serde_json::to_value(&cur).unwrap_or_default();
            if super::named_addresses(&cur).contains(&self.cfg.pod_ip.to_string()) {
                let mut body = cur.clone();
                body["endpoints"] = serde_json::json!([]);
                self.write_over(body, &cur).await?;
            }
        }
        self.named_for = None;
        self.unsure = false;
        Ok(())
    }

    /// Create `body`, or replace the stored slice with it, by
    /// compare-and-swap (re-read on a conflict, [`CAS_ATTEMPTS`] times).
    async fn write(&self, body: serde_json::Value) -> Result<(), Failure> {
        let name = self.cfg.slice_name();
        for _ in 0..CAS_ATTEMPTS {
            let cur = bounded("GET endpointslice", self.slices.get_opt(&name))
                .await
                .map_err(|e| failure(&e, &self.cfg, "get endpointslices"))?;
            let r = match cur {
                None => {
                    let obj: EndpointSlice =
                        serde_json::from_value(body.clone()).expect("a valid EndpointSlice");
                    bounded("POST endpointslice", self.slices.create(&params(), &obj)).await
                }
                Some(cur) => {
                    let cur = serde_json::to_value(&cur).unwrap_or_default();
                    match self.write_over(body.clone(), &cur).await {
                        Ok(()) => return Ok(()),
                        Err(f) if f.why.contains("409") => continue,
                        Err(f) => return Err(f),
                    }
                }
            };
            match r {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(failure(&e, &self.cfg, "create endpointslices")),
            }
        }
        Err(Failure {
            why: format!(
                "the EndpointSlice {name} kept changing under us (409 {CAS_ATTEMPTS} times)"
            ),
            forbidden: false,
        })
    }

    /// Replace `cur` (as read) with `body`, conditional on `cur`'s version.
    async fn write_over(
        &self,
        mut body: serde_json::Value,
        cur: &serde_json::Value,
    ) -> Result<(), Failure> {
        body["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
        let obj: EndpointSlice = serde_json::from_value(body).expect("a valid EndpointSlice");
        let name = self.cfg.slice_name();
        bounded(
            "PUT endpointslice",
            self.slices.replace(&name, &params(), &obj),
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 409 => Failure {
                why: format!("409 {}", s.message),
                forbidden: false,
            },
            e => failure(&e, &self.cfg, "update endpointslices"),
        })
    }

    /// Whether the stored slice no longer names this Pod alone (edited by
    /// hand); a failed read counts as no drift.
    async fn drifted(&self) -> bool {
        let name = self.cfg.slice_name();
        match bounded("GET endpointslice", self.slices.get_opt(&name)).await {
            Ok(Some(cur)) => {
                let cur = serde_json::to_value(&cur).unwrap_or_default();
                !names_only(&self.cfg, &cur)
            }
            Ok(None) => true,
            Err(e) => {
                debug!(error = %failure(&e, &self.cfg, "get endpointslices").why, "could not check the EndpointSlice");
                false
            }
        }
    }
}

/// Ask once (SelfSubjectAccessReview) whether the writer may do what it
/// does; each missing verb is one warning naming it.
pub async fn check_permissions(client: &Client, cfg: &SliceConfig) {
    let mut wanted = vec![("", "services", "get")];
    for verb in ["get", "create", "update"] {
        wanted.push(("discovery.k8s.io", "endpointslices", verb));
    }
    let missing = match Reviews::default()
        .missing(client, &cfg.namespace, &wanted, CALL_TIMEOUT)
        .await
    {
        Ok(missing) => missing,
        Err(e) => return debug!(error = %e, "cannot review the EndpointSlice writer's permissions"),
    };
    for (_, resource, verb) in missing {
        warn!(
            verb,
            resource,
            "the EndpointSlice writer may not {verb} {resource} in namespace {}: the Service {} will not reach the leader; add it to the Role",
            cfg.namespace,
            cfg.service
        );
    }
}

/// Keep the slice in step with `state` until `shutdown`, publishing on
/// `acting` the fencing token our address is in the slice for (or `None`).
pub async fn run_slice_writer(
    client: Client,
    cfg: SliceConfig,
    mut state: watch::Receiver<LeaderState>,
    acting: watch::Sender<Option<u64>>,
    shutdown: CancellationToken,
) {
    let mut w = Writer {
        slices: Api::namespaced(client.clone(), &cfg.namespace),
        services: Api::namespaced(client, &cfg.namespace),
        cfg,
        named_for: None,
        unsure: false,
    };
    let mut retry = Retry::new();
    loop {
        let (leading, token, renewed) = {
            let s = state.borrow_and_update();
            let leading = s.is_leader(Instant::now());
            (leading, s.fencing_token, s.own_term.map(|t| t.valid_until))
        };
        if retry.due() {
            let r = step(&mut w, leading, token, renewed.is_some()).await;
            retry.after(r, &w.cfg);
        }
        acting.send_replace(w.named_for.or(token.filter(|_| w.unsure)));
        let wait = retry
            .at
            .map(|t| t.saturating_duration_since(Instant::now()));
        tokio::select! {
            _ = shutdown.cancelled() => break,
            r = state.changed() => if r.is_err() { break },
            _ = sleep(wait.unwrap_or(Duration::MAX)), if wait.is_some() => {}
        }
    }
    if (w.named_for.is_some() || w.unsure)
        && let Err(f) = w.hide().await
    {
        warn!(error = %f.why, "could not take our address out of the EndpointSlice at shutdown");
    }
    acting.send_replace(None);
}

/// One reconciliation: show while leading (and again after a hand edit, at
/// a renewal), hide otherwise.
async fn step(
    w: &mut Writer,
    leading: bool,
    token: Option<u64>,
    renewed: bool,
) -> Result<(), Failure> {
    if leading {
        if w.named_for != token || (renewed && w.drifted().await) {
            w.show(token).await?;
            info!(slice = %w.cfg.slice_name(), address = %w.cfg.pod_ip, "the EndpointSlice names this Pod");
        }
    } else if w.named_for.is_some() || w.unsure {
        w.hide().await?;
        info!(slice = %w.cfg.slice_name(), "took this Pod out of the EndpointSlice");
    }
    Ok(())
}

/// Backoff of failed writes: a refusal retrying cannot fix is said once
/// and retried slowly (a Role may be fixed while we run).
struct Retry {
    backoff: Duration,
    at: Option<Instant>,
    said_forbidden: bool,
}

impl Retry {
    fn new() -> Retry {
        Retry {
            backoff: Duration::from_millis(200),
            at: None,
            said_forbidden: false,
        }
    }

    fn due(&self) -> bool {
        self.at.is_none_or(|t| Instant::now() >= t)
    }

    fn after(&mut self, r: Result<(), Failure>, cfg: &SliceConfig) {
        let Err(f) = r else {
            self.backoff = Duration::from_millis(200);
            self.at = None;
            return;
        };
        if f.forbidden {
            self.backoff = self.backoff.max(Duration::from_secs(5));
        }
        if f.forbidden && self.said_forbidden {
            debug!(error = %f.why, "could not write the EndpointSlice (forbidden, said before)");
        } else {
            warn!(slice = %cfg.slice_name(), error = %f.why, retry_in = ?self.backoff, "could not write the EndpointSlice; leadership is unaffected");
        }
        self.said_forbidden |= f.forbidden;
        self.at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
    }
}
