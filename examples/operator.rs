//! A kube-rs operator that reconciles only while it leads, elected on a
//! Kubernetes Lease with `leader-elector`.
//!
//! What it reconciles: every Lease in its namespace labelled
//! `operator-example.leader-elector.io/managed=true` gets the annotations
//! `operator-example.leader-elector.io/reconciled-by` (the leader's identity)
//! and `.../fencing-token` (its term's token). A write is refused when the
//! object already carries a larger token: a newer leader wrote it, so this
//! one has been deposed (the fencing rule, on the object itself; the write
//! is also a compare-and-swap on `resourceVersion`).
//!
//! ```text
//! cargo run --example operator     # with KUBECONFIG, or in a Pod
//! kubectl create lease widget && kubectl label lease widget operator-example.leader-elector.io/managed=true
//! ```
//!
//! Environment: `ELECTION` (the election Lease, default `operator-example`),
//! `POD_NAME` (the identity, else the host name), `POD_NAMESPACE` (else the
//! kubeconfig's namespace), `LEASE_SECONDS` (default 15). It needs get,
//! list, watch, create and update on `leases.coordination.k8s.io`.
//!
//! Ctrl-C or SIGTERM: stop reconciling (reconciles in flight finish), then
//! release the election Lease so another replica takes over at once; exit 0.
//! It prints one line per step on stdout (the test reads them).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use leader_elector::backends::{KubeLeaseBackend, build_kube_client};
use leader_elector::{Elector, LeaderState, until_leading, until_not_leading};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The label that marks a Lease for this operator.
const MANAGED: &str = "operator-example.leader-elector.io/managed";
/// Who reconciled the object last.
const RECONCILED_BY: &str = "operator-example.leader-elector.io/reconciled-by";
/// Under which term (fencing token) it was reconciled.
const FENCING_TOKEN: &str = "operator-example.leader-elector.io/fencing-token";

/// What every reconcile reads.
struct Ctx {
    api: Api<Lease>,
    identity: String,
    /// The fencing token of the term this controller runs for.
    token: u64,
    state: watch::Receiver<LeaderState>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let election = std::env::var("ELECTION").unwrap_or_else(|_| "operator-example".into());
    let lease_seconds = std::env::var("LEASE_SECONDS").map_or(Ok(15), |s| s.parse())?;
    let config = kube::Config::infer().await?;
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or(config.default_namespace.clone());
    // One client for both: built without kube-rs's retry layer, as the
    // Elector wants (it owns retries and deadlines).
    let client = build_kube_client(config)?;
    let backend = KubeLeaseBackend::with_client(client.clone(), &namespace, &election);
    // The Lease backend also keeps the candidate registry and the operator
    // controls (pause, switchover): the same backend serves all three.
    let (mut elector, mut state) = Elector::builder(backend.clone())
        .registry(backend.clone())
        .controls(backend)
        .election(&election)
        .lease_duration(Duration::from_secs(lease_seconds))
        .build()?;
    // The Elector releases the Lease only after this says the controller
    // stopped (at most 2 s, never past the term's validity).
    let acting = elector.add_participant();
    let identity = state.borrow().identity.clone();
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signals(shutdown.clone()));
    let running = tokio::spawn(elector.run(shutdown.clone()));
    println!("{identity}: candidate in election {namespace}/{election}");
    while !shutdown.is_cancelled() {
        let token = tokio::select! {
            _ = shutdown.cancelled() => break,
            token = until_leading(&mut state) => match token {
                Some(token) => token,
                None => break,
            },
        };
        println!("{identity}: leading (fencing token {token}); reconciling");
        acting.send_replace(Some(token));
        let ctx = Arc::new(Ctx {
            api: Api::namespaced(client.clone(), &namespace),
            identity: identity.clone(),
            token,
            state: state.clone(),
        });
        reconcile_while_leading(ctx).await;
        acting.send_replace(None);
        println!("{identity}: stopped reconciling");
    }
    running.await?;
    println!("{identity}: released the election; exiting");
    Ok(())
}

/// Run the controller until this candidate no longer leads; reconciles in
/// flight then finish before this returns.
async fn reconcile_while_leading(ctx: Arc<Ctx>) {
    let mut state = ctx.state.clone();
    let lost = async move { until_not_leading(&mut state).await };
    let wc = watcher::Config::default().labels(&format!("{MANAGED}=true"));
    Controller::new(ctx.api.clone(), wc)
        .graceful_shutdown_on(lost)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

/// Annotate a managed Lease with this leader's identity and token.
async fn reconcile(lease: Arc<Lease>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let labels = lease.metadata.labels.as_ref();
    if labels.and_then(|l| l.get(MANAGED)).map(String::as_str) != Some("true") {
        return Ok(Action::await_change());
    }
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let theirs: u64 = annotations
        .get(FENCING_TOKEN)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let done = theirs == ctx.token && annotations.get(RECONCILED_BY) == Some(&ctx.identity);
    // Deposed (a newer term wrote), or no longer leading: write nothing.
    if done || theirs > ctx.token || !ctx.state.borrow().is_leader_now() {
        return Ok(Action::await_change());
    }
    let mut desired = (*lease).clone();
    let a = desired
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    a.insert(RECONCILED_BY.into(), ctx.identity.clone());
    a.insert(FENCING_TOKEN.into(), ctx.token.to_string());
    let name = lease.metadata.name.clone().unwrap_or_default();
    ctx.api
        .replace(&name, &PostParams::default(), &desired)
        .await?;
    println!(
        "{}: reconciled lease/{name} (fencing token {})",
        ctx.identity, ctx.token
    );
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// A failed reconcile (a 409 from a concurrent write, the API down) is
/// tried again shortly.
fn error_policy(_lease: Arc<Lease>, error: &kube::Error, ctx: Arc<Ctx>) -> Action {
    eprintln!("{}: reconcile failed: {error}", ctx.identity);
    Action::requeue(Duration::from_secs(1))
}

/// Cancel `shutdown` on Ctrl-C or SIGTERM.
async fn stop_on_signals(shutdown: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    shutdown.cancel();
}
