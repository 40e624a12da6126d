//! Failsafe on real Redis servers (`--appendonly yes`, which failsafe on
//! Redis requires): three sidecars with `--failsafe` while one Redis, or a
//! majority of a Redlock group of three, is stopped (SIGKILL) and started
//! again on the same port and data. Safety (every scenario): never two
//! sidecars answering 200 at once (the overlap checker of
//! [`super::failsafe`]), the same fencing token after the outage. Liveness
//! twins: with failsafe the leader answers 200 throughout and keeps its term
//! (the key that expired meanwhile is put back under the fencing counter's
//! guard); without failsafe it steps down at its deadline; a newcomer in the
//! outage never campaigns and is admitted after; a Redis without
//! persistence elects nobody with failsafe (one WARN) until appendonly is
//! turned on. Outage length as in [`super::failsafe::outage`].

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::failsafe::{TTL, Watched, outage, secret_file, watch};
use crate::support::*;

const AOF: &[&str] = &["--appendonly", "yes"];

fn start(servers: &[RedisServer], name: &str, id: &str, secret: Option<&str>) -> Sidecar {
    let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    let mut extra: Vec<&str> = FAST.to_vec();
    if let Some(file) = secret {
        extra.extend(["--failsafe", "--peer-addr", "127.0.0.1:0"]);
        extra.extend(["--failsafe-secret-file", file]);
    }
    redis_sidecar(&urls, name, id, &extra)
}

/// The roster's member identities as `server` holds them.
async fn roster_on(server: &RedisServer, name: &str) -> Vec<String> {
    let mut c = server.conn().await;
    let key = format!("leader-elector:{{{name}}}:failsafe:roster");
    let text: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    let Some(text) = text else { return Vec::new() };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let members = v["members"].as_array().unwrap().iter();
    members
        .map(|m| m["identity"].as_str().unwrap().to_owned())
        .collect()
}

