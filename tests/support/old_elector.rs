//! The archived `leader-elector` image's election loop, re-implemented for
//! tests: client-go's pre-Lease `EndpointsLock` behaviour
//! (`tools/leaderelection/leaderelection.go`, `tryAcquireOrRenew`), talking
//! to the Kubernetes stand-in through its own endpoint.
//!
//! - Every retry period it reads the Endpoints object named after the
//!   election and its `control-plane.alpha.kubernetes.io/leader` record.
//! - A record it has not seen before (raw bytes) restarts its observed
//!   time; it takes the record when the holder is empty or when it has seen
//!   the record unchanged for its own lease duration (observed time, never
//!   the record's times), by an update carrying the `resourceVersion` read
//!   (a create when absent). A 409 is a lost race.
//! - The holder renews the same way every retry period; it believes it
//!   leads until the renew deadline has passed since the send of its last
//!   successful write (client-go stops at the renew cycle's deadline).
//! - Stopped, it just dies: the archived image never released.
//!
//! It answers `GET /leader` as the sidecar does (`is_leader`, `leader`,
//! `fencing_token`: the record's `leaderTransitions`, `transitions`: its
//! own terms), computed at the instant it answers, so the overlap recorder
//! can poll it beside the sidecars.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Endpoints;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::kube_api::KubeApi;

const ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// The old image's timing.
#[derive(Clone, Copy, Debug)]
pub struct OldTiming {
    /// `--ttl`: the lease duration, written and waited for.
    pub lease: Duration,
    /// How long the holder keeps trying to renew before it stops leading.
    pub renew_deadline: Duration,
    /// How often every candidate tries.
    pub retry: Duration,
}

#[derive(Default)]
struct Belief {
    /// The holder believes it leads until this instant.
    until: Option<Instant>,
    leader: String,
    token: u64,
    terms: u64,
}

/// One old-image candidate. Dropping it kills it (no release).
pub struct OldElector {
    /// Its identity (Pod name).
    pub identity: String,
    /// The port of its `/leader`.
    pub port: u16,
    tasks: Vec<JoinHandle<()>>,
}

impl OldElector {
    /// Start a candidate for `election` in the stand-in's namespace, on its
    /// own stand-in endpoint.
    pub async fn start(api: &KubeApi, election: &str, identity: &str, t: OldTiming) -> OldElector {
        let ep = api.endpoint(identity).await;
        let kc = kube::config::Kubeconfig::read_from(ep.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let api: Api<Endpoints> = Api::default_namespaced(client);
        let belief = Arc::new(Mutex::new(Belief::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shown = belief.clone();
        let app = axum::Router::new().route(
            "/leader",
            axum::routing::get(move || {
                let b = shown.clone();
                async move { answer(&b.lock().unwrap()) }
            }),
        );
        let serve = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let run = tokio::spawn(campaign(
            api,
            election.to_owned(),
            identity.to_owned(),
            t,
            belief,
        ));
        OldElector {
            identity: identity.to_owned(),
            port,
            tasks: vec![serve, run],
        }
    }

    /// Kill it: it stops answering and writing at once, releasing nothing.
    pub fn kill(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for OldElector {
    fn drop(&mut self) {
        self.kill();
    }
}

fn answer(b: &Belief) -> (axum::http::StatusCode, axum::Json<Value>) {
    let now = Instant::now();
    let valid = b
        .until
        .map_or(Duration::ZERO, |u| u.saturating_duration_since(now));
    let leads = !valid.is_zero();
    let code = if leads { 200 } else { 503 };
    (
        axum::http::StatusCode::from_u16(code).unwrap(),
        axum::Json(json!({
            "is_leader": leads,
            "leader": b.leader,
            "fencing_token": leads.then_some(b.token),
            "valid_for_ms": valid.as_millis() as u64,
            "transitions": b.terms,
            "backend_healthy": true,
        })),
    )
}

/// What the candidate last observed: the raw record and when it changed.
#[derive(Default)]
struct Observed {
    raw: Option<String>,
    at: Option<Instant>,
}

async fn campaign(
    api: Api<Endpoints>,
    election: String,
    me: String,
    t: OldTiming,
    belief: Arc<Mutex<Belief>>,
) {
    let mut seen = Observed::default();
    loop {
        let send = Instant::now();
        match try_acquire_or_renew(&api, &election, &me, t, &mut seen).await {
            Some(token) => {
                let mut b = belief.lock().unwrap();
                // Not leading until now (never, or the renew deadline
                // passed): a new term.
                if b.until.is_none_or(|u| Instant::now() >= u) {
                    b.terms += 1;
                }
                b.until = Some(send + t.renew_deadline);
                b.leader = me.clone();
                b.token = token;
            }
            None => {
                let mut b = belief.lock().unwrap();
                if b.until.is_some_and(|u| Instant::now() >= u) {
                    b.until = None;
                }
            }
        }
        sleep(t.retry).await;
    }
}

/// One round: `Some(leaderTransitions)` when this candidate holds the lock
/// after it.
async fn try_acquire_or_renew(
    api: &Api<Endpoints>,
    election: &str,
    me: &str,
    t: OldTiming,
    seen: &mut Observed,
) -> Option<u64> {
    let now = Instant::now();
    let stamp = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let secs = t.lease.as_secs().max(1);
    let pp = PostParams::default();
    let Some(mut e) = api.get_opt(election).await.ok()? else {
        let record = json!({"holderIdentity": me, "leaseDurationSeconds": secs,
            "acquireTime": stamp, "renewTime": stamp, "leaderTransitions": 0});
        let mut fresh = Endpoints::default();
        fresh.metadata.name = Some(election.to_owned());
        fresh.metadata.annotations = Some([(ANNOTATION.to_owned(), record.to_string())].into());
        api.create(&pp, &fresh).await.ok()?;
        *seen = Observed {
            raw: Some(record.to_string()),
            at: Some(now),
        };
        return Some(0);
    };
    let annotations = e.metadata.annotations.get_or_insert_with(Default::default);
    let raw = annotations.get(ANNOTATION).cloned();
    let old: Value = raw
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(json!({}));
    if raw != seen.raw {
        *seen = Observed {
            raw: raw.clone(),
            at: Some(now),
        };
    }
    let holder = old["holderIdentity"].as_str().unwrap_or("");
    let alive = seen.at.is_some_and(|at| at + t.lease > now);
    if !holder.is_empty() && holder != me && alive {
        return None;
    }
    let mine = holder == me;
    let transitions = old["leaderTransitions"].as_u64().unwrap_or(0) + u64::from(!mine);
    let acquired = if mine {
        old["acquireTime"].clone()
    } else {
        json!(stamp)
    };
    let record = json!({"holderIdentity": me, "leaseDurationSeconds": secs,
        "acquireTime": acquired, "renewTime": stamp, "leaderTransitions": transitions});
    annotations.insert(ANNOTATION.to_owned(), record.to_string());
    api.replace(election, &pp, &e).await.ok()?;
    *seen = Observed {
        raw: Some(record.to_string()),
        at: Some(now),
    };
    Some(transitions)
}
