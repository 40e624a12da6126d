//! The coordination API (locks, semaphores, job claims) on a Redlock group
//! of three real redis-servers, through the library's `RedisCoord`: the
//! verbs work, a minority of servers down is tolerated and a majority is
//! not, and fencing tokens of successive grants grow even when successive
//! majorities differ.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use leader_elector::backend::redis::coord::RedisCoord;
use leader_elector::backend::redis::{RedisBackend, RedisOptions};
use leader_elector::coord::{
    Acquire, CoordError, Coordinator, Grant, Object, Outcome, RwMode, Try, WriteIntent,
};
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(5);

async fn three() -> Vec<RedisServer> {
    vec![
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ]
}

fn coord_on(servers: &[RedisServer], test: &str) -> RedisCoord {
    let backend: Arc<RedisBackend> = RedisBackend::new(
        "leader-elector:",
        &election(test),
        RedisOptions {
            urls: servers.iter().map(|s| s.url.clone()).collect(),
            per_server_timeout: Duration::from_millis(300),
            ..RedisOptions::default()
        },
    )
    .expect("a Redis backend");
    RedisCoord::new(backend)
}

/// Lock `name`.
fn lock(name: &str) -> Acquire<'_> {
    Acquire::Lock(name)
}

/// One of `permits` permits of semaphore `name`.
fn sem(name: &str, permits: u32) -> Acquire<'_> {
    Acquire::Semaphore { name, permits }
}

/// A claim on job `job` of `queue`.
fn job<'a>(queue: &'a str, job: &'a str) -> Acquire<'a> {
    Acquire::Job { queue, job }
}

/// The claim on job `job` of `queue`, to renew or give back.
fn claim_of<'a>(queue: &'a str, job: &'a str) -> Object<'a> {
    Object::Job { queue, job }
}

/// Bound every call: a hang names the verb.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung for 10 s"))
}

