//! The sidecar against real `redis-server` processes: single instance and
//! Redlock (3 and 5 servers), handover, failover, pauses, outages, a
//! write-denied ACL user, and configuration errors.

mod support;

use std::time::Duration;

use nix::sys::signal::Signal;
use support::*;
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(500);

fn three(urls: &[&str], election: &str) -> Vec<Sidecar> {
    ["a", "b", "c"]
        .iter()
        .map(|id| redis_sidecar(urls, election, id, FAST))
        .collect()
}

async fn watch_no_overlap(sidecars: &[Sidecar], limit: Duration) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let l = leaders(sidecars).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Wait for a leader other than `old`, asserting no overlap meanwhile.
async fn next_leader(cs: &[Sidecar], old: usize, limit: Duration) -> (usize, Duration) {
    let start = Instant::now();
    loop {
        let l = leaders(cs).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        if let Some(i) = l.first().filter(|i| **i != old) {
            return (*i, start.elapsed());
        }
        assert!(start.elapsed() < limit, "no leader within {limit:?}");
        sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_redis_elects_hands_over_and_fails_over_with_growing_tokens() {
    let redis = RedisServer::start().await;
    let mut cs = three(&[&redis.url], &election("redis-handover"));
    let first = one_leader(&cs, Duration::from_secs(10)).await;
    let (_, body) = cs[first].leader().await.unwrap();
    assert_eq!(body["backend"], "redis");
    let t1 = token_of(&cs[first]).await;

    cs[first].signal(Signal::SIGTERM);
    let (second, took) = next_leader(&cs, first, Duration::from_secs(2)).await;
    eprintln!("graceful handover over pub/sub: {took:?}");
    assert!(
        took < Duration::from_millis(500),
        "handover took {took:?}: the release notice was not used"
    );
    assert_eq!(
        cs[first]
            .wait_exit(Duration::from_secs(3))
            .await
            .and_then(|s| s.code()),
        Some(0)
    );
    let t2 = token_of(&cs[second]).await;
    assert!(t2 > t1, "fencing token grows: {t1} then {t2}");

    cs[second].signal(Signal::SIGKILL);
    let (third, took) = next_leader(&cs, second, TTL + RETRY + Duration::from_secs(1)).await;
    eprintln!("crash failover: {took:?}");
    assert!(third != first && third != second);
    assert!(token_of(&cs[third]).await > t2);
    one_leader(&cs, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_leader_answers_not_leader_first_after_sigcont() {
    let redis = RedisServer::start().await;
    let cs = three(&[&redis.url], &election("redis-pause"));
    let old = one_leader(&cs, Duration::from_secs(10)).await;
    cs[old].signal(Signal::SIGSTOP);
    sleep(TTL + RETRY + Duration::from_millis(500)).await;
    cs[old].signal(Signal::SIGCONT);
    let (status, body) = cs[old].leader().await.expect("answers");
    assert_eq!(status, 503, "{body}");
    watch_no_overlap(&cs, Duration::from_secs(1)).await;
    one_leader(&cs, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_longer_than_the_ttl_then_back() {
    let mut redis = RedisServer::start().await;
    let mut cs = three(&[&redis.url], &election("redis-outage"));
    let old = one_leader(&cs, Duration::from_secs(10)).await;
    let (_, body) = cs[old].leader().await.unwrap();
    let valid_for = Duration::from_millis(body["valid_for_ms"].as_u64().unwrap());
    let stopped = Instant::now();
    redis.stop();
    loop {
        let l = leaders(&cs).await;
        if stopped.elapsed() > valid_for + Duration::from_millis(20) {
            assert!(l.is_empty(), "{l:?} still claims after valid_until");
        }
        assert!(
            l.iter().all(|i| *i == old),
            "a follower claimed while Redis was down"
        );
        if stopped.elapsed() > TTL * 2 {
            break;
        }
        sleep(Duration::from_millis(5)).await;
    }
    for s in &cs {
        assert_eq!(http_get(s.port, "/readyz").await.unwrap().0, 503);
        assert_eq!(http_get(s.port, "/healthz").await.unwrap().0, 200);
    }
    redis.restart().await;
    one_leader(&cs, TTL * 2 + Duration::from_secs(3)).await;
    watch_no_overlap(&cs, Duration::from_secs(1)).await;
    for s in &mut cs {
        assert!(s.exited().is_none(), "{} exited", s.identity);
    }
}

async fn redlock(n: usize) {
    let mut servers = Vec::new();
    for _ in 0..n {
        servers.push(RedisServer::start().await);
    }
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let cs = three(&refs, &election(&format!("redlock{n}")));
    let first = one_leader(&cs, Duration::from_secs(10)).await;
    let (_, body) = cs[first].leader().await.unwrap();
    assert_eq!(body["servers_total"], n);
    let t1 = token_of(&cs[first]).await;

    // Lose a minority: one leader stays (or comes back quickly).
    let minority = (n - 1) / 2;
    for s in servers.iter_mut().take(minority) {
        s.stop();
    }
    watch_no_overlap(&cs, TTL).await;
    let l = one_leader(&cs, TTL * 2).await;
    let (_, body) = cs[l].leader().await.unwrap();
    assert_eq!(body["servers_answered"], n - minority, "{body}");
    assert!(token_of(&cs[l]).await >= t1);

    // Lose a majority: nobody claims after the validity time.
    servers[minority].stop();
    let lost = Instant::now();
    loop {
        let l = leaders(&cs).await;
        assert!(l.len() <= 1);
        if lost.elapsed() > TTL + Duration::from_millis(100) {
            assert!(l.is_empty(), "{l:?} claims without a quorum");
        }
        if lost.elapsed() > TTL * 2 {
            break;
        }
        sleep(Duration::from_millis(5)).await;
    }
    // Servers back (empty, no persistence): one leader again.
    for s in servers.iter_mut().take(minority + 1) {
        s.restart().await;
    }
    one_leader(&cs, TTL * 3).await;
    watch_no_overlap(&cs, Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_three_servers_survives_a_minority_and_stops_without_a_quorum() {
    redlock(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_five_servers_survives_a_minority_and_stops_without_a_quorum() {
    redlock(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_denied_user_makes_the_leader_step_down_by_valid_until() {
    let redis = RedisServer::start().await;
    let mut admin = redis.conn().await;
    redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">app-secret", "~*", "&*", "+@all"])
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "app-secret\n").unwrap();
    let url = format!("redis://app@127.0.0.1:{}", redis.port);
    let name = election("redis-acl");
    let mut extra: Vec<&str> = FAST.to_vec();
    extra.extend(["--redis-password-file", pw.to_str().unwrap()]);
    let s = redis_sidecar(&[&url], &name, "writer", &extra);
    wait_for(Duration::from_secs(10), "the ACL user to lead", || {
        s.is_leader()
    })
    .await;
    let (_, body) = s.leader().await.unwrap();
    let valid_for = Duration::from_millis(body["valid_for_ms"].as_u64().unwrap());
    redis::cmd("ACL")
        .arg(&["SETUSER", "app", "-@write"])
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let denied = Instant::now();
    wait_for(
        valid_for + Duration::from_millis(200),
        "the leader to step down",
        || async { !s.is_leader().await },
    )
    .await;
    assert!(denied.elapsed() <= valid_for + Duration::from_millis(50));
    // Redis still shows its value: only the sidecar's own clock ended the term.
    let key = format!("leader-elector:{{{name}}}");
    let value: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(value.is_some_and(|v| v.ends_with("|writer")));
    wait_for(
        Duration::from_secs(3),
        "the NOPERM reason in /leader",
        || async {
            s.leader().await.is_some_and(|(_, b)| {
                b["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("rejected the credentials or permissions"))
            })
        },
    )
    .await;
    let (_, metrics) = http_get(s.port, "/metrics").await.unwrap();
    assert!(metrics.contains("reason=\"auth\""), "{metrics}");
    assert!(!s.log().contains("app-secret"), "a password was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_of_another_type_is_reported_as_wrongtype() {
    let redis = RedisServer::start().await;
    let name = election("redis-wrongtype");
    let mut c = redis.conn().await;
    redis::cmd("HSET")
        .arg(format!("leader-elector:{{{name}}}"))
        .arg("f")
        .arg("v")
        .query_async::<()>(&mut c)
        .await
        .unwrap();
    let s = redis_sidecar(&[&redis.url], &name, "x", FAST);
    wait_for(Duration::from_secs(5), "a WRONGTYPE report", || async {
        s.leader().await.is_some_and(|(status, b)| {
            assert_ne!(status, 200);
            b["error"].as_str().is_some_and(|e| e.contains("wrongtype"))
        })
    })
    .await;
}

#[test]
fn redis_configuration_errors_exit_2() {
    let bin = env!("CARGO_BIN_EXE_leader-elector");
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--election",
                "x",
                "--etcd-endpoints",
                "http://127.0.0.1:1",
                "--redis-url",
                "redis://127.0.0.1:2",
            ],
            "--backend etcd or --backend redis",
        ),
        (
            &["--election", "x", "--redis-url", "redis//nope"],
            "--redis-url",
        ),
        (
            &["--election", "x", "--redis-url", "http://user:hunter2@h:1"],
            "--redis-url",
        ),
    ];
    for (args, expected) in cases {
        let out = std::process::Command::new(bin)
            .args(*args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("hunter2"),
            "a password was printed: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_even_number_of_redlock_servers_warns_about_the_quorum() {
    let a = RedisServer::start().await;
    let b = RedisServer::start().await;
    let s = redis_sidecar(&[&a.url, &b.url], &election("even"), "x", FAST);
    wait_for(
        Duration::from_secs(10),
        "the two-server sidecar to lead",
        || s.is_leader(),
    )
    .await;
    assert!(
        s.log().contains("even number of Redlock servers"),
        "{}",
        s.log()
    );
}
