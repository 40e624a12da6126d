//! `examples/operator.rs` as two real processes against the Kubernetes API
//! stand-in (tests/support/kube_api/): exactly one reconciles; SIGTERM to
//! it stops its controller, releases the election Lease and exits 0; the
//! other then leads and reconciles; never both at once.
//!
//! The example is built with `cargo build --example operator` (examples
//! have no `CARGO_BIN_EXE_*`). The handover is printed, never asserted.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::kube_api::{Endpoint, KubeApi};
use crate::support::wait_for;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::time::Instant;

const NS: &str = "team-a";
const MANAGED: &str = "operator-example.leader-elector.io/managed";
const RECONCILED_BY: &str = "operator-example.leader-elector.io/reconciled-by";
const FENCING_TOKEN: &str = "operator-example.leader-elector.io/fencing-token";

/// The example's binary, built (or found up to date) by cargo.
fn operator_bin() -> PathBuf {
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--quiet", "--example", "operator"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    // Without the variables cargo sets for a test run: build scripts that
    // read them (ring's reads CARGO_MANIFEST_DIR) would otherwise be rebuilt
    // here, and again by the next cargo run from a shell.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_tests = [
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
            || ["CARGO_TARGET_TMPDIR", "CARGO_PRIMARY_PACKAGE", "OUT_DIR"].contains(&&*name);
        if set_for_tests {
            cargo.env_remove(&*name);
        }
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "cargo build --example operator failed");
    // target/debug/deps/<this test> → target/debug/examples/operator
    let exe = std::env::current_exe().unwrap();
    let debug = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = debug.join("examples").join("operator");
    assert!(bin.is_file(), "no example binary at {}", bin.display());
    bin
}

/// One running operator and the lines it printed, with when they arrived.
struct Operator {
    id: &'static str,
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Operator {
    fn start(bin: &PathBuf, ep: &Endpoint, id: &'static str) -> Operator {
        let mut child = Command::new(bin)
            .env("KUBECONFIG", ep.kubeconfig())
            .env("POD_NAME", id)
            .env_remove("POD_NAMESPACE")
            .env("ELECTION", "operator-example")
            .env("LEASE_SECONDS", "3")
            .env("RUST_LOG", "leader_elector=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the example starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("[operator] {line}");
                sink.lock().unwrap().push((Instant::now(), line));
            }
        });
        Operator { id, child, lines }
    }

    /// When this operator first printed a line containing `what`, if it did.
    fn first(&self, what: &str) -> Option<Instant> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .find(|(_, l)| l.contains(what))
            .map(|(t, _)| *t)
    }

    /// When this operator last printed a line containing `what`, if it did.
    fn last(&self, what: &str) -> Option<Instant> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .rev()
            .find(|(_, l)| l.contains(what))
            .map(|(t, _)| *t)
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < end,
                "{} did not exit within {limit:?}",
                self.id
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Who reconciled the Lease `widget` last, and under which token.
fn reconciled(api: &KubeApi) -> Option<(String, u64)> {
    let l = api.lease("widget")?;
    let a = &l["metadata"]["annotations"];
    let by = a[RECONCILED_BY].as_str()?.to_owned();
    let token = a[FENCING_TOKEN].as_str()?.parse().ok()?;
    Some((by, token))
}

/// Create the managed Lease `widget` through the API, as a user would.
async fn create_widget(ep: &Endpoint) {
    let kubeconfig = kube::config::Kubeconfig::read_from(ep.kubeconfig()).unwrap();
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(kube::Client::try_from(config).unwrap(), NS);
    let widget: Lease = serde_json::from_value(json!({
        "metadata": {"name": "widget", "labels": {MANAGED: "true"}},
        "spec": {}
    }))
    .unwrap();
    leases
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_operator_reconciles_and_sigterm_hands_over_to_the_other() {
    let bin = operator_bin();
    let api = KubeApi::start(NS);
    let user = api.endpoint("user").await;
    create_widget(&user).await;
    let (ep_a, ep_b) = (api.endpoint("a").await, api.endpoint("b").await);
    let mut ops = [
        Operator::start(&bin, &ep_a, "op-a"),
        Operator::start(&bin, &ep_b, "op-b"),
    ];
    wait_for(Duration::from_secs(30), "the widget reconciled", || async {
        reconciled(&api).is_some()
    })
    .await;
    let (first, token) = reconciled(&api).unwrap();
    let leader = ops.iter().position(|o| o.id == first).unwrap();
    let follower = 1 - leader;
    // A hand edit that drops the annotations is put back by the leader.
    api.edit_lease("widget", |l| {
        l["metadata"]["annotations"] = json!({});
    });
    wait_for(
        Duration::from_secs(30),
        "the widget reconciled again",
        || async { reconciled(&api) == Some((first.clone(), token)) },
    )
    .await;
    assert_eq!(ops[follower].first("leading"), None, "both lead");
    assert_eq!(
        ops[follower].first("reconciled"),
        None,
        "the follower reconciled"
    );

    let sigterm = Instant::now();
    ops[leader].signal(Signal::SIGTERM);
    let status = ops[leader].wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "the leader exited with {status}");
    let exited = Instant::now();
    let second = ops[follower].id.to_owned();
    wait_for(
        Duration::from_secs(30),
        "the widget reconciled by the other",
        || async { reconciled(&api).is_some_and(|(by, _)| by == second) },
    )
    .await;
    let (_, new_token) = reconciled(&api).unwrap();
    assert!(new_token > token, "fencing token {new_token} after {token}");

    handed_over_in_order(&ops[leader], &ops[follower], sigterm, exited).await;
    ops[follower].signal(Signal::SIGTERM);
    let status = ops[follower].wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "the second leader exited with {status}");
}

/// The old leader stopped and released before the new one began, and
/// reconciled last before it; the handover times are printed.
async fn handed_over_in_order(old: &Operator, new: &Operator, sigterm: Instant, exited: Instant) {
    let stopped = old
        .first("stopped reconciling")
        .expect("no 'stopped reconciling'");
    assert!(
        old.first("released the election").is_some(),
        "no release line"
    );
    let leading = new.first("leading").expect("the new leader never said so");
    let last_reconcile = old.last("reconciled").unwrap();
    assert!(
        stopped < leading,
        "the new leader began before the old one stopped"
    );
    assert!(last_reconcile < leading, "both reconciled at once");
    // The widget is written before the new leader's line is read from its
    // output: wait for the line too.
    wait_for(
        Duration::from_secs(5),
        "the new leader's reconcile line",
        || async { new.first("reconciled").is_some() },
    )
    .await;
    eprintln!(
        "handover: SIGTERM → old process exited {:.1} ms, → new leader {:.1} ms, → widget reconciled by it {:.1} ms",
        ms(exited - sigterm),
        ms(leading - sigterm),
        ms(new.first("reconciled").unwrap() - sigterm),
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
