//! Failsafe on the Kubernetes Lease backend, against the API stand-in
//! frozen (every request hangs and open watches deliver nothing, like an
//! API server whose etcd is gone), under three sidecars. Safety (every
//! scenario): never two sidecars answering 200 at once (the overlap
//! checker polls every 20 ms). Liveness twins: with failsafe the leader
//! answers 200 throughout the freeze and keeps its term and token after
//! the thaw; without failsafe it steps down at its deadline; a newcomer
//! started during the freeze never campaigns and is admitted after; a
//! hand edit of the roster annotation is undone by the leader's next
//! renewal and moves nobody. The default freeze is 6 lease durations
//! (12 s); `LE_FAILSAFE_LONG=1` makes it 60 s. Each prints its figures
//! (`--nocapture`).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::failsafe::{Watched, outage, secret_file, watch};
use crate::support::backends::Backend;
use crate::support::kube_api::{Fault, KubeApi};
use crate::support::*;

const TTL: Duration = Duration::from_secs(2);
const ROSTER: &str = "leader-elector.io/failsafe-roster";

fn flags(secret: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = FAST.iter().map(|s| s.to_string()).collect();
    if let Some(file) = secret {
        args.extend(["--failsafe", "--peer-addr", "127.0.0.1:0"].map(String::from));
        args.extend(["--failsafe-secret-file".into(), file.into()]);
    }
    args
}

fn api(b: &Backend) -> &KubeApi {
    match b {
        Backend::Kube(api, _) => api,
        _ => unreachable!("the stand-in"),
    }
}

/// Freeze (`true`) or thaw the whole stand-in.
fn freeze(b: &Backend, on: bool) {
    api(b).set_fault_all(Fault {
        hang: on,
        ..Fault::default()
    });
}

/// The roster members the election Lease's annotation lists.
fn roster_on(b: &Backend, name: &str) -> Vec<String> {
    let Some(lease) = api(b).lease(name) else {
        return Vec::new();
    };
    let Some(text) = lease["metadata"]["annotations"][ROSTER].as_str() else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["identity"].as_str().unwrap().to_owned())
        .collect()
}

/// Wait until the roster lists `n` members.
async fn roster_of(b: &Backend, name: &str, n: usize) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let r = roster_on(b, name);
        if r.len() == n {
            return r;
        }
        assert!(Instant::now() < end, "roster {r:?}, {n} members expected");
        sleep(Duration::from_millis(100)).await;
    }
}

async fn three(b: &mut Backend, name: &str, secret: Option<&str>) -> Vec<Sidecar> {
    let mut sidecars = Vec::new();
    for i in 0..3 {
        sidecars.push(b.sidecar(name, &format!("m{i}"), &flags(secret)).await);
    }
    sidecars
}

