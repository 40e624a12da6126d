//! The coordination API (locks, fair locks, semaphores, job claims) through
//! a real sidecar's control listener, on real etcd, real Redis and the
//! Kubernetes API stand-in (the Lease backend).

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::*;
use rand::Rng;
use serde_json::Value;
use tokio::time::{Instant, sleep};

/// How long a control call may take: `wait`s of these tests are shorter.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// One HTTP request to the control API; returns the status and JSON body
/// (`Value::Null` when the body is not JSON). Panics when there is no HTTP
/// answer within [`CALL_LIMIT`], with what probably hung or died.
pub(crate) async fn call(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    http_json(port, method, path, body, CALL_LIMIT)
        .await
        .unwrap_or_else(|e| panic!("the control API (did the sidecar die or hang?): {e}"))
}

pub(crate) use crate::support::backends::Backend;

/// A sidecar with its control API on a port the kernel chose, for `kind`
/// (the stand-in serves namespace `coord`).
pub(crate) async fn sidecar(kind: &str, test: &str) -> (Backend, Sidecar, u16) {
    let flags: Vec<String> = FAST.iter().chain(CONTROL).map(|s| s.to_string()).collect();
    let mut backend = match kind {
        "kubernetes" => Backend::kubernetes("coord"),
        other => Backend::start(other).await,
    };
    let s = backend.sidecar(&election(test), "me", &flags).await;
    // Bound before the "starting" line: connections queue until it serves.
    let port = s.control();
    (backend, s, port)
}