fn granted(t: Result<Try, CoordError>, what: &str) -> Grant {
    match t {
        Ok(Try::Acquired(g)) => g,
        other => panic!("{what}: expected a grant, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_semaphores_and_claims_work_on_three_servers() {
    let servers = three().await;
    let c = coord_on(&servers, "redlock-verbs");
    // Lock: granted, held for another, renewed, released, granted again higher.
    let a = granted(
        within("lock", c.acquire(lock("L"), "a", TTL)).await,
        "lock a",
    );
    assert!(a.ttl_ms > 4800 && a.ttl_ms < 5000, "validity {}", a.ttl_ms);
    let held = within("lock", c.acquire(lock("L"), "b", TTL))
        .await
        .unwrap();
    assert_eq!(held, Try::Held("a".into()));
    let renewed = within("renew", c.renew(Object::Lock("L"), &a.token, TTL)).await;
    assert!(matches!(renewed, Ok(Outcome::Ok(Some(_)))), "{renewed:?}");
    let released = within("release", c.release(Object::Lock("L"), &a.token)).await;
    assert_eq!(released.unwrap(), Outcome::Ok(None));
    let again = within("release", c.release(Object::Lock("L"), &a.token)).await;
    assert_eq!(again.unwrap(), Outcome::Gone);
    let b = granted(
        within("lock", c.acquire(lock("L"), "b", TTL)).await,
        "lock b",
    );
    assert!(b.fencing_token > a.fencing_token);
    // Semaphore of 3: three askers get a permit, the fourth is refused.
    let mut permits = Vec::new();
    for i in 0..3 {
        let t = within("semaphore", c.acquire(sem("S", 3), &format!("p{i}"), TTL)).await;
        permits.push(granted(t, "permit"));
    }
    let full = within("semaphore", c.acquire(sem("S", 3), "p3", TTL)).await;
    assert_eq!(full.unwrap(), Try::Full(3));
    let renewed = within(
        "renew",
        c.renew(Object::Semaphore("S"), &permits[1].token, TTL),
    )
    .await;
    assert!(matches!(renewed, Ok(Outcome::Ok(Some(_)))), "{renewed:?}");
    let released = within(
        "release",
        c.release(Object::Semaphore("S"), &permits[1].token),
    )
    .await;
    assert_eq!(released.unwrap(), Outcome::Ok(None));
    let p3 = granted(
        within("semaphore", c.acquire(sem("S", 3), "p3", TTL)).await,
        "permit",
    );
    assert!(permits.iter().all(|p| p.fencing_token < p3.fencing_token));
    // Claim: one claimant, completed once, then reported completed.
    let claim = within("claim", c.acquire(job("q", "j1"), "w1", TTL))
        .await
        .unwrap();
    let Try::Acquired(g) = claim else {
        panic!("expected a claim, got {claim:?}")
    };
    let other = within("claim", c.acquire(job("q", "j1"), "w2", TTL))
        .await
        .unwrap();
    assert_eq!(other, Try::Held("w1".into()));
    let done = within("complete", c.complete("q", "j1", &g.token, TTL)).await;
    assert_eq!(done.unwrap(), Outcome::Ok(None));
    let after = within("claim", c.acquire(job("q", "j1"), "w2", TTL))
        .await
        .unwrap();
    assert_eq!(after, Try::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_granted_with_one_of_three_down_and_refused_with_two() {
    let mut servers = three().await;
    let c = coord_on(&servers, "redlock-minority");
    servers[0].stop();
    let a = granted(
        within("lock", c.acquire(lock("L"), "a", TTL)).await,
        "lock with 2 of 3",
    );
    let renewed = within("renew", c.renew(Object::Lock("L"), &a.token, TTL)).await;
    assert!(matches!(renewed, Ok(Outcome::Ok(Some(_)))), "{renewed:?}");
    let p = within("semaphore", c.acquire(sem("S", 2), "a", TTL)).await;
    granted(p, "permit with 2 of 3");
    servers[1].stop();
    let refused = within("lock", c.acquire(lock("L2"), "b", TTL)).await;
    assert!(
        matches!(refused, Err(CoordError::Backend(_))),
        "a lock with 1 of 3 servers must be refused: {refused:?}"
    );
    let renew = within("renew", c.renew(Object::Lock("L"), &a.token, TTL)).await;
    assert!(renew.is_err(), "a renew on 1 of 3 must fail: {renew:?}");
    let claim = within("claim", c.acquire(job("q", "j"), "b", TTL)).await;
    assert!(claim.is_err(), "a claim on 1 of 3 must fail: {claim:?}");
}

async fn set_on(server: &RedisServer, key: &str, value: Option<&str>) {
    let mut conn = server.conn().await;
    let cmd = match value {
        Some(v) => redis::cmd("SET").arg(key).arg(v).clone(),
        None => redis::cmd("DEL").arg(key).clone(),
    };
    let _: () = cmd.query_async(&mut conn).await.unwrap();
}

/// With per-server counters alone, grants from {1,2}, {2,3}, {1,3} can hand
/// out the same token twice (counters 5, 5, 3 give 6, then 7, then 7 again);
/// the raise round makes them grow. Each grant here has one server refuse (a
/// foreign value on the lock key, so its counter does not move), so the
/// three majorities differ. Without the raise round this test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_grow_across_different_majorities() {
    let servers = three().await;
    let c = coord_on(&servers, "redlock-fencing");
    let key = "leader-elector:{lock:F}";
    let counter = "leader-elector:{lock:F}:fencing";
    for (s, v) in servers.iter().zip(["5", "5", "3"]) {
        set_on(s, counter, Some(v)).await;
    }
    let mut last = 0;
    for refusing in [2, 0, 1] {
        set_on(&servers[refusing], key, Some("other|1|someone")).await;
        let g = granted(within("lock", c.acquire(lock("F"), "x", TTL)).await, "lock");
        within("release", c.release(Object::Lock("F"), &g.token))
            .await
            .unwrap();
        set_on(&servers[refusing], key, None).await;
        assert!(
            g.fencing_token > last,
            "token {} after {last} (server {refusing} refused)",
            g.fencing_token
        );
        last = g.fencing_token;
    }
}

/// On Redlock: with 3 live permits taken at size 3, a
/// request with another size is refused naming the established size (not
/// granted a 4th slot, not told "full"); once no permit is live the name
/// may take another size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_size_belongs_to_its_name_on_three_servers() {
    let servers = three().await;
    let c = coord_on(&servers, "redlock-sem-size");
    let mut permits = Vec::new();
    for i in 0..3 {
        let t = within("semaphore", c.acquire(sem("S", 3), &format!("p{i}"), TTL)).await;
        permits.push(granted(t, "permit"));
    }
    for asked in [5, 2] {
        let r = within("semaphore", c.acquire(sem("S", asked), "other", TTL)).await;
        match &r {
            Err(e) if e.to_string().contains("permits=3") => {}
            other => panic!(
                "permits={asked} on a semaphore of 3: expected a refusal naming permits=3, got {other:?}"
            ),
        }
    }
    for p in &permits {
        let r = within("release", c.release(Object::Semaphore("S"), &p.token)).await;
        assert_eq!(r.unwrap(), Outcome::Ok(None));
    }
    granted(
        within("semaphore", c.acquire(sem("S", 5), "new", TTL)).await,
        "a new size once no permit is live",
    );
}

/// One counter rule for every script: a counter of 16 digits (beyond what a
/// Lua number holds exactly with its successor) is refused by a lock on a
/// Redlock group as it is by the election, and nothing is kept; one of 15
/// digits is counted past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_of_sixteen_digits_is_refused_and_fifteen_are_counted_past() {
    let servers = three().await;
    let c = coord_on(&servers, "redlock-counter-digits");
    let key = "leader-elector:{lock:D}";
    let counter = "leader-elector:{lock:D}:fencing";
    for s in &servers {
        set_on(s, counter, Some("1000000000000000")).await;
    }
    let refused = within("lock", c.acquire(lock("D"), "x", TTL)).await;
    match &refused {
        Err(CoordError::Corrupt { key: k, found }) => {
            assert_eq!(k, counter);
            assert!(found.contains("1000000000000000"), "{found}");
        }
        other => panic!("a 16-digit counter was not refused: {other:?}"),
    }
    for s in &servers {
        let mut conn = s.conn().await;
        let exists: u32 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "the lock was kept on a refusal");
        set_on(s, counter, Some("999999999999990")).await;
    }
    let g = granted(within("lock", c.acquire(lock("D"), "x", TTL)).await, "lock");
    assert!(g.fencing_token > 999_999_999_999_990, "{}", g.fencing_token);
}

