//! Shard ownership on a real backend (issue 49): sidecars started with
//! `--shards 16`, every member's `GET /shards` sampled every ~15 ms while
//! the set scales 3 → 5 → 2 by SIGTERM, then an owner is SIGKILLed and
//! another SIGSTOPped. Safety: per shard, the tokens seen in time order
//! never go down (two owners at once would interleave two tokens), and a
//! member never claims a shard with a token another member claimed.
//! Liveness: after each change every shard is claimed by exactly one member
//! again within the bound (graceful: 1 s; crash: the lease and 1.5 s);
//! after settling the shares are within one of each other.

use std::collections::BTreeMap;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::{Instant, sleep};

use crate::support::etcd::Etcd;
use crate::support::http::http_get;
use crate::support::redis_server::RedisServer;
use crate::support::sidecar::{FAST, Sidecar, election, redis_sidecar};

const N: usize = 16;
const LEASE: Duration = Duration::from_secs(2);

/// One answer of `/shards`: when it was asked and answered, who, what.
struct Seen {
    sent: Instant,
    got: Instant,
    member: String,
    shards: Vec<(usize, u64)>,
}

async fn sample(s: &Sidecar) -> Option<Seen> {
    let sent = Instant::now();
    let (status, body) = http_get(s.port, "/shards").await.ok()?;
    let got = Instant::now();
    assert_eq!(status, 200, "{}: {body}", s.identity);
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let shards = v["shards"]
        .as_array()?
        .iter()
        .map(|x| {
            let id = x["id"].as_u64().unwrap() as usize;
            (id, x["fencing_token"].as_u64().unwrap())
        })
        .collect();
    Some(Seen {
        sent,
        got,
        member: s.identity.clone(),
        shards,
    })
}

/// The samples of a run and the checks on them.
#[derive(Default)]
struct Book {
    /// Per shard: (sent, got, member, token) in order of sending.
    seen: BTreeMap<usize, Vec<(Instant, Instant, String, u64)>>,
}

impl Book {
    fn add(&mut self, s: &Seen) {
        for &(id, token) in &s.shards {
            self.seen
                .entry(id)
                .or_default()
                .push((s.sent, s.got, s.member.clone(), token));
        }
    }

    /// Tokens per shard never go down between two answers that did not
    /// overlap in time, and one token is one member's.
    fn check(&self) {
        for (id, v) in &self.seen {
            let mut by_token: BTreeMap<u64, &str> = BTreeMap::new();
            for (_, _, m, t) in v {
                if let Some(other) = by_token.insert(*t, m) {
                    assert_eq!(other, m, "shard {id}: token {t} claimed by {other} and {m}");
                }
            }
            for (i, a) in v.iter().enumerate() {
                for b in &v[i + 1..] {
                    if a.1 < b.0 {
                        assert!(
                            b.3 >= a.3,
                            "shard {id}: {} claimed token {} after {} claimed {} (two owners)",
                            b.2,
                            b.3,
                            a.2,
                            a.3
                        );
                    }
                }
            }
        }
    }
}

/// Sample every sidecar in `live` until every shard is claimed by exactly
/// one of them in one sweep and their shares are within one of each other,
/// within `limit`; answers how long that took and the owner counts.
async fn settle(
    book: &mut Book,
    live: &[&Sidecar],
    from: Instant,
    limit: Duration,
    what: &str,
) -> (Duration, BTreeMap<String, usize>) {
    loop {
        let answers = futures_util::future::join_all(live.iter().map(|s| sample(s))).await;
        let mut owner: BTreeMap<usize, String> = BTreeMap::new();
        let mut twice = false;
        for a in answers.iter().flatten() {
            book.add(a);
            for &(id, _) in &a.shards {
                twice |= owner.insert(id, a.member.clone()).is_some();
            }
        }
        let mut counts = BTreeMap::new();
        for m in owner.values() {
            *counts.entry(m.clone()).or_insert(0) += 1;
        }
        let (lo, hi) = (N / live.len(), N.div_ceil(live.len()));
        let even = counts.len() == live.len() && counts.values().all(|&c| c >= lo && c <= hi);
        if owner.len() == N && !twice && even {
            return (from.elapsed(), counts);
        }
        if from.elapsed() > limit {
            let logs: Vec<String> = live
                .iter()
                .map(|s| format!("--- {}:\n{}", s.identity, s.log()))
                .collect();
            panic!(
                "{what}: not every shard owned once within {limit:?}: {owner:?}\n{}",
                logs.join("\n")
            );
        }
        sleep(Duration::from_millis(15)).await;
    }
}