/// 20 clients x 50 rounds of acquire / read / write+1 / release on a shared file.
/// With `kill_every`, one in that many rounds the client "dies" holding the
/// lock (it neither writes nor releases); its lock must expire.
async fn lost_update(kind: &str, kill_every: Option<u32>) {
    let (_b, _s, port) = sidecar(kind, &format!("lost-update-{kind}")).await;
    let dir = tempfile::TempDir::new().unwrap();
    let file = Arc::new(dir.path().join("counter"));
    std::fs::write(&*file, "0").unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let last_fence = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..20u32 {
        let (file, done, last_fence) = (file.clone(), done.clone(), last_fence.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..50u32 {
                let (st, g) = call(port, "POST", "/locks/counter?ttl=2s&wait=60s", None).await;
                assert_eq!(st, 200, "acquire: {g}");
                let fence = g["fencing_token"].as_u64().unwrap();
                let prev = last_fence.fetch_max(fence, Ordering::SeqCst);
                assert!(
                    fence > prev,
                    "fencing token went backwards: {prev} then {fence}"
                );
                if kill_every.is_some_and(|k| (c * 50 + round) % k == k - 1) {
                    continue; // died holding the lock
                }
                let n: u64 = std::fs::read_to_string(&*file)
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                std::fs::write(&*file, (n + 1).to_string()).unwrap();
                done.fetch_add(1, Ordering::SeqCst);
                let token = g["token"].as_str().unwrap();
                let (st, b) = call(
                    port,
                    "DELETE",
                    "/locks/counter",
                    Some(&format!("{{\"token\":\"{token}\"}}")),
                )
                .await;
                assert_eq!(st, 200, "release: {b}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n: usize = std::fs::read_to_string(&*file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(n, done.load(Ordering::SeqCst), "lost updates");
    if kill_every.is_none() {
        assert_eq!(n, 1000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_updates_on_etcd() {
    lost_update("etcd", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_updates_on_redis() {
    lost_update("redis", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_updates_on_kubernetes() {
    lost_update("kubernetes", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_updates_when_clients_die_holding_the_lock() {
    // 5 deaths on each backend, each costing one lock TTL.
    lost_update("etcd", Some(200)).await;
    lost_update("redis", Some(200)).await;
}

async fn paused_client(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("paused-{kind}")).await;
    let (st, a) = call(port, "POST", "/locks/res?ttl=2s", None).await;
    assert_eq!(st, 200, "{a}");
    // While A holds it, B is refused with the holder's name.
    let (st, held) = call(port, "POST", "/locks/res?ttl=2s&owner=b", None).await;
    assert_eq!(st, 409);
    assert_eq!(held["holder"], "me");
    // A "pauses" past its TTL; B takes the lock.
    sleep(Duration::from_millis(3200)).await;
    let (st, b) = call(port, "POST", "/locks/res?ttl=10s&owner=b&wait=2s", None).await;
    assert_eq!(st, 200, "{b}");
    assert!(
        b["fencing_token"].as_u64() > a["fencing_token"].as_u64(),
        "{a} then {b}"
    );
    let ta = a["token"].as_str().unwrap();
    // A wakes up: it cannot renew (410, never re-created) nor release B's lock (409).
    let (st, r) = call(port, "POST", &format!("/locks/res/renew?token={ta}"), None).await;
    assert_eq!(st, 410, "{r}");
    let (st, r) = call(port, "DELETE", &format!("/locks/res?token={ta}"), None).await;
    assert_eq!(st, 409, "{r}");
    // B still holds it and can renew and release.
    let tb = b["token"].as_str().unwrap();
    assert_eq!(
        call(
            port,
            "POST",
            &format!("/locks/res/renew?token={tb}&ttl=10s"),
            None
        )
        .await
        .0,
        200
    );
    assert_eq!(
        call(port, "DELETE", &format!("/locks/res?token={tb}"), None)
            .await
            .0,
        200
    );
    // A renew of an expired, released lock never re-creates it.
    assert_eq!(
        call(port, "POST", &format!("/locks/res/renew?token={tb}"), None)
            .await
            .0,
        410
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_client_cannot_renew_or_release_on_etcd() {
    paused_client("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_client_cannot_renew_or_release_on_redis() {
    paused_client("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_client_cannot_renew_or_release_on_kubernetes() {
    paused_client("kubernetes").await;
}

/// Live permits in Redis's sorted set right now (the script keeps it exact).
async fn live_permits(b: &Backend, name: &str) -> Option<usize> {
    match b {
        // etcd holds a waiting candidate's key briefly before it knows it lost,
        // so a raw key count is not the number of holders: see the clients' own count.
        Backend::Etcd(_) | Backend::EtcdCluster(_) | Backend::Redlock(_) | Backend::Kube(..) => {
            None
        }
        Backend::Redis(r) => {
            let mut c = r.conn().await;
            let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
            let now = secs * 1000 + micros / 1000;
            Some(
                redis::cmd("ZCOUNT")
                    .arg(format!("leader-elector:{{sem:{name}}}"))
                    .arg(format!("({now}"))
                    .arg("+inf")
                    .query_async(&mut c)
                    .await
                    .unwrap(),
            )
        }
    }
}

/// Holders as the clients see them: from the grant's answer until the
/// release is sent, or until request-sent + TTL for an abandoned permit.
/// Each interval lies inside the true holding time, so a count above N is a
/// real violation.
#[derive(Default)]
struct Holders(std::sync::Mutex<Vec<(u64, Instant, Instant)>>);

impl Holders {
    fn live(&self, now: Instant) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, from, to)| *from <= now && now < *to)
            .count()
    }
}

async fn semaphore(kind: &str) {
    let (b, _s, port) = sidecar(kind, &format!("sem-{kind}")).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acquired = Arc::new(AtomicUsize::new(0));
    let holders = Arc::new(Holders::default());
    let far = Instant::now() + Duration::from_secs(3600);
    let mut tasks = Vec::new();
    for c in 0..10 {
        let (stop, acquired, holders) = (stop.clone(), acquired.clone(), holders.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let sent = Instant::now();
                let (st, g) = call(
                    port,
                    "POST",
                    "/semaphores/pool?permits=3&ttl=2s&wait=1s",
                    None,
                )
                .await;
                if st != 200 {
                    assert_eq!(st, 409, "{g}");
                    continue;
                }
                let got = Instant::now();
                let id = acquired.fetch_add(1, Ordering::SeqCst) as u64;
                holders.0.lock().unwrap().push((id, got, far));
                let live = holders.live(got);
                assert!(live <= 3, "{live} holders of 3 permits");
                let hold = rand::rng().random_range(5..40);
                sleep(Duration::from_millis(hold)).await;
                // Client 0 abandons every 10th permit: it must expire, not leak.
                let abandon = c == 0 && i % 10 == 0;
                {
                    let mut h = holders.0.lock().unwrap();
                    let entry = h.iter_mut().find(|e| e.0 == id).unwrap();
                    entry.2 = if abandon {
                        sent + Duration::from_secs(2)
                    } else {
                        Instant::now()
                    };
                }
                if abandon {
                    continue;
                }
                let t = g["token"].as_str().unwrap();
                let (st, r) =
                    call(port, "DELETE", &format!("/semaphores/pool?token={t}"), None).await;
                assert_eq!(st, 200, "{r}");
            }
        }));
    }
    let end = Instant::now() + Duration::from_secs(8);
    let mut max = 0;
    let mut samples = 0;
    while Instant::now() < end {
        if let Some(live) = live_permits(&b, "pool").await {
            max = max.max(live);
            assert!(live <= 3, "{live} live permits of 3 in Redis");
        } else {
            max = max.max(holders.live(Instant::now()));
            sleep(Duration::from_millis(2)).await;
        }
        samples += 1;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    eprintln!(
        "{kind}: {samples} samples, max {max} live permits, {} acquisitions",
        acquired.load(Ordering::SeqCst)
    );
    assert!(acquired.load(Ordering::SeqCst) > 50);
    assert!(
        max >= 2,
        "the semaphore never held more than one permit at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphore_never_has_more_than_n_live_permits_on_etcd() {
    semaphore("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphore_never_has_more_than_n_live_permits_on_redis() {
    semaphore("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphore_never_has_more_than_n_live_permits_on_kubernetes() {
    semaphore("kubernetes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_locks_serve_waiters_in_arrival_order() {
    fair_order("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_locks_serve_waiters_in_arrival_order_on_kubernetes() {
    fair_order("kubernetes").await;
}

async fn fair_order(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("fair-{kind}")).await;
    let (st, first) = call(port, "POST", "/locks/queue?fair=true&ttl=5s", None).await;
    assert_eq!(st, 200, "{first}");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..6 {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let (st, g) = call(
                port,
                "POST",
                &format!("/locks/queue?fair=true&ttl=5s&wait=20s&owner=w{w}"),
                None,
            )
            .await;
            assert_eq!(st, 200, "{g}");
            order.lock().unwrap().push(w);
            sleep(Duration::from_millis(30)).await;
            let t = g["token"].as_str().unwrap().to_owned();
            assert_eq!(
                call(port, "DELETE", &format!("/locks/queue?token={t}"), None)
                    .await
                    .0,
                200
            );
        }));
        // Arrive in order.
        sleep(Duration::from_millis(100)).await;
    }
    let t = first["token"].as_str().unwrap();
    assert_eq!(
        call(port, "DELETE", &format!("/locks/queue?token={t}"), None)
            .await
            .0,
        200
    );
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_locks_on_redis_answer_400_saying_they_need_etcd() {
    let (_b, _s, port) = sidecar("redis", "fair-redis").await;
    let (st, e) = call(port, "POST", "/locks/q?fair=true", None).await;
    assert_eq!(st, 400);
    assert!(e["error"].as_str().unwrap().contains("etcd"), "{e}");
}

/// Jobs completed per job id, as the workers noted them.
type Noted = Arc<std::sync::Mutex<HashMap<u32, u32>>>;

/// A worker claiming and completing jobs 0..1000 of queue `q` from a random
/// start, until a whole pass claims nothing.
fn job_worker(port: u16, completed: Noted) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let mut progressed = false;
            // Start at a random job so workers spread out.
            let start = rand::rng().random_range(0..1000u32);
            for k in 0..1000u32 {
                let job = (start + k) % 1000;
                let (st, g) =
                    call(port, "POST", &format!("/jobs/q/{job}/claim?ttl=1s"), None).await;
                if st != 200 {
                    assert_eq!(st, 409, "{g}");
                    continue;
                }
                progressed = true;
                let t = g["token"].as_str().unwrap().to_owned();
                let (st, r) = call(
                    port,
                    "POST",
                    &format!("/jobs/q/{job}/complete"),
                    Some(&format!("{{\"token\":\"{t}\"}}")),
                )
                .await;
                if st == 200 {
                    *completed.lock().unwrap().entry(job).or_default() += 1;
                } else {
                    assert!(st == 410 || st == 409, "{r}");
                }
            }
            if !progressed {
                return;
            }
        }
    })
}

/// 1000 jobs, five workers killed and restarted at random while they work:
/// every job ends completed exactly once.
async fn jobs(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("jobs-{kind}")).await;
    let completed: Noted = Arc::default();
    // Throughput, not a bound of the contract: on a busy 2-core machine
    // with other suites' servers beside it, 1000 etcd claims and
    // completions plus the empty passes took over 90 s once (CI).
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut workers: Vec<_> = (0..5)
        .map(|_| job_worker(port, completed.clone()))
        .collect();
    // Kill and restart workers at random while they work.
    for _ in 0..8 {
        sleep(Duration::from_millis(rand::rng().random_range(50..300))).await;
        let i = rand::rng().random_range(0..workers.len());
        workers[i].abort();
        workers[i] = job_worker(port, completed.clone());
    }
    // Claims held by killed workers expire after 1 s; the rest finish. A
    // worker killed between the server's "completed" and its own note leaves
    // a job the server knows as completed: ask the server for those.
    for round in 0..2 {
        while !workers.iter().all(|w| w.is_finished()) {
            assert!(
                Instant::now() < deadline,
                "the workers did not finish: {} of 1000 noted",
                completed.lock().unwrap().len()
            );
            sleep(Duration::from_millis(50)).await;
        }
        if round == 0 {
            // Claims of killed workers expire (1 s): one more round picks them up.
            sleep(Duration::from_millis(1200)).await;
            workers = (0..5)
                .map(|_| job_worker(port, completed.clone()))
                .collect();
        }
    }
    let noted = completed.lock().unwrap().clone();
    assert!(
        noted.values().all(|n| *n == 1),
        "a job was completed twice: {:?}",
        noted.iter().find(|(_, n)| **n > 1)
    );
    for job in 0..1000u32 {
        if !noted.contains_key(&job) {
            let (st, r) = call(port, "POST", &format!("/jobs/q/{job}/claim"), None).await;
            assert_eq!(
                (st, r["state"].as_str()),
                (409, Some("completed")),
                "job {job} was never completed"
            );
        }
    }
    eprintln!(
        "{kind}: {} of 1000 completions noted by live workers, the rest completed by killed ones",
        noted.len()
    );
    // A completed job cannot be claimed again.
    let (st, r) = call(port, "POST", "/jobs/q/7/claim", None).await;
    assert_eq!(st, 409);
    assert_eq!(r["state"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_is_completed_exactly_once_with_workers_killed_on_etcd() {
    jobs("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_is_completed_exactly_once_with_workers_killed_on_redis() {
    jobs("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_is_completed_exactly_once_with_workers_killed_on_kubernetes() {
    jobs("kubernetes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_4xx_json_error_naming_the_field() {
    let (_b, _s, port) = sidecar("etcd", "bad-input").await;
    let long = "x".repeat(200);
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        ("POST", "/locks/bad%20name".into(), None, 400, "lock name"),
        ("POST", format!("/locks/{long}"), None, 400, "lock name"),
        ("POST", "/locks/a?ttl=forever".into(), None, 400, "ttl"),
        ("POST", "/locks/a?ttl=100ms".into(), None, 400, "ttl"),
        ("POST", "/locks/a?wait=1h".into(), None, 400, "wait"),
        ("POST", "/locks/a?fair=maybe".into(), None, 400, "fair"),
        ("POST", "/locks/a/renew".into(), None, 400, "token"),
        (
            "POST",
            "/locks/a/renew".into(),
            Some("not json".into()),
            400,
            "JSON",
        ),
        (
            "POST",
            "/locks/a/renew?token=../../x".into(),
            None,
            400,
            "token",
        ),
        ("DELETE", "/locks/a".into(), Some("{}".into()), 400, "token"),
        (
            "POST",
            "/locks/a/renew".into(),
            Some(format!("{{\"token\":\"{}\"}}", "a".repeat(5000))),
            413,
            "body",
        ),
        ("POST", "/semaphores/s".into(), None, 400, "permits"),
        (
            "POST",
            "/semaphores/s?permits=0".into(),
            None,
            400,
            "permits",
        ),
        (
            "POST",
            "/semaphores/s?permits=-3".into(),
            None,
            400,
            "permits",
        ),
        ("POST", "/jobs/q/j%2Fx/claim".into(), None, 400, "job id"),
        ("POST", "/jobs/q/1/complete".into(), None, 400, "token"),
        ("GET", "/locks/a".into(), None, 405, "method"),
        ("POST", "/nowhere".into(), None, 404, "no such path"),
    ];
    for (method, path, body, status, word) in cases {
        let (st, b) = call(port, method, &path, body.as_deref()).await;
        assert_eq!(st, status, "{method} {path}: {b}");
        let e = b["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path}: no JSON error: {b}"));
        assert!(e.contains(word), "{method} {path}: {e}");
    }
    // A token that is well-formed but unknown: 410 on renew, 409 on release.
    let unknown = "token=v1.l.1.0123456789abcdef0123456789abcdef";
    assert_eq!(
        call(port, "POST", &format!("/locks/a/renew?{unknown}"), None)
            .await
            .0,
        410
    );
    assert_eq!(
        call(port, "DELETE", &format!("/locks/a?{unknown}"), None)
            .await
            .0,
        409
    );
}

// ---- Regression tests, one per defect found by the model check ----

/// A JSON body carrying `token`.
pub(crate) fn token_body(g: &Value) -> String {
    format!(
        "{{\"token\":\"{}\"}}",
        g["token"].as_str().expect("a token")
    )
}

/// Defect 1 (etcd counted its own permit) and 8 (`live_permits` a string):
/// N sequential acquirers of an N-permit semaphore are all granted; the next
/// one is refused with the number of live permits as a number.
async fn n_permits_are_granted_to_n_sequential_acquirers(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("sem-n-{kind}")).await;
    let (st, g) = call(port, "POST", "/semaphores/solo?permits=1&ttl=30s", None).await;
    assert_eq!(st, 200, "permits=1 with nothing held must grant: {g}");
    let (st, busy) = call(port, "POST", "/semaphores/solo?permits=1&ttl=30s", None).await;
    assert_eq!(st, 409, "{busy}");
    assert_eq!(busy["live_permits"], 1, "live_permits is a number: {busy}");
    for i in 1..=3 {
        let (st, g) = call(port, "POST", "/semaphores/three?permits=3&ttl=30s", None).await;
        assert_eq!(st, 200, "acquirer {i} of 3 must be granted: {g}");
    }
    let (st, busy) = call(port, "POST", "/semaphores/three?permits=3&ttl=30s", None).await;
    assert_eq!(st, 409, "{busy}");
    assert_eq!(busy["live_permits"], 3, "{busy}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_permits_are_granted_to_n_sequential_acquirers_on_etcd() {
    n_permits_are_granted_to_n_sequential_acquirers("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_permits_are_granted_to_n_sequential_acquirers_on_redis() {
    n_permits_are_granted_to_n_sequential_acquirers("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n_permits_are_granted_to_n_sequential_acquirers_on_kubernetes() {
    n_permits_are_granted_to_n_sequential_acquirers("kubernetes").await;
}

/// One name is one semaphore. With 3 live permits taken at
/// `permits=3`, a request with another size (larger or smaller) answers 409
/// naming the established size instead of a grant (4 live permits) or a
/// count; once no permit is live, the name may take another size.
async fn a_semaphores_size_belongs_to_its_name(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("sem-size-{kind}")).await;
    let mut tokens = Vec::new();
    for i in 1..=3 {
        let (st, g) = call(port, "POST", "/semaphores/pool?permits=3&ttl=30s", None).await;
        assert_eq!(st, 200, "acquirer {i} of 3 must be granted: {g}");
        tokens.push(g["token"].as_str().unwrap().to_owned());
    }
    for asked in [5, 2] {
        let path = format!("/semaphores/pool?permits={asked}&ttl=30s");
        let (st, body) = call(port, "POST", &path, None).await;
        assert_eq!(st, 409, "permits={asked} on a semaphore of 3: {body}");
        assert_eq!(
            body["permits"], 3,
            "the 409 names the established size: {body}"
        );
        let msg = body["error"].as_str().unwrap_or_default();
        assert!(
            msg.contains("permits=3"),
            "the error says what to ask: {body}"
        );
    }
    let (st, body) = call(port, "POST", "/semaphores/pool?permits=3&ttl=30s", None).await;
    assert_eq!(
        (st, &body["live_permits"]),
        (409, &Value::from(3)),
        "{body}"
    );
    for t in &tokens {
        let (st, body) = call(port, "DELETE", &format!("/semaphores/pool?token={t}"), None).await;
        assert_eq!(st, 200, "{body}");
    }
    let (st, g) = call(port, "POST", "/semaphores/pool?permits=5&ttl=30s", None).await;
    assert_eq!(
        st, 200,
        "with no live permit the name takes a new size: {g}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_size_belongs_to_its_name_on_etcd() {
    a_semaphores_size_belongs_to_its_name("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_size_belongs_to_its_name_on_redis() {
    a_semaphores_size_belongs_to_its_name("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphores_size_belongs_to_its_name_on_kubernetes() {
    a_semaphores_size_belongs_to_its_name("kubernetes").await;
}

/// Defect 2: a fair and a plain lock of the same name are one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_and_a_plain_lock_of_one_name_are_one_lock() {
    fair_and_plain("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_and_a_plain_lock_of_one_name_are_one_lock_on_kubernetes() {
    fair_and_plain("kubernetes").await;
}

async fn fair_and_plain(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("fair-plain-{kind}")).await;
    // Plain holds: fair is refused.
    let (st, plain) = call(port, "POST", "/locks/invoices?ttl=30s", None).await;
    assert_eq!(st, 200, "{plain}");
    let (st, b) = call(port, "POST", "/locks/invoices?fair=true&ttl=30s", None).await;
    assert_eq!(
        st, 409,
        "a fair lock was granted while the plain one is held: {b}"
    );
    // A fair waiter queues behind the plain holder and gets the lock at its release.
    let waiter = tokio::spawn(async move {
        call(
            port,
            "POST",
            "/locks/invoices?fair=true&ttl=30s&wait=20s&owner=fair",
            None,
        )
        .await
    });
    sleep(Duration::from_millis(300)).await;
    let (st, r) = call(port, "DELETE", "/locks/invoices", Some(&token_body(&plain))).await;
    assert_eq!(st, 200, "{r}");
    let (st, fair) = waiter.await.unwrap();
    assert_eq!(
        st, 200,
        "the fair waiter must get the lock the plain holder released: {fair}"
    );
    assert!(fair["fencing_token"].as_u64() > plain["fencing_token"].as_u64());
    // Fair holds: plain is refused, even with a wait shorter than the hold.
    let (st, b) = call(port, "POST", "/locks/invoices?ttl=30s&wait=500ms", None).await;
    assert_eq!(
        st, 409,
        "a plain lock was granted while the fair one is held: {b}"
    );
    assert_eq!(b["holder"], "fair", "{b}");
    // And a plain waiter gets it when the fair holder releases.
    let waiter =
        tokio::spawn(
            async move { call(port, "POST", "/locks/invoices?ttl=30s&wait=20s", None).await },
        );
    sleep(Duration::from_millis(300)).await;
    let (st, r) = call(port, "DELETE", "/locks/invoices", Some(&token_body(&fair))).await;
    assert_eq!(st, 200, "{r}");
    let (st, g) = waiter.await.unwrap();
    assert_eq!(st, 200, "{g}");
}

/// Defects 4 and 5: a fencing counter that is not a non-negative integer is
/// refused and reported, and nothing is written (no phantom permit, no lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_redis_fencing_counter_is_refused_and_nothing_is_written() {
    let (b, _s, port) = sidecar("redis", "bad-counter").await;
    let Backend::Redis(r) = &b else {
        unreachable!()
    };
    let mut c = r.conn().await;
    for bad in ["1.5", "-10", "abc"] {
        for (path, key) in [
            (
                "/semaphores/pool?permits=3&ttl=30s",
                "leader-elector:{sem:pool}",
            ),
            ("/locks/l?ttl=30s", "leader-elector:{lock:l}"),
            ("/jobs/q/7/claim?ttl=30s", "leader-elector:{job:q/7}:claim"),
        ] {
            let fkey = format!("{}:fencing", key.trim_end_matches(":claim"));
            let _: () = redis::cmd("SET")
                .arg(&fkey)
                .arg(bad)
                .query_async(&mut c)
                .await
                .unwrap();
            let (st, e) = call(port, "POST", path, None).await;
            assert_eq!(st, 500, "counter {bad}: {path}: {e}");
            let msg = e["error"].as_str().unwrap_or_default();
            assert!(msg.contains(&fkey) && msg.contains(bad), "{msg}");
            let exists: u32 = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!(exists, 0, "counter {bad}: {path} wrote {key} anyway");
            let _: () = redis::cmd("DEL")
                .arg(&fkey)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }
    // Repaired: granted again, tokens positive and growing.
    let (st, g) = call(port, "POST", "/semaphores/pool?permits=1&ttl=30s", None).await;
    assert_eq!(st, 200, "{g}");
    assert!(
        g["fencing_token"]
            .as_u64()
            .is_some_and(|f| f < u64::MAX / 2),
        "{g}"
    );
}

/// With etcd blackholed, an acquisition with `wait=1s`
/// answers 503 within its wait plus one deadline (2 s: the election's call
/// timeout is shorter here, and the coordination deadline is at least 2 s):
/// one deadline per request, not one per call inside it. A lock released
/// before the partition left its lease in the sidecar's pool, so the plain
/// lock's attempt refreshes that lease and then grants a new one: two calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_etcd_answers_within_the_wait_plus_one_deadline() {
    const WAIT: Duration = Duration::from_secs(1);
    const DEADLINE: Duration = Duration::from_secs(2);
    // Scheduling on a loaded machine; far below a second deadline.
    const SLACK: Duration = Duration::from_millis(400);
    let etcd = Etcd::start().await;
    let proxy = support::proxy::Proxy::to_url(&etcd.url).await;
    let mut args = vec!["--etcd-endpoints".to_owned(), proxy.url_for(&etcd.url)];
    args.extend(FAST.iter().chain(CONTROL).map(|s| s.to_string()));
    let s = Sidecar::start_raw(&election("blackhole-budget"), "me", &args);
    let port = s.control();
    for name in ["x", "f"] {
        let (st, g) = call(port, "POST", &format!("/locks/{name}?ttl=10s"), None).await;
        assert_eq!(st, 200, "{g}");
        let path = format!("/locks/{name}");
        let (st, r) = call(port, "DELETE", &path, Some(&token_body(&g))).await;
        assert_eq!(st, 200, "{r}");
    }
    proxy.set(support::proxy::Mode::Blackhole);
    for path in [
        "/locks/x?ttl=10s&wait=1s",
        "/locks/f?ttl=10s&wait=1s&fair=true",
        "/semaphores/s?permits=1&ttl=10s&wait=1s",
    ] {
        let started = Instant::now();
        let (st, e) = call(port, "POST", path, None).await;
        let took = started.elapsed();
        eprintln!("POST {path} against a blackholed etcd: {st} after {took:?}");
        assert_eq!(st, 503, "POST {path}: {e}");
        assert!(
            took <= WAIT + DEADLINE + SLACK,
            "POST {path} answered after {took:?}: more than its wait ({WAIT:?}) plus one deadline ({DEADLINE:?}): {e}"
        );
    }
}

/// One deadline per request on Redis too: with the server blackholed, an
/// acquisition with `wait=1s` answers 503 within its wait plus one server
/// deadline (the call timeout, ⅔ of the 500 ms renew interval here), however
/// many calls the attempts inside it make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_redis_answers_within_the_wait_plus_one_deadline() {
    const WAIT: Duration = Duration::from_secs(1);
    const SLACK: Duration = Duration::from_millis(600);
    let redis = RedisServer::start().await;
    let proxy = support::proxy::Proxy::to_url(&redis.url).await;
    let mut args = vec!["--redis-url".to_owned(), proxy.url_for(&redis.url)];
    args.extend(FAST.iter().chain(CONTROL).map(|s| s.to_string()));
    let s = Sidecar::start_raw(&election("redis-blackhole-budget"), "me", &args);
    let port = s.control();
    let (st, g) = call(port, "POST", "/locks/x?ttl=10s", None).await;
    assert_eq!(st, 200, "{g}");
    proxy.set(support::proxy::Mode::Blackhole);
    for path in [
        "/locks/y?ttl=10s&wait=1s",
        "/semaphores/s?permits=1&ttl=10s&wait=1s",
    ] {
        let started = Instant::now();
        let (st, e) = call(port, "POST", path, None).await;
        let took = started.elapsed();
        eprintln!("POST {path} against a blackholed Redis: {st} after {took:?}");
        assert_eq!(st, 503, "POST {path}: {e}");
        assert!(
            took <= WAIT + Duration::from_millis(333) + SLACK,
            "POST {path} answered after {took:?}: more than its wait plus one deadline: {e}"
        );
    }
}

/// Defect 6: against a blackholed etcd a call answers with a timeout after
/// one deadline, not after the transport gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_etcd_answers_with_a_deadline_error() {
    let etcd = Etcd::start().await;
    let proxy = support::proxy::Proxy::to_url(&etcd.url).await;
    let mut args = vec!["--etcd-endpoints".to_owned(), proxy.url_for(&etcd.url)];
    args.extend(FAST.iter().chain(CONTROL).map(|s| s.to_string()));
    let s = Sidecar::start_raw(&election("blackhole"), "me", &args);
    let port = s.control();
    let (st, g) = call(port, "POST", "/locks/x?ttl=30s", None).await;
    assert_eq!(st, 200, "{g}");
    proxy.set(support::proxy::Mode::Blackhole);
    for (method, path, body) in [
        ("POST", "/locks/y?ttl=30s&wait=500ms", None),
        ("POST", "/locks/x/renew", Some(token_body(&g))),
        ("DELETE", "/locks/x", Some(token_body(&g))),
        ("POST", "/semaphores/s?permits=2", None),
        ("POST", "/jobs/q/1/claim", None),
    ] {
        let (st, e) = call(port, method, path, body.as_deref()).await;
        assert_eq!(st, 503, "{method} {path}: {e}");
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(
            msg.contains("timed out after"),
            "{method} {path} must name its deadline: {msg}"
        );
    }
    proxy.set(support::proxy::Mode::Pass);
}

/// Defect 8: a repeated DELETE says "already released"; owners with control
/// characters are refused; WRONGTYPE on a coordination key names that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smaller_defects_answer_what_happened() {
    let (b, _s, port) = sidecar("redis", "smaller").await;
    let (st, g) = call(port, "POST", "/locks/a?ttl=30s", None).await;
    assert_eq!(st, 200, "{g}");
    let (st, r) = call(port, "DELETE", "/locks/a", Some(&token_body(&g))).await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = call(port, "DELETE", "/locks/a", Some(&token_body(&g))).await;
    assert_eq!(st, 409, "{r}");
    let msg = r["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("already released") && !msg.contains("it expired ("),
        "{msg}"
    );
    let (st, r) = call(port, "POST", "/locks/b?owner=a%0Ab", None).await;
    assert_eq!(st, 400, "{r}");
    assert!(
        r["error"].as_str().unwrap_or_default().contains("owner"),
        "{r}"
    );
    let Backend::Redis(server) = &b else {
        unreachable!()
    };
    let mut c = server.conn().await;
    let _: () = redis::cmd("HSET")
        .arg("leader-elector:{lock:h}")
        .arg("f")
        .arg("v")
        .query_async(&mut c)
        .await
        .unwrap();
    let (st, r) = call(port, "POST", "/locks/h", None).await;
    assert_eq!(st, 500, "{r}");
    let msg = r["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("leader-elector:{lock:h}") && !msg.contains("election key"),
        "WRONGTYPE must name the coordination key, not the election's: {msg}"
    );
}

/// The lease part of an etcd token (`v1.<kind>.<lease hex>.<nonce>`).
fn lease_of(token: &Value) -> String {
    let t = token["token"].as_str().expect("a token");
    t.split('.').nth(2).expect("a v1 token").to_owned()
}

/// A released lock's lease is kept for the next acquisition (one keep-alive
/// instead of a grant and a revoke): the next holder gets it, the old token
/// can neither renew nor release it, and the next holder's term still lasts
/// its TTL from its last renewal, then ends when it stops renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_serves_the_next_holder_and_is_lost_to_the_old_token_on_etcd() {
    let (_b, _s, port) = sidecar("etcd", "kept-lease").await;
    let (st, a) = call(port, "POST", "/locks/k?ttl=2s", None).await;
    assert_eq!(st, 200, "{a}");
    let (st, r) = call(port, "DELETE", "/locks/k", Some(&token_body(&a))).await;
    assert_eq!(st, 200, "{r}");
    // The queue path (a wait) and the plain path both take kept leases.
    let (st, b) = call(port, "POST", "/locks/k?ttl=2s&wait=1s", None).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(
        lease_of(&a),
        lease_of(&b),
        "the released lease was not reused: {a} {b}"
    );
    assert!(
        b["fencing_token"].as_u64() > a["fencing_token"].as_u64(),
        "{a} {b}"
    );
    let (st, r) = call(port, "POST", "/locks/k/renew", Some(&token_body(&a))).await;
    assert_eq!(st, 410, "the old token renewed the new term's lease: {r}");
    let (st, r) = call(port, "DELETE", "/locks/k", Some(&token_body(&a))).await;
    assert_eq!(st, 409, "the old token released the new term: {r}");
    let (st, r) = call(port, "POST", "/locks/k?ttl=2s", None).await;
    assert_eq!(st, 409, "the new term must still hold the lock: {r}");
    let renewed = Instant::now();
    let (st, r) = call(port, "POST", "/locks/k/renew", Some(&token_body(&b))).await;
    assert_eq!(st, 200, "the new holder must renew: {r}");
    // Held for the whole TTL after the renewal was sent, then free within
    // the TTL plus etcd's expiry slack (its lessor checks every 500 ms).
    loop {
        let (st, r) = call(port, "POST", "/locks/k?ttl=2s", None).await;
        if st == 200 {
            let after = renewed.elapsed();
            assert!(
                after >= Duration::from_secs(2),
                "free {after:?} after a renewal of a 2 s lease"
            );
            break;
        }
        assert_eq!(st, 409, "{r}");
        assert!(
            renewed.elapsed() < Duration::from_secs(5),
            "the unrenewed lock never expired"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// A kept lease revoked by someone else (`etcdctl lease revoke`) while it
/// waits for the next holder: the next acquisition finds it gone and takes
/// a fresh one (no error, no grant of a dead lease), on the plain path and
/// on the queue path; and the kept lease really is reused when alive (the
/// one-round-trip path), its fencing tokens still growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_revoked_by_hand_is_replaced_by_a_fresh_one_on_etcd() {
    let (b, _s, port) = sidecar("etcd", "kept-revoked").await;
    let Backend::Etcd(etcd) = &b else {
        unreachable!()
    };
    let mut last = 0;
    for path in ["/locks/r?ttl=5s", "/locks/r?ttl=5s&wait=1s"] {
        let (st, a) = call(port, "POST", path, None).await;
        assert_eq!(st, 200, "{a}");
        let (st, r) = call(port, "DELETE", "/locks/r", Some(&token_body(&a))).await;
        assert_eq!(st, 200, "{r}");
        let lease = i64::from_str_radix(&lease_of(&a), 16).unwrap();
        etcd.client()
            .await
            .lease_revoke(lease)
            .await
            .expect("revoked by hand");
        let (st, g) = call(port, "POST", path, None).await;
        assert_eq!(
            st, 200,
            "a revoked kept lease must not fail the next holder: {g}"
        );
        assert_ne!(lease_of(&g), lease_of(&a), "granted a revoked lease");
        let fence = g["fencing_token"].as_u64().unwrap();
        assert!(
            fence > last,
            "fencing tokens only grow: {fence} after {last}"
        );
        // Alive this time: released and taken again, the lease is reused.
        let (st, r) = call(port, "DELETE", "/locks/r", Some(&token_body(&g))).await;
        assert_eq!(st, 200, "{r}");
        let (st, h) = call(port, "POST", path, None).await;
        assert_eq!(st, 200, "{h}");
        assert_eq!(lease_of(&h), lease_of(&g), "a live kept lease is reused");
        last = h["fencing_token"].as_u64().unwrap();
        let (st, r) = call(port, "DELETE", "/locks/r", Some(&token_body(&h))).await;
        assert_eq!(st, 200, "{r}");
    }
}

/// A fair lock granted under a kept lease lasts the whole TTL its answer
/// tells, from the answer: the kept lease is refreshed before it is used
/// (it was last refreshed 800 ms earlier, at its release). Liveness twin:
/// unrenewed, the lock is free again within the TTL plus etcd's expiry
/// slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_under_a_kept_lease_lasts_its_whole_ttl_on_etcd() {
    let (_b, _s, port) = sidecar("etcd", "kept-fair").await;
    let (st, m) = call(port, "POST", "/locks/m?ttl=2s", None).await;
    assert_eq!(st, 200, "{m}");
    let (st, r) = call(port, "DELETE", "/locks/m", Some(&token_body(&m))).await;
    assert_eq!(st, 200, "{r}");
    sleep(Duration::from_millis(800)).await;
    let (st, g) = call(port, "POST", "/locks/l?ttl=2s&fair=true&wait=1s", None).await;
    let granted = Instant::now();
    assert_eq!(st, 200, "{g}");
    assert_eq!(
        lease_of(&g),
        lease_of(&m),
        "the kept lease serves the fair lock"
    );
    loop {
        let (st, r) = call(port, "POST", "/locks/l?ttl=2s", None).await;
        if st == 200 {
            let after = granted.elapsed();
            assert!(
                after >= Duration::from_secs(2),
                "the lock was free {after:?} after a grant that told 2 s"
            );
            break;
        }
        assert_eq!(st, 409, "{r}");
        assert!(granted.elapsed() < Duration::from_secs(4), "never expired");
        sleep(Duration::from_millis(50)).await;
    }
}

/// Many waiters of one sidecar share one watch of the queue: each is served
/// in turn as the holder releases, and when the shared watch breaks (etcd
/// restarted under them) the next waiters open a new one and are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_sharing_a_watch_are_all_served_across_an_etcd_restart() {
    let (mut b, _s, port) = sidecar("etcd", "shared-watch").await;
    let Backend::Etcd(etcd) = &mut b else {
        unreachable!()
    };
    let (st, first) = call(port, "POST", "/locks/w?ttl=10s", None).await;
    assert_eq!(st, 200, "{first}");
    let served = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let served = served.clone();
        waiters.push(tokio::spawn(async move {
            // A waiter whose watch broke while etcd was down answers 503
            // (it cannot tell); asked again, it must be served.
            let g = loop {
                let (st, g) = call(port, "POST", "/locks/w?ttl=10s&wait=25s", None).await;
                match st {
                    200 => break g,
                    503 => sleep(Duration::from_millis(100)).await,
                    _ => panic!("a waiter was not served: {st} {g}"),
                }
            };
            served.fetch_add(1, Ordering::SeqCst);
            let (st, r) = call(port, "DELETE", "/locks/w", Some(&token_body(&g))).await;
            assert_eq!(st, 200, "{r}");
        }));
    }
    sleep(Duration::from_millis(500)).await;
    assert_eq!(
        served.load(Ordering::SeqCst),
        0,
        "served while the lock was held"
    );
    etcd.restart().await;
    let (st, r) = call(port, "DELETE", "/locks/w", Some(&token_body(&first))).await;
    assert_eq!(st, 200, "{r}");
    for w in waiters {
        w.await.expect("a waiter panicked");
    }
    assert_eq!(served.load(Ordering::SeqCst), 8);
}

/// An etcd sidecar with its control API whose etcd connection goes through
/// `proxy`, and one that talks to etcd directly.
fn proxied_and_direct(etcd: &Etcd, proxy: &support::proxy::Proxy, test: &str) -> [Sidecar; 2] {
    let flags: Vec<String> = FAST.iter().chain(CONTROL).map(|s| s.to_string()).collect();
    let mut via = vec!["--etcd-endpoints".to_owned(), proxy.url_for(&etcd.url)];
    via.extend(flags.iter().cloned());
    let mut direct = vec!["--etcd-endpoints".to_owned(), etcd.url.clone()];
    direct.extend(flags);
    [
        Sidecar::start_raw(&election(test), "proxied", &via),
        Sidecar::start_raw(&election(test), "direct", &direct),
    ]
}

/// The keys under a coordination lock's prefix now, oldest first.
async fn lock_keys(etcd: &Etcd, lock: &str) -> Vec<String> {
    let mut c = etcd.client().await;
    let all = c
        .get(
            "",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_sort(
                        etcd_client::SortTarget::Create,
                        etcd_client::SortOrder::Ascend,
                    ),
            ),
        )
        .await
        .unwrap();
    let part = format!("/_coord/locks/{lock}/");
    all.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .filter(|k| k.contains(&part))
        .collect()
}

/// (etcd-io/etcd#21128) an acquisition that fails part-way
/// leaves no key behind that blocks the queue. etcd answers 1.5 s late:
/// the lease grant and the watch fit in the request's budget (2 s), the
/// join's transaction does not: it is applied, but its answer comes after
/// the budget. The stray key must go at once (revoked off the answer path),
/// not block every later acquirer for its 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_that_fails_part_way_leaves_no_key_in_the_queue() {
    let etcd = Etcd::start().await;
    let proxy = support::proxy::Proxy::to_url(&etcd.url).await;
    let [slow, other] = proxied_and_direct(&etcd, &proxy, "part-way");
    // Warm the proxied sidecar's connection and its watch hub.
    let (st, g) = call(slow.control(), "POST", "/locks/warm?ttl=30s", None).await;
    assert_eq!(st, 200, "{g}");
    proxy.set(support::proxy::Mode::Delay(Duration::from_millis(1500)));
    let (st, e) = call(slow.control(), "POST", "/locks/q?fair=true&ttl=30s", None).await;
    assert_eq!(st, 503, "the late join must fail on its budget: {e}");
    proxy.set(support::proxy::Mode::Pass);
    let started = Instant::now();
    let (st, g) = call(other.control(), "POST", "/locks/q?ttl=30s&wait=10s", None).await;
    assert_eq!(
        st,
        200,
        "a failed acquisition's key blocked the lock (keys now: {:?}): {g}",
        lock_keys(&etcd, "q").await
    );
    eprintln!(
        "the next acquirer got the lock {:?} after the failed one answered",
        started.elapsed()
    );
}

/// (etcd-io/etcd#19597) a fair waiter whose own lease ends
/// while it waits (revoked here; expired after a partition alike) stops
/// waiting and answers at once, and is never granted the lock on its dead
/// lease when the holder then leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_ended_stops_waiting_and_is_never_granted() {
    let (b, _s, port) = sidecar("etcd", "dead-waiter").await;
    let Backend::Etcd(etcd) = &b else {
        unreachable!()
    };
    let (st, holder) = call(port, "POST", "/locks/q?ttl=30s", None).await;
    assert_eq!(st, 200, "{holder}");
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let answer = call(port, "POST", "/locks/q?fair=true&ttl=30s&wait=20s", None).await;
        (answer, started.elapsed())
    });
    wait_for(
        Duration::from_secs(10),
        "the waiter to join the queue",
        || async { lock_keys(etcd, "q").await.len() == 2 },
    )
    .await;
    let keys = lock_keys(etcd, "q").await;
    // The waiter's key is `<prefix><lease hex>.<nonce>`: revoke its lease.
    let lease = keys[1]
        .rsplit('/')
        .next()
        .unwrap()
        .split('.')
        .next()
        .unwrap();
    let lease = i64::from_str_radix(lease, 16).unwrap();
    let revoked = Instant::now();
    etcd.client().await.lease_revoke(lease).await.unwrap();
    // The holder leaves a moment later: the dead waiter must not get it.
    sleep(Duration::from_millis(300)).await;
    let (st, r) = call(port, "DELETE", "/locks/q", Some(&token_body(&holder))).await;
    assert_eq!(st, 200, "{r}");
    let ((st, body), took) = waiter.await.unwrap();
    assert_ne!(
        st, 200,
        "a waiter was granted the lock on its revoked lease: {body}"
    );
    assert!(
        revoked.elapsed() < Duration::from_secs(5) && took < Duration::from_secs(20),
        "the waiter kept waiting after its lease ended ({took:?}): {st} {body}"
    );
    eprintln!("the waiter answered {st} {body} after {took:?}");
    // Nobody holds the lock now.
    let (st, g) = call(port, "POST", "/locks/q?ttl=30s", None).await;
    assert_eq!(st, 200, "{g}");
}

/// (etcd-io/etcd#22123) a release retried after a network
/// error is idempotent and never deletes a successor's key. The first
/// release reaches etcd but its answer comes too late (503); a successor
/// takes the lock; the retried release answers 409 and the successor still
/// holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_retried_after_a_network_error_never_deletes_a_successor() {
    let etcd = Etcd::start().await;
    let proxy = support::proxy::Proxy::to_url(&etcd.url).await;
    let [slow, other] = proxied_and_direct(&etcd, &proxy, "retried-release");
    let (st, a) = call(slow.control(), "POST", "/locks/r?ttl=30s", None).await;
    assert_eq!(st, 200, "{a}");
    proxy.set(support::proxy::Mode::Delay(Duration::from_millis(2500)));
    let (st, e) = call(slow.control(), "DELETE", "/locks/r", Some(&token_body(&a))).await;
    assert_eq!(st, 503, "the release's answer is lost: {e}");
    proxy.set(support::proxy::Mode::Pass);
    let (st, b) = call(other.control(), "POST", "/locks/r?ttl=30s&wait=10s", None).await;
    assert_eq!(st, 200, "the first release did reach etcd: {b}");
    for _ in 0..2 {
        let (st, r) = call(slow.control(), "DELETE", "/locks/r", Some(&token_body(&a))).await;
        assert_eq!(st, 409, "a retried release must not succeed: {r}");
    }
    let (st, r) = call(
        other.control(),
        "POST",
        "/locks/r/renew",
        Some(&token_body(&b)),
    )
    .await;
    assert_eq!(
        st, 200,
        "the successor lost its lock to a retried release: {r}"
    );
    assert_eq!(lock_keys(&etcd, "r").await.len(), 1);
}
