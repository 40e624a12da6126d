//! The EndpointSlice writer (`--endpointslice-service`) on the Kubernetes
//! API stand-in: real sidecars elect on a Lease and keep the slice of a
//! selector-less Service naming the leader's Pod IP only. A sampler reads
//! the slice from the stand-in's store every 5 ms beside every sidecar's
//! `/leader`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::kube_api::{Endpoint, KubeApi};
use crate::support::*;
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::time::{Instant, sleep};

const NS: &str = "team-s";
const SLICE: &str = "web-leader-elector";
/// What a sample may lag the state it is compared with: the write's own
/// latency on the loopback stand-in plus one polling round (the slice is
/// read, then every `/leader` is asked).
const WRITE_SLACK: Duration = Duration::from_millis(50);
/// How soon after a new leader is first seen the slice must name it.
const NAMED_WITHIN: Duration = Duration::from_millis(100);

fn ip(i: usize) -> String {
    format!("10.0.0.{}", i + 1)
}

/// A selector-less Service `web` and `n` sidecars (Pods `pod-0`… with IPs
/// 10.0.0.1…) keeping its EndpointSlice.
async fn slice_group(
    test: &str,
    n: usize,
    env_ip: bool,
) -> (KubeApi, Vec<Arc<Endpoint>>, Vec<Sidecar>) {
    let api = KubeApi::start(NS);
    api.put(
        "services",
        json!({"metadata": {"name": "web"},
               "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}),
    );
    let el = election(test);
    let (mut eps, mut cs) = (Vec::new(), Vec::new());
    for i in 0..n {
        let id = format!("pod-{i}");
        let ep = api.endpoint(&id).await;
        api.add_pod(&id);
        let mut args: Vec<String> = ["--backend", "kubernetes", "--endpointslice-service", "web"]
            .iter()
            .chain(FAST)
            .map(|s| s.to_string())
            .collect();
        args.extend(["--pod-label-key".to_owned(), String::new()]);
        let kc = ep.kubeconfig().to_string_lossy().into_owned();
        let addr = ip(i);
        let mut env = vec![
            ("KUBECONFIG", kc.as_str()),
            ("POD_NAME", id.as_str()),
            ("POD_NAMESPACE", NS),
        ];
        if env_ip {
            env.push(("POD_IP", addr.as_str()));
        }
        cs.push(Sidecar::start_env(&el, &id, &args, &env));
        eps.push(ep);
    }
    (api, eps, cs)
}

/// The addresses the slice names now (none when it does not exist).
fn named(api: &KubeApi) -> Vec<String> {
    api.object("endpointslices", SLICE)
        .map(|s| leader_elector::endpoint_slice::named_addresses(&s))
        .unwrap_or_default()
}

/// Samples the slice and every `/leader` every 5 ms: the slice never names
/// a Pod while another leads, names a Pod that does not lead for no longer
/// than [`WRITE_SLACK`], and names each new leader within
/// [`NAMED_WITHIN`] of its first sighting. Returns the last leader seen.
struct Sampler {
    stale_since: Option<Instant>,
    leader: Option<usize>,
    unnamed_since: Option<Instant>,
    /// Longest wait from a new leader's first sighting to its address in
    /// the slice.
    worst_named: Duration,
}

impl Sampler {
    fn new() -> Sampler {
        Sampler {
            stale_since: None,
            leader: None,
            unnamed_since: None,
            worst_named: Duration::ZERO,
        }
    }

    async fn run(&mut self, api: &KubeApi, cs: &[Sidecar], span: Duration) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            let at = Instant::now();
            let slice = named(api);
            let l = leaders(cs).await;
            assert!(l.len() <= 1, "two leaders: {l:?}");
            self.check(at, &slice, l.first().copied());
            sleep(Duration::from_millis(5)).await;
        }
    }

    fn check(&mut self, at: Instant, slice: &[String], leader: Option<usize>) {
        assert!(
            slice.len() <= 1,
            "the slice names more than one Pod: {slice:?}"
        );
        let names = slice
            .first()
            .map(|a| a.trim_start_matches("10.0.0.").parse::<usize>().unwrap() - 1);
        if let (Some(x), Some(y)) = (names, leader) {
            assert!(
                x == y || self.unnamed_since.is_some_and(|t| at - t <= WRITE_SLACK),
                "the slice names pod-{x} while pod-{y} leads"
            );
        }
        // Named but not leading: only for the write's own latency.
        if names.is_some() && names != leader {
            let since = *self.stale_since.get_or_insert(at);
            assert!(
                at - since <= WRITE_SLACK,
                "the slice named a Pod that does not lead for {:?}",
                at - since
            );
        } else {
            self.stale_since = None;
        }
        if leader.is_some() && leader != self.leader {
            self.unnamed_since = Some(at);
        }
        self.leader = leader.or(self.leader);
        if let Some(t) = self.unnamed_since {
            if names == leader && leader.is_some() {
                self.worst_named = self.worst_named.max(at - t);
                self.unnamed_since = None;
            } else {
                assert!(
                    at - t <= NAMED_WITHIN,
                    "the new leader pod-{:?} is not in the slice {:?} after its election",
                    leader,
                    at - t
                );
            }
        }
    }
}