/// Sample for `span` (safety only).
async fn watch(book: &mut Book, live: &[&Sidecar], span: Duration) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        for a in futures_util::future::join_all(live.iter().map(|s| sample(s)))
            .await
            .iter()
            .flatten()
        {
            book.add(a);
        }
        sleep(Duration::from_millis(15)).await;
    }
}

fn balanced(counts: &BTreeMap<String, usize>, members: usize, what: &str) {
    let (lo, hi) = (N / members, N.div_ceil(members));
    assert_eq!(counts.len(), members, "{what}: {counts:?}");
    assert!(
        counts.values().all(|&c| c >= lo && c <= hi),
        "{what}: unbalanced {counts:?}"
    );
}

/// 3 → 5: each join settles within 1 s of the newcomer answering.
async fn joins(book: &mut Book, all: &mut Vec<Sidecar>, start: &impl Fn(&str) -> Sidecar) {
    for id in ["m4", "m5"] {
        let s = start(id);
        let up = Instant::now();
        while sample(&s).await.is_none() {
            sleep(Duration::from_millis(10)).await;
        }
        all.push(s);
        let refs: Vec<&Sidecar> = all.iter().collect();
        let (took, counts) = settle(book, &refs, up, Duration::from_secs(1), id).await;
        eprintln!("join of {id}: settled {took:?} after it answered: {counts:?}");
        watch(book, &refs, Duration::from_millis(600)).await;
        let (_, counts) = settle(book, &refs, Instant::now(), LEASE, id).await;
        balanced(&counts, all.len(), id);
    }
}

/// 5 → 2 by SIGTERM: each leave settles within 1 s of the exit.
async fn leaves(book: &mut Book, all: &mut Vec<Sidecar>) {
    for _ in 0..3 {
        let mut gone = all.remove(0);
        gone.signal(Signal::SIGTERM);
        gone.wait_exit(Duration::from_secs(10))
            .await
            .expect("exits on SIGTERM");
        let exited = Instant::now();
        let refs: Vec<&Sidecar> = all.iter().collect();
        let (took, counts) =
            settle(book, &refs, exited, Duration::from_secs(1), &gone.identity).await;
        eprintln!(
            "leave of {}: settled {took:?} after its exit: {counts:?}",
            gone.identity
        );
        balanced(&counts, all.len(), &gone.identity);
    }
}

/// SIGKILL of an owner, then SIGSTOP of another: each settles within the
/// lease and 1.5 s; the stopped one, continued, claims only what it holds.
async fn kill_and_stop(book: &mut Book, all: &mut Vec<Sidecar>) {
    let refs: Vec<&Sidecar> = all.iter().collect();
    settle(
        book,
        &refs,
        Instant::now(),
        Duration::from_secs(5),
        "m6 joins",
    )
    .await;
    watch(book, &refs, Duration::from_millis(600)).await;
    let mut dead = all.remove(0);
    dead.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let _ = dead.wait_exit(Duration::from_secs(5)).await;
    let refs: Vec<&Sidecar> = all.iter().collect();
    let (took, counts) = settle(
        book,
        &refs,
        killed,
        LEASE + Duration::from_millis(1500),
        "SIGKILL",
    )
    .await;
    eprintln!("SIGKILL of {}: settled {took:?}: {counts:?}", dead.identity);
    balanced(&counts, 2, "after SIGKILL");

    // SIGSTOP of an owner: the other owns all within lease + 1.5 s, and the
    // stopped one, continued, claims nothing it no longer holds.
    let stopped = all.remove(0);
    stopped.signal(Signal::SIGSTOP);
    let at = Instant::now();
    let refs: Vec<&Sidecar> = all.iter().collect();
    let (took, _) = settle(
        book,
        &refs,
        at,
        LEASE + Duration::from_millis(1500),
        "SIGSTOP",
    )
    .await;
    eprintln!("SIGSTOP of {}: settled {took:?}", stopped.identity);
    stopped.signal(Signal::SIGCONT);
    all.push(stopped);
    let refs: Vec<&Sidecar> = all.iter().collect();
    watch(book, &refs, Duration::from_secs(1)).await;
    let (_, counts) = settle(book, &refs, Instant::now(), LEASE * 3, "SIGCONT").await;
    balanced(&counts, 2, "after SIGCONT");
}

