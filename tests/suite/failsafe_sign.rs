//! The signed peer channel on real sidecars and a real etcd: a captured
//! heartbeat replayed, a wrong key, an old timestamp and a bearer secret
//! are refused (401, one WARN each, counted); a forger who knows the secret
//! and sends valid heartbeats for a dead leader cannot keep the election
//! leaderless beyond the stated bound; a member with a wrong secret is
//! refused at admission (one WARN on both sides, counted). Each prints its
//! figures (`--nocapture`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leader_elector::failsafe::Heartbeat;
use leader_elector::failsafe::peer::Secret;
use leader_elector::failsafe::sign::{Keys, Stamp};
use tokio::time::{Instant, sleep};

use super::failsafe::{TTL, secret_file, watch};
use crate::support::*;

const HEAD: [&str; 3] = ["request", "POST", "/failsafe/heartbeat"];

fn start(etcd: &str, name: &str, id: &str, secret: &str, extra: &[&str]) -> Sidecar {
    let mut args: Vec<String> = vec!["--etcd-endpoints".into(), etcd.into()];
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(["--failsafe", "--peer-addr", "127.0.0.1:0"].map(String::from));
    args.extend(["--failsafe-secret-file".into(), secret.into()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    Sidecar::start_raw(name, id, &args)
}

/// The peer address a sidecar bound (from its start-up line).
fn peer_addr(s: &Sidecar) -> String {
    let log = s.log();
    let line = (log.lines())
        .find(|l| l.contains("serving the peer heartbeat"))
        .expect("peer line");
    let addr = line.split("peer_addr=").nth(1).unwrap();
    addr.split_whitespace().next().unwrap().to_owned()
}

/// The keys of a secret file written by [`secret_file`].
fn keys_of(file: &str) -> Keys {
    let secret = Secret::from_file(std::path::Path::new(file)).unwrap();
    Keys::new(secret, None)
}

async fn post(addr: &str, stamp: Option<&Stamp>, body: &[u8]) -> u16 {
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/failsafe/heartbeat"))
        .header("content-type", "application/json");
    for (name, value) in stamp.map(Stamp::headers).into_iter().flatten() {
        req = req.header(name, value);
    }
    let resp = req.body(body.to_vec()).send().await.unwrap();
    resp.status().as_u16()
}

/// The value of the series of `metric` whose labels contain `labels`.
async fn metric(s: &Sidecar, metric: &str, labels: &str) -> f64 {
    let (_, text) = http_get(s.port, "/metrics").await.unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(metric) && l.contains(labels))
        .unwrap_or_else(|| panic!("no {metric}{{{labels}}} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_wrongly_signed_old_or_bearer_heartbeat_is_401_warned_once_and_counted() {
    let etcd = Etcd::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let (file, other) = (secret_file(dir.path(), "s"), secret_file(dir.path(), "x"));
    let s = start(&etcd.url, &election("fs-sign"), "m0", &file, &[]);
    let addr = peer_addr(&s);
    let hb = Heartbeat {
        election: "x".into(),
        leader: "evil".into(),
        fencing_token: 1,
        promise_ms: 60_000,
    };
    let body = serde_json::to_vec(&hb).unwrap();
    let keys = keys_of(&file);
    // Signed right (for another election: 409, nothing promised), then the
    // same bytes again: the replay is refused.
    let captured = keys.sign(HEAD, &body);
    assert_eq!(post(&addr, Some(&captured), &body).await, 409);
    assert_eq!(post(&addr, Some(&captured), &body).await, 401, "replayed");
    let wrong = keys_of(&other).sign(HEAD, &body);
    assert_eq!(post(&addr, Some(&wrong), &body).await, 401, "wrong key");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let old = keys.sign_at(HEAD, &body, (now - TTL * 2).as_millis() as u64);
    assert_eq!(post(&addr, Some(&old), &body).await, 401, "old timestamp");
    assert_eq!(post(&addr, None, &body).await, 401, "unsigned");
    assert_eq!(post(&addr, None, &body).await, 401, "unsigned again");
    let log = s.log();
    for reason in ["replayed", "wrong_key", "stale", "unsigned"] {
        let warned = log
            .lines()
            .filter(|l| l.contains("refused a failsafe heartbeat") && l.contains(reason))
            .count();
        assert_eq!(warned, 1, "one WARN for {reason}:\n{log}");
        let series = format!("reason=\"{reason}\",side=\"heartbeat\"");
        let n = metric(&s, "leader_election_failsafe_refused_total", &series).await;
        let want = if reason == "unsigned" { 2.0 } else { 1.0 };
        assert_eq!(n, want, "{reason}");
    }
    // Nothing changed: it leads on its own once its start-up wait is over.
    one_leader(std::slice::from_ref(&s), Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forger_with_the_secret_cannot_keep_a_dead_leaders_election_leaderless() {
    // The bound: members read etcd, so they refuse a term whose key is
    // gone: the dead leader's lease (TTL) + one member read (a renew
    // interval) + the last promise (TTL), then a campaign. Without a sight
    // of the backend, `--failsafe-max-outage` (here 6 s) bounds it.
    let max_outage = Duration::from_secs(6);
    let etcd = Etcd::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let file = secret_file(dir.path(), "s");
    let name = election("fs-forge");
    let mut sidecars: Vec<Sidecar> = (0..3)
        .map(|i| {
            start(
                &etcd.url,
                &name,
                &format!("m{i}"),
                &file,
                &["--failsafe-max-outage", "6s"],
            )
        })
        .collect();
    let first = one_leader(&sidecars, Duration::from_secs(30)).await;
    let token = token_of(&sidecars[first]).await;
    sleep(TTL * 2).await;
    let dead = sidecars.remove(first);
    let members: Vec<String> = sidecars.iter().map(peer_addr).collect();
    dead.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    // The forger: the dead leader's name and token, every 100 ms.
    let keys = keys_of(&file);
    let hb = Heartbeat {
        election: name.clone(),
        leader: dead.identity.clone(),
        fencing_token: token,
        promise_ms: 60_000,
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let forger = tokio::spawn(async move {
        let body = serde_json::to_vec(&hb).unwrap();
        let (mut accepted, mut refused) = (0, 0);
        while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
            for m in &members {
                match post(m, Some(&keys.sign(HEAD, &body)), &body).await {
                    200 => accepted += 1,
                    _ => refused += 1,
                }
            }
            sleep(Duration::from_millis(100)).await;
        }
        (accepted, refused)
    });
    let bound = TTL + max_outage;
    let w = watch(&sidecars, bound + Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (accepted, refused) = forger.await.unwrap();
    let next = w.led_until.map(|d| d + w.longest_leaderless);
    println!(
        "forger for a dead leader: leaderless {:?} after the kill (bound {bound:?}: the dead lease + --failsafe-max-outage; TTL {TTL:?}), new leaders {:?}, overlaps 0; forged heartbeats accepted {accepted}, refused {refused}; watched since {:?} after the kill",
        w.longest_leaderless,
        w.leaders,
        killed.elapsed()
    );
    assert!(
        !w.leaders.is_empty(),
        "a new leader in spite of the forger: {next:?}"
    );
    assert!(
        w.longest_leaderless <= bound,
        "{:?} > {bound:?}",
        w.longest_leaderless
    );
    assert!(
        refused > 0,
        "the members refused the forger once the term was gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_wrong_secret_is_refused_at_admission_with_one_warn_each_side() {
    let etcd = Etcd::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let (file, other) = (secret_file(dir.path(), "s"), secret_file(dir.path(), "x"));
    let name = election("fs-admit");
    let mut sidecars: Vec<Sidecar> = (0..2)
        .map(|i| start(&etcd.url, &name, &format!("m{i}"), &file, &[]))
        .collect();
    let first = one_leader(&sidecars, Duration::from_secs(30)).await;
    sidecars.push(start(&etcd.url, &name, "bad", &other, &[]));
    sleep(TTL * 2).await;
    let leader = &sidecars[first];
    let log = leader.log();
    let warned = (log.lines())
        .filter(|l| l.contains("refused a failsafe applicant") && l.contains("bad"))
        .count();
    assert_eq!(warned, 1, "one WARN on the leader:\n{log}");
    let n = metric(
        leader,
        "leader_election_failsafe_admission_refused_total",
        "",
    )
    .await;
    assert_eq!(n, 1.0);
    let bad_log = sidecars[2].log();
    let refused = (bad_log.lines())
        .filter(|l| l.contains("refused a failsafe heartbeat") && l.contains("wrong_key"))
        .count();
    assert_eq!(refused, 1, "one WARN on the member:\n{bad_log}");
    let (_, body) = sidecars[2].leader().await.unwrap();
    assert!(body["waiting"].to_string().contains("roster"), "{body}");
    watch(&sidecars, TTL).await;
}