fn intent(id: &str) -> WriteIntent {
    WriteIntent {
        id: id.into(),
        ttl: Duration::from_secs(10),
    }
}

/// Read-write locks on three servers. Safety: a writer is refused while
/// readers hold, and readers while a writer holds or waits; liveness twins:
/// readers share, the waiting writer is granted once they release (with a
/// fencing token above theirs), and readers enter once it gives up — also
/// with one server of three down, a majority decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_locks_on_three_servers() {
    let mut servers = three().await;
    let c = coord_on(&servers, "redlock-rw");
    let rw = |name: &'static str, who: &'static str, mode, i: Option<WriteIntent>| {
        let c = &c;
        async move {
            within(
                "rwlock",
                c.acquire(
                    Acquire::RwLock {
                        name,
                        mode,
                        intent: i.as_ref(),
                    },
                    who,
                    TTL,
                ),
            )
            .await
        }
    };
    let a = granted(rw("D", "ra", RwMode::Read, None).await, "reader a");
    let b = granted(rw("D", "rb", RwMode::Read, None).await, "readers share");
    let w = rw("D", "w", RwMode::Write, Some(intent("i1")))
        .await
        .unwrap();
    assert!(
        matches!(&w, Try::Held(h) if h == "ra" || h == "rb"),
        "{w:?}"
    );
    // The writer's intent holds a new reader back, naming the writer.
    let held = rw("D", "rc", RwMode::Read, None).await.unwrap();
    assert_eq!(held, Try::Held("w".into()));
    for g in [&a, &b] {
        let r = within("release", c.release(Object::RwLock("D"), &g.token)).await;
        assert_eq!(r.unwrap(), Outcome::Ok(None));
    }
    let wg = granted(
        rw("D", "w", RwMode::Write, Some(intent("i1"))).await,
        "writer",
    );
    assert!(wg.fencing_token > a.fencing_token.max(b.fencing_token));
    let held = rw("D", "rd", RwMode::Read, None).await.unwrap();
    assert_eq!(held, Try::Held("w".into()));
    let renewed = within("renew", c.renew(Object::RwLock("D"), &wg.token, TTL)).await;
    assert!(matches!(renewed, Ok(Outcome::Ok(Some(_)))), "{renewed:?}");
    let r = within("release", c.release(Object::RwLock("D"), &wg.token)).await;
    assert_eq!(r.unwrap(), Outcome::Ok(None));
    let again = within("release", c.release(Object::RwLock("D"), &wg.token)).await;
    assert_eq!(again.unwrap(), Outcome::Gone);
    // One server down: a reader holds, a writer waits and gives up, a
    // reader enters at once.
    servers[2].stop();
    let e = granted(rw("E", "re", RwMode::Read, None).await, "reader on 2 of 3");
    let w = rw("E", "w2", RwMode::Write, Some(intent("i2")))
        .await
        .unwrap();
    assert_eq!(w, Try::Held("re".into()));
    assert_eq!(
        rw("E", "rf", RwMode::Read, None).await.unwrap(),
        Try::Held("w2".into())
    );
    within("give up", c.give_up("E", "i2")).await.unwrap();
    let f = granted(
        rw("E", "rf", RwMode::Read, None).await,
        "a reader after the give-up",
    );
    assert!(f.fencing_token > e.fencing_token);
    let gone = within("renew", c.renew(Object::RwLock("E"), &wg.token, TTL)).await;
    assert_eq!(gone.unwrap(), Outcome::Gone);
}