#[tokio::test]
async fn etcd_shards_scale_3_5_2_then_a_kill_and_a_stop_with_never_two_owners() {
    let etcd = Etcd::start().await;
    let name = election("shards-etcd");
    let start = |id: &str| {
        let mut flags = FAST.to_vec();
        flags.extend(["--shards", "16"]);
        Sidecar::start(&etcd.url, &name, id, &flags)
    };
    scenario(&start).await;
}

/// 3 members, 3 → 5 → 2, then a kill and a stop (see the module doc).
async fn scenario(start: &impl Fn(&str) -> Sidecar) {
    let mut book = Book::default();
    let mut all: Vec<Sidecar> = ["m1", "m2", "m3"].iter().map(|id| start(id)).collect();
    let refs: Vec<&Sidecar> = all.iter().collect();
    let (took, counts) = settle(
        &mut book,
        &refs,
        Instant::now(),
        Duration::from_secs(15),
        "3 members",
    )
    .await;
    balanced(&counts, 3, "3 members");
    eprintln!("3 members settled in {took:?}: {counts:?}");

    joins(&mut book, &mut all, start).await;
    leaves(&mut book, &mut all).await;
    all.push(start("m6"));
    kill_and_stop(&mut book, &mut all).await;
    book.check();
}

/// The same scenario on one Redis server (a fresh server grants no shard
/// for its first TTL + 1 s: the restart hold-off).
#[tokio::test]
async fn redis_shards_scale_3_5_2_then_a_kill_and_a_stop_with_never_two_owners() {
    let redis = RedisServer::start().await;
    let name = election("shards-redis");
    let url = redis.url.clone();
    let start = |id: &str| {
        let mut flags = FAST.to_vec();
        flags.extend(["--shards", "16"]);
        redis_sidecar(&[url.as_str()], &name, id, &flags)
    };
    scenario(&start).await;
}

/// The stderr of a start with `--shards <value>`, which must exit 2.
fn refused_shards(etcd: &str, value: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args([
            "--election",
            "x",
            "--etcd-endpoints",
            etcd,
            "--shards",
            value,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--shards {value}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn shards_answers_404_without_the_flag_and_the_flag_is_checked() {
    let etcd = Etcd::start().await;
    let s = Sidecar::start(&etcd.url, &election("shards-off"), "a", FAST);
    let (status, body) = http_get(s.port, "/shards").await.unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--shards"), "{body}");
    let err = refused_shards(&etcd.url, "5000");
    assert!(
        err.contains("--shards (5000) must be between 1 and 4096"),
        "{err}"
    );
    // A negative number names the flag (clap's own message suggested `-- -1`).
    let err = refused_shards(&etcd.url, "-1");
    assert!(err.contains("--shards") && !err.contains("-- -1"), "{err}");
    // A wrong method gets a JSON error, as on every other route.
    let (status, body) =
        crate::support::http::http_request(s.port, "POST", "/shards", None, Duration::from_secs(5))
            .await
            .unwrap();
    assert_eq!(status, 405, "{body}");
    assert!(body.contains("\"error\""), "{body}");
}