/// Two graceful handovers (SIGTERM) among three: the slice follows the
/// leader, never names another, and names each new leader within 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slice_names_only_the_leader_through_graceful_handovers() {
    let (api, eps, mut cs) = slice_group("k-slice", 3, true).await;
    let first = one_leader(&cs, Duration::from_secs(20)).await;
    let mut s = Sampler::new();
    s.run(&api, &cs, Duration::from_millis(1500)).await;
    assert_eq!(named(&api), vec![ip(first)]);
    let slice = api.object("endpointslices", SLICE).unwrap();
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "web"
    );
    assert_eq!(
        slice["ports"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
    let mut stopped = vec![first];
    for _ in 0..2 {
        let leader = s.leader.unwrap();
        cs[leader].signal(Signal::SIGTERM);
        s.run(&api, &cs, Duration::from_secs(3)).await;
        assert!(cs[leader].wait_exit(Duration::from_secs(5)).await.is_some());
        let now = s.leader.unwrap();
        assert!(!stopped.contains(&now), "a stopped sidecar leads");
        assert_eq!(named(&api), vec![ip(now)]);
        stopped.push(now);
    }
    eprintln!(
        "slowest naming of a new leader after its first sighting: {:?}",
        s.worst_named
    );
    // The last one stops: it takes itself out before it goes.
    let last = s.leader.unwrap();
    cs[last].signal(Signal::SIGTERM);
    assert!(cs[last].wait_exit(Duration::from_secs(5)).await.is_some());
    assert!(
        named(&api).is_empty(),
        "the last leader left its address behind"
    );
    // Exactly the requests the chart's Role grants with endpointSlice.enabled
    // (scripts/check-k8s): the slice read, created, replaced; the Service read.
    let made: std::collections::BTreeSet<(String, String)> = eps
        .iter()
        .flat_map(|e| e.log())
        .filter(|l| l.resource == "endpointslices" || l.resource == "services")
        .map(|l| (l.verb.to_owned(), l.resource.clone()))
        .collect();
    let granted = [
        ("create", "endpointslices"),
        ("get", "endpointslices"),
        ("get", "services"),
        ("update", "endpointslices"),
    ];
    let granted = granted
        .iter()
        .map(|(v, r)| (v.to_string(), r.to_string()))
        .collect();
    assert_eq!(made, granted);
}

/// A leader killed with SIGKILL cannot take itself out: its address stays
/// until the next leader is elected, which replaces it within 100 ms of
/// its election (liveness twin of the graceful case). A slice edited by
/// hand is put back at the leader's next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leaders_address_is_replaced_and_hand_edits_put_back() {
    let (api, _eps, mut cs) = slice_group("k-slice-kill", 3, true).await;
    let first = one_leader(&cs, Duration::from_secs(20)).await;
    wait_for(
        Duration::from_secs(5),
        "the first leader's address",
        || async { named(&api) == vec![ip(first)] },
    )
    .await;
    api.edit("endpointslices", SLICE, |s| {
        s["endpoints"][0]["addresses"] = json!(["10.9.9.9"])
    });
    wait_for(Duration::from_secs(3), "the hand edit put back", || async {
        named(&api) == vec![ip(first)]
    })
    .await;

    cs[first].signal(Signal::SIGKILL);
    let _ = cs[first].wait_exit(Duration::from_secs(5)).await;
    let end = Instant::now() + Duration::from_secs(10);
    let next = loop {
        let at = Instant::now();
        let l = leaders(&cs).await;
        if let Some(&y) = l.first()
            && y != first
        {
            break (y, at);
        }
        assert_eq!(
            named(&api),
            vec![ip(first)],
            "the dead leader's address stays until a new leader"
        );
        assert!(Instant::now() < end, "no new leader");
        sleep(Duration::from_millis(5)).await;
    };
    wait_for(NAMED_WITHIN * 2, "the new leader in the slice", || async {
        named(&api) == vec![ip(next.0)]
    })
    .await;
    eprintln!(
        "new leader in the slice {:?} after its first sighting",
        next.1.elapsed()
    );
}

/// Without POD_IP the flag is refused at start-up with exit 2, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flag_without_pod_ip_exits_2_naming_the_fix() {
    let (_api, _eps, mut cs) = slice_group("k-slice-noip", 1, false).await;
    let status = cs[0]
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("it exits");
    assert_eq!(status.code(), Some(2));
    assert!(cs[0].log().contains("POD_IP"), "{}", cs[0].log());
}