/// Job claims on three servers are renewed and given back; a given-back
/// job is claimed at once by another, and the old token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_claims_renew_and_give_back_on_three_servers() {
    let servers = three().await;
    let c = coord_on(&servers, "redlock-jobs");
    let claim = |who: &'static str| {
        let c = &c;
        async move {
            within("claim", c.acquire(job("q", "j"), who, TTL))
                .await
                .unwrap()
        }
    };
    let Try::Acquired(a) = claim("wa").await else {
        panic!("the first claim")
    };
    let renewed = within("renew", c.renew(claim_of("q", "j"), &a.token, TTL)).await;
    assert!(matches!(renewed, Ok(Outcome::Ok(Some(_)))), "{renewed:?}");
    assert_eq!(claim("wb").await, Try::Held("wa".into()));
    let given = within("give back", c.release(claim_of("q", "j"), &a.token)).await;
    assert_eq!(given.unwrap(), Outcome::Ok(None));
    let Try::Acquired(b) = claim("wb").await else {
        panic!("claimed at once after a give-back")
    };
    assert!(b.fencing_token > a.fencing_token);
    let old = within("renew", c.renew(claim_of("q", "j"), &a.token, TTL)).await;
    assert_eq!(old.unwrap(), Outcome::NotYours);
    let old = within("give back", c.release(claim_of("q", "j"), &a.token)).await;
    assert_eq!(old.unwrap(), Outcome::NotYours);
}