/// Three sidecars through a freeze; the figures and whether the first
/// leader kept its term.
async fn freeze_under_three(failsafe: bool) -> (Watched, bool) {
    let mut b = Backend::start("kubernetes").await;
    let dir = tempfile::TempDir::new().unwrap();
    let secret = secret_file(dir.path(), "s");
    let name = election(if failsafe { "fsk-on" } else { "fsk-off" });
    let sidecars = three(&mut b, &name, failsafe.then_some(secret.as_str())).await;
    let first = one_leader(&sidecars, Duration::from_secs(30)).await;
    let token = token_of(&sidecars[first]).await;
    if failsafe {
        roster_of(&b, &name, 3).await;
        sleep(TTL).await;
    }
    freeze(&b, true);
    let down = Instant::now();
    let w = watch(&sidecars, outage()).await;
    if failsafe {
        for s in &sidecars {
            let (_, body) = s.leader().await.expect("answers");
            let leader = &sidecars[first].identity;
            assert_eq!(body["leader"], serde_json::json!(leader), "{body}");
        }
        let (code, body) = sidecars[first].leader().await.unwrap();
        assert_eq!(code, 200);
        assert_eq!(body["failsafe"]["active"], true, "{body}");
        assert_eq!(body["failsafe"]["members_confirmed"], 2, "{body}");
    }
    freeze(&b, false);
    let back = watch(&sidecars, TTL * 3).await;
    let kept = leaders(&sidecars).await == [first] && token_of(&sidecars[first]).await == token;
    println!(
        "lease failsafe={failsafe} freeze {:?}: longest leaderless {:?} (after the thaw: {:?}), first without a leader {:?} after the freeze, leaders seen {:?}, same term and token after: {kept}, overlaps 0",
        down.elapsed().min(outage()),
        w.longest_leaderless,
        back.longest_leaderless,
        w.led_until,
        w.leaders
    );
    if failsafe {
        let log = sidecars[first].log();
        assert_eq!(log.matches("failsafe: leading on").count(), 1, "one WARN");
        assert_eq!(log.matches("failsafe ended").count(), 1, "one INFO");
    }
    (w, kept)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stand_in_frozen_under_three_sidecars_with_failsafe_keeps_the_leader() {
    let (w, kept) = freeze_under_three(true).await;
    assert_eq!(w.led_until, None, "the leader answered 200 throughout");
    assert_eq!(w.leaders.len(), 1);
    assert!(kept, "the same term and token after the thaw");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stand_in_frozen_without_failsafe_the_leader_steps_down_at_its_deadline() {
    let (w, _) = freeze_under_three(false).await;
    let led = w.led_until.expect("nobody leads during the freeze");
    assert!(
        led <= TTL + Duration::from_secs(1),
        "stepped down at its deadline: {led:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_in_the_freeze_never_campaigns_and_is_admitted_after() {
    let mut b = Backend::start("kubernetes").await;
    let dir = tempfile::TempDir::new().unwrap();
    let secret = secret_file(dir.path(), "s");
    let name = election("fsk-new");
    let mut sidecars = Vec::new();
    for i in 0..2 {
        let s = b
            .sidecar(&name, &format!("m{i}"), &flags(Some(&secret)))
            .await;
        sidecars.push(s);
    }
    let first = one_leader(&sidecars, Duration::from_secs(30)).await;
    let token = token_of(&sidecars[first]).await;
    assert_eq!(roster_of(&b, &name, 2).await, ["m0", "m1"]);
    sleep(TTL).await;
    freeze(&b, true);
    sidecars.push(b.sidecar(&name, "late", &flags(Some(&secret))).await);
    let w = watch(&sidecars, TTL * 4).await;
    assert_eq!(w.led_until, None, "the leader led throughout");
    assert_eq!(
        w.leaders.len(),
        1,
        "the newcomer never led: {:?}",
        w.leaders
    );
    freeze(&b, false);
    let after = Instant::now();
    let roster = roster_of(&b, &name, 3).await;
    println!(
        "lease: newcomer in the freeze: never led; admitted {:?} after the thaw (roster {roster:?}); overlaps 0",
        after.elapsed()
    );
    watch(&sidecars, TTL).await;
    assert_eq!(leaders(&sidecars).await, [first]);
    assert_eq!(token_of(&sidecars[first]).await, token, "same term");
    assert!(!sidecars[2].log().contains("became leader"), "never led");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_edit_of_the_roster_annotation_is_undone_and_moves_nobody() {
    let mut b = Backend::start("kubernetes").await;
    let dir = tempfile::TempDir::new().unwrap();
    let secret = secret_file(dir.path(), "s");
    let name = election("fsk-edit");
    let mut sidecars = three(&mut b, &name, Some(&secret)).await;
    let first = one_leader(&sidecars, Duration::from_secs(30)).await;
    let token = token_of(&sidecars[first]).await;
    let full = roster_of(&b, &name, 3).await;
    let narrow = serde_json::json!({"members": [{"identity": "x", "peer_addr": "x:1"}]});
    let edits: [Option<String>; 2] = [None, Some(narrow.to_string())];
    for edit in edits {
        let edited = Instant::now();
        assert!(api(&b).edit_lease(&name, |l| {
            let a = l["metadata"]["annotations"].as_object_mut().unwrap();
            match &edit {
                None => a.remove(ROSTER),
                Some(text) => a.insert(ROSTER.into(), text.clone().into()),
            };
        }));
        while roster_on(&b, &name) != full {
            let late = edited.elapsed();
            assert!(late < TTL * 5, "not re-asserted after {late:?}");
            sleep(Duration::from_millis(10)).await;
        }
        let undone = edited.elapsed();
        let w = watch(&sidecars, TTL * 2).await;
        assert_eq!(w.led_until, None, "the leader led throughout");
        println!(
            "lease: roster annotation {} by hand: re-asserted by the leader {undone:?} after; leaders seen {:?} in the next {:?}; overlaps 0",
            if edit.is_none() {
                "removed"
            } else {
                "narrowed"
            },
            w.leaders,
            TTL * 2
        );
        assert_eq!(leaders(&sidecars).await, [first]);
        assert_eq!(token_of(&sidecars[first]).await, token);
    }
    // Failsafe asks nothing of the API server that the chart's Role does
    // not grant (ci/sidecar-requests.txt, checked against the Role by
    // scripts/check-k8s): a member's withdrawal on SIGTERM included.
    for s in &mut sidecars {
        s.signal(nix::sys::signal::Signal::SIGTERM);
        s.wait_exit(Duration::from_secs(10)).await;
    }
    let Backend::Kube(_, eps) = &b else {
        unreachable!()
    };
    let made: BTreeSet<String> = eps
        .iter()
        .flat_map(|ep| ep.log())
        .map(|l| format!("{} {}", l.verb, l.resource))
        .collect();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/leader-elector/ci/sidecar-requests.txt"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let listed: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.trim().to_owned())
        .collect();
    let extra: Vec<&String> = made.difference(&listed).collect();
    assert!(
        extra.is_empty(),
        "failsafe made requests the Role may not grant: {extra:?}"
    );
}