/// Three sidecars through an outage of `down` of `n` servers; returns the
/// figures and whether the first leader kept its term and token.
async fn outage_under_three(n: usize, down: usize, failsafe: bool) -> (Watched, bool) {
    let mut servers = Vec::new();
    for _ in 0..n {
        servers.push(RedisServer::start_with(AOF).await);
    }
    let dir = tempfile::TempDir::new().unwrap();
    let secret = secret_file(dir.path(), "s");
    let name = election(&format!("fsr{n}-{}", if failsafe { "on" } else { "off" }));
    let sidecars: Vec<Sidecar> = (0..3)
        .map(|i| {
            let s = failsafe.then_some(secret.as_str());
            start(&servers, &name, &format!("m{i}"), s)
        })
        .collect();
    let first = one_leader(&sidecars, Duration::from_secs(30)).await;
    let token = token_of(&sidecars[first]).await;
    // Every member admitted (one renewal after it applied), and the AOF
    // (fsync every second) has the roster.
    sleep(TTL * 2).await;
    if failsafe {
        assert_eq!(roster_on(&servers[0], &name).await, ["m0", "m1", "m2"]);
    }
    servers[..down].iter_mut().for_each(RedisServer::stop);
    let stopped = Instant::now();
    let w = watch(&sidecars, outage()).await;
    if failsafe {
        for s in &sidecars {
            let (_, body) = s.leader().await.expect("answers");
            let leader = serde_json::json!(sidecars[first].identity);
            assert_eq!(body["leader"], leader, "{body}");
        }
        let (code, body) = sidecars[first].leader().await.unwrap();
        assert_eq!(code, 200);
        assert_eq!(body["failsafe"]["active"], true, "{body}");
        assert_eq!(body["failsafe"]["members_confirmed"], 2, "{body}");
    }
    let outage_took = stopped.elapsed();
    for s in &mut servers[..down] {
        s.restart().await;
    }
    let back = watch(&sidecars, TTL * 2).await;
    let kept = leaders(&sidecars).await == [first] && token_of(&sidecars[first]).await == token;
    println!(
        "redis {down} of {n} stopped, failsafe={failsafe}, outage {outage_took:?}: longest leaderless {:?} (after the servers returned: {:?}), first without a leader {:?} after the stop, leaders seen {:?}, same term and token {token} after: {kept}, overlaps 0",
        w.longest_leaderless, back.longest_leaderless, w.led_until, w.leaders
    );
    if failsafe {
        assert_eq!(roster_on(&servers[0], &name).await, ["m0", "m1", "m2"]);
        let log = sidecars[first].log();
        assert_eq!(log.matches("failsafe: leading on").count(), 1, "one WARN");
        assert_eq!(log.matches("failsafe ended").count(), 1, "one INFO");
    }
    (w, kept)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_under_three_sidecars_with_failsafe_keeps_the_leader() {
    let (w, kept) = outage_under_three(1, 1, true).await;
    assert_eq!(w.led_until, None, "the leader answered 200 throughout");
    assert_eq!(w.leaders.len(), 1);
    assert!(kept, "the same term and token after Redis returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_without_failsafe_the_leader_steps_down_at_its_deadline() {
    let (w, _) = outage_under_three(1, 1, false).await;
    let led = w.led_until.expect("nobody leads during the outage");
    assert!(
        led <= TTL + Duration::from_secs(1),
        "stepped down at its deadline: {led:?}"
    );
}

/// A majority of a Redlock group down: no quorum answers, the key expires
/// on the one left; the leader leads on, and its renewals put the key back
/// on every server once they return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_majority_stopped_with_failsafe_keeps_the_leader() {
    let (w, kept) = outage_under_three(3, 2, true).await;
    assert_eq!(w.led_until, None, "the leader answered 200 throughout");
    assert_eq!(w.leaders.len(), 1);
    assert!(kept, "the same term and token after the servers returned");
}

/// Every server of the group down: the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_all_stopped_with_failsafe_keeps_the_leader() {
    let (w, kept) = outage_under_three(3, 3, true).await;
    assert_eq!(w.led_until, None, "the leader answered 200 throughout");
    assert_eq!(w.leaders.len(), 1);
    assert!(kept, "the same term and token after the servers returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_newcomer_in_the_outage_never_campaigns_and_is_admitted_after() {
    let mut server = RedisServer::start_with(AOF).await;
    let dir = tempfile::TempDir::new().unwrap();
    let secret = secret_file(dir.path(), "s");
    let name = election("fsr-new");
    let one = std::slice::from_ref(&server);
    let mut sidecars: Vec<Sidecar> = (0..2)
        .map(|i| start(one, &name, &format!("m{i}"), Some(secret.as_str())))
        .collect();
    let first = one_leader(&sidecars, Duration::from_secs(30)).await;
    let token = token_of(&sidecars[first]).await;
    sleep(TTL * 2).await;
    assert_eq!(roster_on(&server, &name).await, ["m0", "m1"]);
    server.stop();
    let one = std::slice::from_ref(&server);
    sidecars.push(start(one, &name, "late", Some(secret.as_str())));
    let w = watch(&sidecars, TTL * 4).await;
    assert_eq!(w.led_until, None, "the leader led throughout");
    assert_eq!(
        w.leaders.len(),
        1,
        "the newcomer never led: {:?}",
        w.leaders
    );
    server.restart().await;
    let after = Instant::now();
    let mut roster = roster_on(&server, &name).await;
    while !roster.contains(&"late".to_owned()) {
        assert!(
            after.elapsed() < Duration::from_secs(30),
            "not admitted: {roster:?}"
        );
        sleep(Duration::from_millis(100)).await;
        roster = roster_on(&server, &name).await;
    }
    println!(
        "redis, newcomer in the outage: never led; admitted {:?} after Redis returned (roster {roster:?}); overlaps 0",
        after.elapsed()
    );
    watch(&sidecars, TTL).await;
    assert_eq!(leaders(&sidecars).await, [first]);
    assert_eq!(token_of(&sidecars[first]).await, token, "same term");
}

/// Safety: on a Redis without persistence (a restart would forget the
/// roster) a sidecar with failsafe never campaigns and says why once.
/// Liveness twin: once appendonly is on, it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_persistence_elects_nobody_with_failsafe_until_appendonly() {
    let server = RedisServer::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let secret = secret_file(dir.path(), "s");
    let name = election("fsr-noaof");
    let one = std::slice::from_ref(&server);
    let sidecars = [start(one, &name, "m0", Some(secret.as_str()))];
    let w = watch(&sidecars, TTL * 4).await;
    assert!(w.leaders.is_empty(), "nobody leads without persistence");
    let log = sidecars[0].log();
    let why = "let a candidate never admitted campaign while a failsafe leader still claims";
    assert_eq!(log.matches(why).count(), 1, "one WARN: {log}");
    let mut c = server.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("yes")
        .query_async(&mut c)
        .await
        .unwrap();
    let on = Instant::now();
    one_leader(&sidecars, Duration::from_secs(30)).await;
    println!(
        "redis without persistence: nobody led for {:?}; led {:?} after appendonly yes",
        TTL * 4,
        on.elapsed()
    );
}
