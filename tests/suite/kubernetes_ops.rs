//! Operations on the Kubernetes Lease backend, on the API stand-in: the
//! operator controls as annotations of the election Lease (pause,
//! switchover), the campaign's pause rule, a release naming a given
//! successor, and the watches of the registry and of the controls. The
//! backend is called through its trait where that is the clearest; the
//! pause is also run against sidecars. Each safety test has its liveness
//! twin (resume → a leader).

use std::sync::Arc;
use std::time::Duration;

use leader_elector::backend::WaitReason;
use leader_elector::backend::candidates::Candidate;
use leader_elector::backend::controls::Controls;
use leader_elector::backend::kubernetes::{
    KubeLeaseBackend, PAUSED_ANNOTATION, SUCCESSOR_ANNOTATION, SWITCHOVER_ANNOTATION,
};
use leader_elector::backend::{Campaign, LeaseBackend, Renewal, Term};
use leader_elector::backend::{CandidateRegistry, ControlStore};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, timeout};

use crate::kubernetes::{NS, group_with, holder, until_no_overlap};
use crate::support::kube_api::{Endpoint, Fault, KubeApi};
use crate::support::*;

const TTL: Duration = Duration::from_secs(2);

/// A Lease backend (no sidecar) on its own stand-in endpoint.
async fn backend(
    api: &KubeApi,
    name: &str,
    election: &str,
) -> (Arc<Endpoint>, Arc<KubeLeaseBackend>) {
    let ep = api.endpoint(name).await;
    let kc = kube::config::Kubeconfig::read_from(ep.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    (ep, KubeLeaseBackend::with_client(client, NS, election))
}

fn elected(c: Campaign) -> Term {
    match c {
        Campaign::Elected(t) => t,
        other => panic!("not elected: {other:?}"),
    }
}

fn paused() -> Controls {
    Controls {
        paused: true,
        switchover: None,
    }
}

fn lease(api: &KubeApi, election: &str) -> Value {
    api.lease(election).expect("the election Lease")
}

/// The third party's annotation and Coordinated Leader Election fields
/// are as set by hand.
fn assert_foreign_kept(api: &KubeApi, election: &str, when: &str) {
    let l = lease(api, election);
    assert_eq!(
        l["metadata"]["annotations"]["example.com/owner"],
        json!("team-a"),
        "{when}: {l}"
    );
    assert_eq!(
        l["spec"]["strategy"],
        json!("OldestEmulationVersion"),
        "{when}: {l}"
    );
    assert_eq!(
        l["spec"]["preferredHolder"],
        json!("someone"),
        "{when}: {l}"
    );
}

fn note(api: &KubeApi, election: &str, key: &str) -> Value {
    lease(api, election)["metadata"]["annotations"][key].clone()
}

/// Every write of the election Lease (renewals, the release naming a
/// successor, the next acquisition) keeps the controls, a third party's
/// annotation and `spec.strategy`/`spec.preferredHolder`; the holder
/// renews and releases while paused, nobody takes the released Lease
/// until resume, then the named successor does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controls_survive_renewals_and_handovers_and_hold_back_campaigns() {
    let api = KubeApi::start(NS);
    let el = election("k-ops-keep");
    let (_, a) = backend(&api, "a", &el).await;
    let (_, b) = backend(&api, "b", &el).await;
    let (_, op) = backend(&api, "op", &el).await;
    // No Lease: none set, and a resume writes nothing.
    assert_eq!(op.controls().await.unwrap(), Controls::default());
    op.set_paused(false).await.unwrap();
    op.request_switchover(None).await.unwrap();
    assert!(api.lease(&el).is_none());

    let ta = elected(a.campaign("a", TTL, None).await.unwrap());
    assert!(api.edit_lease(&el, |l| {
        l["metadata"]["annotations"]["example.com/owner"] = json!("team-a");
        l["spec"]["strategy"] = json!("OldestEmulationVersion");
        l["spec"]["preferredHolder"] = json!("someone");
    }));
    op.set_paused(true).await.unwrap();
    op.request_switchover(Some("b")).await.unwrap();
    let both = Controls {
        paused: true,
        switchover: Some("b".into()),
    };
    assert_eq!(op.controls().await.unwrap(), both);
    assert_eq!(a.controls().await.unwrap(), both, "any member reads them");
    for _ in 0..3 {
        let r = a.renew(&ta).await.unwrap();
        assert!(
            matches!(r, Renewal::Renewed { .. }),
            "renews while paused: {r:?}"
        );
    }
    assert_foreign_kept(&api, &el, "after renewals");
    assert_eq!(op.controls().await.unwrap(), both, "after renewals");
    let r = b.campaign("b", TTL, None).await.unwrap();
    assert!(matches!(r, Campaign::Following(_)), "{r:?}");

    a.release(&ta, Some("b")).await.unwrap();
    assert_eq!(holder(&api, &el), "", "released while paused");
    assert_eq!(note(&api, &el, SUCCESSOR_ANNOTATION), json!("b"));
    assert_foreign_kept(&api, &el, "after the release");
    assert_eq!(op.controls().await.unwrap(), both, "after the release");
    for _ in 0..2 {
        match b.campaign("b", TTL, None).await.unwrap() {
            Campaign::Waiting { why, .. } => assert_eq!(why, WaitReason::Paused),
            other => panic!("the named successor takes nothing while paused: {other:?}"),
        }
    }
    assert_eq!(holder(&api, &el), "");

    // Liveness twin: resumed, the named successor takes it at once.
    op.set_paused(false).await.unwrap();
    let tb = elected(b.campaign("b", TTL, None).await.unwrap());
    assert_token_grew(
        ta.holder.fencing_token,
        tb.holder.fencing_token,
        "b after a",
    );
    assert_foreign_kept(&api, &el, "after the acquisition");
    assert_eq!(note(&api, &el, PAUSED_ANNOTATION), Value::Null);
    assert_eq!(note(&api, &el, SWITCHOVER_ANNOTATION), json!("b"));
    // The leader clears the request; its next renewal is not disturbed.
    b.request_switchover(None).await.unwrap();
    assert_eq!(b.controls().await.unwrap(), Controls::default());
    assert!(matches!(
        b.renew(&tb).await.unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_foreign_kept(&api, &el, "after clearing the request");
}

/// A pause written after a candidate read the free Lease and before its
/// compare-and-swap lands: the write answers 409, the re-read sees the
/// pause, nobody leads. The twin: after resume the candidate is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_written_between_a_campaigns_read_and_write_wins() {
    let api = KubeApi::start(NS);
    let el = election("k-ops-race");
    let (_, a) = backend(&api, "a", &el).await;
    let (b_ep, b) = backend(&api, "b", &el).await;
    let (_, op) = backend(&api, "op", &el).await;
    let ta = elected(a.campaign("a", TTL, None).await.unwrap());
    let r = b.campaign("b", TTL, None).await.unwrap();
    assert!(matches!(r, Campaign::Following(_)), "{r:?}");
    a.release(&ta, None).await.unwrap();
    // Every request of b's answered 300 ms late: its read is logged when
    // answered, and its write waits 300 ms before the store sees it.
    b_ep.set_fault(Fault {
        latency: Duration::from_millis(300),
        ..Fault::default()
    });
    let mark = b_ep.log().len();
    let campaign = tokio::spawn({
        let b = b.clone();
        async move { b.campaign("b", TTL, None).await }
    });
    wait_for(Duration::from_secs(5), "b's read answered", || async {
        b_ep.log()[mark..]
            .iter()
            .any(|l| l.verb == "get" && l.name == el)
    })
    .await;
    op.set_paused(true).await.unwrap();
    match campaign.await.unwrap().unwrap() {
        Campaign::Waiting { why, .. } => assert_eq!(why, WaitReason::Paused),
        other => panic!("a paused election elected nobody: {other:?}"),
    }
    let writes: Vec<u16> = b_ep.log()[mark..]
        .iter()
        .filter(|l| l.verb == "update")
        .map(|l| l.code)
        .collect();
    assert_eq!(writes, vec![409], "the write lost to the pause");
    assert_eq!(holder(&api, &el), "");

    b_ep.set_fault(Fault::default());
    op.set_paused(false).await.unwrap();
    let tb = elected(b.campaign("b", TTL, None).await.unwrap());
    assert_token_grew(
        ta.holder.fencing_token,
        tb.holder.fencing_token,
        "b after a",
    );
}

/// A pause set on an absent Lease creates it without a holder and with a
/// fencing token no lower than the wall clock's milliseconds; campaigns
/// wait while it is paused and one is elected after resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_of_an_absent_lease_creates_it_without_a_holder() {
    let api = KubeApi::start(NS);
    let el = election("k-ops-absent");
    let (_, a) = backend(&api, "a", &el).await;
    let (_, op) = backend(&api, "op", &el).await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    op.set_paused(true).await.unwrap();
    let l = lease(&api, &el);
    assert_eq!(holder(&api, &el), "", "{l}");
    let token: u64 = l["metadata"]["annotations"]["leader-elector/fencing-token"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(token >= before, "seeded from the wall clock: {l}");
    let end = Instant::now() + TTL * 2;
    while Instant::now() < end {
        let r = a.campaign("a", TTL, None).await.unwrap();
        assert!(matches!(r, Campaign::Waiting { .. }), "{r:?}");
        sleep(Duration::from_millis(200)).await;
    }
    op.set_paused(false).await.unwrap();
    // The holder was cleared by someone else: one duration of silence,
    // counted from the Lease's first sight, has passed already.
    let t = elected(a.campaign("a", TTL, None).await.unwrap());
    assert!(t.holder.fencing_token > token);
}

/// `watch_controls` resolves, for the leader and a follower alike, with
/// the new controls; a hand edit removing the annotation resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_controls_follows_the_operator_and_hand_edits() {
    let api = KubeApi::start(NS);
    let el = election("k-ops-watch");
    let (_, a) = backend(&api, "a", &el).await;
    let (_, b) = backend(&api, "b", &el).await;
    let (_, op) = backend(&api, "op", &el).await;
    let ta = elected(a.campaign("a", TTL, None).await.unwrap());
    b.campaign("b", TTL, None).await.unwrap();
    let none = Controls::default();
    let watching = |be: Arc<KubeLeaseBackend>, seen: Controls| {
        tokio::spawn(async move { be.watch_controls(&seen).await })
    };
    let (wa, wb) = (
        watching(a.clone(), none.clone()),
        watching(b.clone(), none.clone()),
    );
    // A renewal changes nothing the watches report.
    a.renew(&ta).await.unwrap();
    sleep(Duration::from_millis(300)).await;
    assert!(!wa.is_finished() && !wb.is_finished());
    op.set_paused(true).await.unwrap();
    for w in [wa, wb] {
        let got = timeout(Duration::from_secs(5), w).await.expect("resolves");
        assert_eq!(got.unwrap().unwrap(), paused());
    }
    let wa = watching(a.clone(), paused());
    assert!(api.edit_lease(&el, |l| {
        l["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(PAUSED_ANNOTATION);
    }));
    let got = timeout(Duration::from_secs(5), wa).await.expect("resolves");
    assert_eq!(got.unwrap().unwrap(), none, "a hand edit resumes");
    // A stale `seen` is answered at once from what was delivered.
    let got = timeout(Duration::from_secs(1), a.watch_controls(&paused())).await;
    assert_eq!(got.expect("at once").unwrap(), none);
    assert!(matches!(
        a.renew(&ta).await.unwrap(),
        Renewal::Renewed { .. }
    ));
}

/// `watch_candidates` resolves on a candidate joining and leaving, also
/// when the change came while nobody watched; at rest it sends nothing:
/// the watch left open by the last call is resumed, and the registry is
/// read from the copy that watch keeps (no LIST).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_candidates_resolves_on_a_candidate_joining_and_leaving() {
    let api = KubeApi::start(NS);
    let el = election("k-ops-registry");
    let (a_ep, a) = backend(&api, "a", &el).await;
    let (_, b) = backend(&api, "b", &el).await;
    a.publish_candidate(&Candidate::new("a"), TTL * 4)
        .await
        .unwrap();
    let w = tokio::spawn({
        let a = a.clone();
        async move { a.watch_candidates().await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "nothing changed");
    b.publish_candidate(&Candidate::new("b"), TTL * 4)
        .await
        .unwrap();
    let got = timeout(Duration::from_secs(5), w).await.expect("joined");
    got.unwrap().unwrap();
    // Left while nobody watched: the next call resolves at once.
    b.withdraw_candidate("b").await.unwrap();
    timeout(Duration::from_secs(1), a.watch_candidates())
        .await
        .expect("left")
        .unwrap();
    // The registry is read from the copy the open watch keeps, and at
    // rest that watch is resumed: no request at all.
    let mark = a_ep.log().len();
    let names: Vec<String> = a
        .candidates()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.candidate.identity)
        .collect();
    assert_eq!(names, vec!["a".to_owned()]);
    let rest = timeout(Duration::from_secs(1), a.watch_candidates()).await;
    assert!(rest.is_err(), "nothing changed: {rest:?}");
    let verbs: Vec<&str> = a_ep.log()[mark..].iter().map(|l| l.verb).collect();
    assert!(
        verbs.is_empty(),
        "the registry read from the watched copy: {verbs:?}"
    );
    // The cancelled call closed its watch: nothing keeps the copy current,
    // so the next read is a LIST again.
    a.candidates().await.unwrap();
    let verbs: Vec<&str> = a_ep.log()[mark..].iter().map(|l| l.verb).collect();
    assert_eq!(verbs, vec!["list"], "{verbs:?}");
}

/// Three sidecars (Lease 2 s, retry period 500 ms): paused while one
/// leads, the leader keeps renewing; SIGKILLed, nobody takes the Lease for
/// two lease durations; a hand edit removing the pause (the twin) gives a
/// leader within one lease duration + the retry period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_election_keeps_its_leader_and_fails_over_only_after_resume() {
    let mut g = group_with("k-ops-pause", &["pod-a", "pod-b", "pod-c"], &[], false).await;
    let first = one_leader(&g.cs, Duration::from_secs(20)).await;
    let (_, op) = backend(&g.api, "op", &g.election).await;
    op.set_paused(true).await.unwrap();
    let renewed = || lease(&g.api, &g.election)["spec"]["renewTime"].clone();
    let before = renewed();
    let end = Instant::now() + TTL;
    while Instant::now() < end {
        assert_eq!(
            leaders(&g.cs).await,
            vec![first],
            "the leader keeps its term"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(renewed(), before, "and renews it");
    assert_eq!(note(&g.api, &g.election, PAUSED_ANNOTATION), json!("true"));

    g.cs[first].signal(Signal::SIGKILL);
    g.cs[first].wait_exit(Duration::from_secs(5)).await;
    let killed = Instant::now();
    let others: Vec<usize> = (0..3).filter(|i| *i != first).collect();
    while killed.elapsed() < TTL * 2 + Duration::from_millis(500) {
        for i in &others {
            assert!(
                !g.cs[*i].is_leader().await,
                "{} leads {:?} after the leader died while paused",
                g.cs[*i].identity,
                killed.elapsed()
            );
        }
        sleep(Duration::from_millis(20)).await;
    }
    assert!(holder(&g.api, &g.election).starts_with(&g.cs[first].identity));

    assert!(g.api.edit_lease(&g.election, |l| {
        l["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(PAUSED_ANNOTATION);
    }));
    let resumed = Instant::now();
    let l = until_no_overlap(
        &g.cs,
        Duration::from_secs(10),
        "a leader after resume",
        |l| l.len() == 1,
    )
    .await;
    let took = resumed.elapsed();
    println!("kubernetes: a leader {took:?} after resume (lease 2 s, retry period 500 ms)");
    assert_ne!(l[0], first);
    assert!(
        took <= TTL + Duration::from_millis(500),
        "a leader within one lease duration + the retry period: {took:?}"
    );
}

/// A release naming `pod-b` (by a holder outside the group) among three
/// sidecars: `pod-b` leads, in at most two update attempts in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_naming_a_successor_hands_over_to_it() {
    let api = KubeApi::start(NS);
    let el = election("k-ops-successor");
    let (_, x) = backend(&api, "x", &el).await;
    let tx = elected(
        x.campaign("x", Duration::from_secs(30), None)
            .await
            .unwrap(),
    );
    let (mut eps, mut cs) = (Vec::new(), Vec::new());
    for id in ["pod-a", "pod-b", "pod-c"] {
        let ep = api.endpoint(id).await;
        let kubeconfig = ep.kubeconfig().to_string_lossy().into_owned();
        let mut args = vec!["--backend".to_owned(), "kubernetes".to_owned()];
        args.extend(FAST.iter().map(|a| a.to_string()));
        cs.push(Sidecar::start_env(
            &el,
            id,
            &args,
            &[("KUBECONFIG", &kubeconfig)],
        ));
        eps.push(ep);
    }
    wait_for(Duration::from_secs(20), "three followers", || async {
        let mut up = 0;
        for s in &cs {
            up += usize::from(s.leader().await.is_some());
        }
        up == 3
    })
    .await;
    sleep(Duration::from_millis(500)).await;
    assert!(leaders(&cs).await.is_empty(), "x leads");
    let marks: Vec<usize> = eps.iter().map(|ep| ep.log().len()).collect();
    let start = Instant::now();
    x.release(&tx, Some("pod-b")).await.unwrap();
    let l = until_no_overlap(&cs, Duration::from_secs(10), "the successor", |l| {
        l.len() == 1
    })
    .await;
    println!(
        "handover to a named successor among three: {:?}",
        start.elapsed()
    );
    assert_eq!(cs[l[0]].identity, "pod-b");
    sleep(Duration::from_secs(1)).await;
    let mut attempts = 0;
    for (ep, mark) in eps.iter().zip(&marks) {
        let writes: Vec<u16> = ep.log()[*mark..]
            .iter()
            .filter(|w| w.name == el && matches!(w.verb, "update" | "create"))
            .map(|w| w.code)
            .collect();
        // The successor's claim, then its renewals: count up to the claim.
        attempts += writes
            .iter()
            .position(|c| *c < 300)
            .map_or(writes.len(), |p| p + 1);
    }
    assert!(attempts <= 2, "{attempts} update attempts");
}
