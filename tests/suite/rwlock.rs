//! Read-write locks and the renewal and give-back of job claims, through a
//! real sidecar's control API on real etcd, real Redis and the Kubernetes
//! API stand-in (the Lease backend). Every safety
//! check has its liveness twin: a writer overlaps nobody / readers overlap;
//! new readers are held back while a writer waits / they enter once it is
//! served or gives up; a claim is not another's while renewed / it is
//! another's at once when given back.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng;
use serde_json::Value;
use tokio::time::{Instant, sleep};

use crate::coord::{call, sidecar, token_body};

fn fence(g: &Value) -> u64 {
    g["fencing_token"].as_u64().expect("a fencing token")
}

fn tok(g: &Value) -> &str {
    g["token"].as_str().expect("a token")
}

/// Readers share, a writer is refused while they hold and, waiting, holds
/// new readers back; it is granted within its wait once they release, with
/// a fencing token above every earlier grant's; after it, readers enter.
async fn readers_share_and_a_writer_waits_its_turn(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("rw-turn-{kind}")).await;
    let (st, a) = call(
        port,
        "POST",
        "/rwlocks/doc?mode=read&ttl=30s&owner=ra",
        None,
    )
    .await;
    assert_eq!(st, 200, "{a}");
    // Liveness twin of exclusion: a second reader shares it.
    let (st, b) = call(
        port,
        "POST",
        "/rwlocks/doc?mode=read&ttl=30s&owner=rb",
        None,
    )
    .await;
    assert_eq!(st, 200, "readers overlap: {b}");
    // Safety: a writer is refused while readers hold, naming one.
    let (st, w) = call(port, "POST", "/rwlocks/doc?mode=write&owner=w0", None).await;
    assert_eq!(st, 409, "{w}");
    assert!(w["holder"] == "ra" || w["holder"] == "rb", "{w}");
    // A writer that waits: new readers are held back meanwhile.
    let writer = tokio::spawn(async move {
        let t = Instant::now();
        let r = call(
            port,
            "POST",
            "/rwlocks/doc?mode=write&ttl=30s&wait=20s&owner=w1",
            None,
        )
        .await;
        (r, t.elapsed())
    });
    sleep(Duration::from_millis(500)).await;
    let (st, c) = call(port, "POST", "/rwlocks/doc?mode=read&owner=rc", None).await;
    assert_eq!(st, 409, "a new reader enters while a writer waits: {c}");
    assert_eq!(c["holder"], "w1", "{c}");
    // The readers leave: the writer is granted within its wait.
    let released = Instant::now();
    for g in [&a, &b] {
        let (st, r) = call(port, "DELETE", "/rwlocks/doc", Some(&token_body(g))).await;
        assert_eq!(st, 200, "{r}");
    }
    let ((st, w), waited) = writer.await.unwrap();
    assert_eq!(st, 200, "the writer waiting behind readers: {w}");
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    eprintln!(
        "{kind}: writer granted {:?} after the last reader's release began",
        released.elapsed()
    );
    assert!(
        fence(&w) > fence(&a) && fence(&w) > fence(&b),
        "{a} {b} {w}"
    );
    // Safety: while it writes, readers and writers are refused.
    let (st, r) = call(port, "POST", "/rwlocks/doc?mode=read&owner=rd", None).await;
    assert_eq!((st, r["holder"].as_str()), (409, Some("w1")), "{r}");
    let (st, r) = call(port, "POST", "/rwlocks/doc?mode=write&owner=w2", None).await;
    assert_eq!(st, 409, "{r}");
    // Liveness: a reader waiting behind the writer enters once it releases.
    let reader = tokio::spawn(async move {
        call(
            port,
            "POST",
            "/rwlocks/doc?mode=read&wait=20s&owner=re",
            None,
        )
        .await
    });
    sleep(Duration::from_millis(300)).await;
    let (st, r) = call(port, "DELETE", "/rwlocks/doc", Some(&token_body(&w))).await;
    assert_eq!(st, 200, "{r}");
    let (st, e) = reader.await.unwrap();
    assert_eq!(st, 200, "{e}");
    assert!(fence(&e) > fence(&w), "{w} {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_waits_its_turn_on_etcd() {
    readers_share_and_a_writer_waits_its_turn("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_waits_its_turn_on_redis() {
    readers_share_and_a_writer_waits_its_turn("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_waits_its_turn_on_kubernetes() {
    readers_share_and_a_writer_waits_its_turn("kubernetes").await;
}

/// A writer that gives up at its wait lets held-back readers in at once
/// (its intent goes with it), and renew/release answer like a lock's.
async fn a_writer_that_gives_up_lets_readers_in(kind: &str) {
    let (_b, side, port) = sidecar(kind, &format!("rw-give-up-{kind}")).await;
    let (st, a) = call(port, "POST", "/rwlocks/f?mode=read&ttl=30s", None).await;
    assert_eq!(st, 200, "{a}");
    let (st, w) = call(port, "POST", "/rwlocks/f?mode=write&wait=1s&owner=w", None).await;
    assert_eq!(st, 409, "{w}");
    let (st, b) = call(port, "POST", "/rwlocks/f?mode=read&owner=rb", None).await;
    assert_eq!(st, 200, "a reader after the writer gave up: {b}");
    // Counted like locks, under the lock's name.
    let (_, metrics) = crate::support::http_get(side.port, "/metrics")
        .await
        .unwrap();
    for line in [
        r#"dist_lock_acquisitions_total{lock_name="f",result="acquired"} 2"#,
        r#"dist_lock_acquisitions_total{lock_name="f",result="busy"} 1"#,
        r#"dist_locks_active{lock_name="f"} 2"#,
    ] {
        assert!(metrics.contains(line), "{line} missing: {metrics}");
    }
    // Renew answers: a reader renews; a released token is 410 on renew and
    // 409 on release; an unknown token is 409 on release.
    let renew = format!("/rwlocks/f/renew?ttl=30s&token={}", tok(&a));
    let (st, r) = call(port, "POST", &renew, None).await;
    assert_eq!(st, 200, "{r}");
    assert!(r["ttl_ms"].as_u64().unwrap() >= 29_000, "{r}");
    let (st, r) = call(port, "DELETE", "/rwlocks/f", Some(&token_body(&a))).await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = call(port, "POST", &renew, None).await;
    assert_eq!(st, 410, "{r}");
    let (st, r) = call(port, "DELETE", "/rwlocks/f", Some(&token_body(&a))).await;
    assert_eq!(st, 409, "{r}");
    let never = format!("{{\"token\":\"v1.w.1.{}\"}}", "0".repeat(32));
    let (st, r) = call(port, "DELETE", "/rwlocks/f", Some(&never)).await;
    assert_eq!(st, 409, "{r}");
    assert_eq!(w["holder"], "me", "{w}");
    // A writer's token of another name does not release this one.
    let (st, r) = call(port, "DELETE", "/rwlocks/g", Some(&token_body(&b))).await;
    assert_eq!(st, 409, "{r}");
    // Bad input: a 400 naming the field.
    for (path, field) in [
        ("/rwlocks/f?mode=both", "mode"),
        ("/rwlocks/f", "mode"),
        ("/rwlocks/f?mode=read&ttl=forever", "ttl"),
        ("/rwlocks/f%20x?mode=read", "read-write lock name"),
    ] {
        let (st, r) = call(port, "POST", path, None).await;
        assert_eq!(st, 400, "{path}: {r}");
        assert!(r["error"].as_str().unwrap().contains(field), "{path}: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_lets_readers_in_on_etcd() {
    a_writer_that_gives_up_lets_readers_in("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_lets_readers_in_on_redis() {
    a_writer_that_gives_up_lets_readers_in("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_lets_readers_in_on_kubernetes() {
    a_writer_that_gives_up_lets_readers_in("kubernetes").await;
}

/// Who is inside, as the clients see it: readers, writers, and the most
/// readers seen at once.
#[derive(Default)]
struct Inside {
    readers: AtomicI64,
    writers: AtomicI64,
    most_readers: AtomicI64,
    writes: AtomicUsize,
    reads: AtomicUsize,
    last_write_fence: AtomicU64,
}

/// One client: `rounds` random reads (70 %) and writes, each waiting up to
/// 20 s, marked inside from its grant's answer to its release's call (a
/// span within the backend's hold).
async fn rw_client(
    port: u16,
    rounds: u32,
    inside: Arc<Inside>,
    grants_ms: Arc<std::sync::Mutex<Vec<(bool, f64)>>>,
) {
    for _ in 0..rounds {
        let write = rand::rng().random_bool(0.3);
        let mode = if write { "write" } else { "read" };
        let t = Instant::now();
        let path = format!("/rwlocks/shared?mode={mode}&ttl=20s&wait=20s");
        let (st, g) = call(port, "POST", &path, None).await;
        assert_eq!(st, 200, "{mode}: {g}");
        grants_ms
            .lock()
            .unwrap()
            .push((write, t.elapsed().as_secs_f64() * 1000.0));
        if write {
            assert_eq!(
                inside.writers.fetch_add(1, Ordering::SeqCst),
                0,
                "two writers"
            );
            assert_eq!(
                inside.readers.load(Ordering::SeqCst),
                0,
                "a writer among readers"
            );
            let prev = inside
                .last_write_fence
                .fetch_max(fence(&g), Ordering::SeqCst);
            assert!(
                fence(&g) > prev,
                "writer fencing went back: {prev} then {g}"
            );
            inside.writes.fetch_add(1, Ordering::SeqCst);
        } else {
            let n = inside.readers.fetch_add(1, Ordering::SeqCst) + 1;
            inside.most_readers.fetch_max(n, Ordering::SeqCst);
            assert_eq!(
                inside.writers.load(Ordering::SeqCst),
                0,
                "a reader beside a writer"
            );
            inside.reads.fetch_add(1, Ordering::SeqCst);
        }
        let pause = rand::rng().random_range(5..40);
        sleep(Duration::from_millis(pause)).await;
        if write {
            inside.writers.fetch_sub(1, Ordering::SeqCst);
        } else {
            inside.readers.fetch_sub(1, Ordering::SeqCst);
        }
        let (st, r) = call(port, "DELETE", "/rwlocks/shared", Some(&token_body(&g))).await;
        assert_eq!(st, 200, "{r}");
    }
}

/// Prints the median of 30 uncontended acquire + release rounds per mode
/// (one client, nothing else held).
async fn uncontended(kind: &str, port: u16) {
    for mode in ["read", "write"] {
        let mut ms = Vec::new();
        for _ in 0..30 {
            let t = Instant::now();
            let path = format!("/rwlocks/alone?mode={mode}&ttl=10s");
            let (st, g) = call(port, "POST", &path, None).await;
            assert_eq!(st, 200, "{g}");
            let (st, r) = call(port, "DELETE", "/rwlocks/alone", Some(&token_body(&g))).await;
            assert_eq!(st, 200, "{r}");
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        ms.sort_by(f64::total_cmp);
        eprintln!(
            "{kind}: uncontended {mode} acquire + release: median {:.2} ms, p90 {:.2} ms",
            ms[15], ms[27]
        );
    }
}

/// 12 clients x 15 rounds: no writer ever beside anyone, readers do share,
/// every request is granted within its wait; prints grant latencies.
async fn no_writer_beside_anyone(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("rw-stress-{kind}")).await;
    uncontended(kind, port).await;
    let inside = Arc::new(Inside::default());
    let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let tasks: Vec<_> = (0..12)
        .map(|_| tokio::spawn(rw_client(port, 15, inside.clone(), grants.clone())))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let most = inside.most_readers.load(Ordering::SeqCst);
    assert!(most >= 2, "readers never overlapped (most at once: {most})");
    let mut lat = grants.lock().unwrap().clone();
    lat.sort_by(|a, b| a.1.total_cmp(&b.1));
    let pct = |write: bool, q: f64| {
        let v: Vec<f64> = lat
            .iter()
            .filter(|(w, _)| *w == write)
            .map(|(_, ms)| *ms)
            .collect();
        v.get(((v.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    eprintln!(
        "{kind}: {} reads, {} writes in {:.1} s; most readers at once {most}; grant latency reads p50 {:.1} ms p95 {:.1} ms, writes p50 {:.1} ms p95 {:.1} ms",
        inside.reads.load(Ordering::SeqCst),
        inside.writes.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64(),
        pct(false, 0.5),
        pct(false, 0.95),
        pct(true, 0.5),
        pct(true, 0.95),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_writer_beside_anyone_and_readers_share_on_etcd() {
    no_writer_beside_anyone("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_writer_beside_anyone_and_readers_share_on_redis() {
    no_writer_beside_anyone("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_writer_beside_anyone_and_readers_share_on_kubernetes() {
    no_writer_beside_anyone("kubernetes").await;
}

/// A renewed claim outlives its first TTL and stays the claimant's; given
/// back, another worker claims it at once; the old token then gets 410 on
/// renew and 409 on give-back; a completed job stays completed.
async fn claims_renew_and_give_back(kind: &str) {
    let (_b, _s, port) = sidecar(kind, &format!("jobs-renew-{kind}")).await;
    let (st, a) = call(port, "POST", "/jobs/q/7/claim?ttl=2s&owner=wa", None).await;
    assert_eq!(st, 200, "{a}");
    let renew = format!("/jobs/q/7/renew?ttl=2s&token={}", tok(&a));
    for _ in 0..5 {
        sleep(Duration::from_millis(800)).await;
        let (st, r) = call(port, "POST", &renew, None).await;
        assert_eq!(st, 200, "renewing the claim: {r}");
    }
    // 4 s in, past its first TTL of 2 s: still wa's.
    let (st, b) = call(port, "POST", "/jobs/q/7/claim?ttl=30s&owner=wb", None).await;
    assert_eq!((st, b["holder"].as_str()), (409, Some("wa")), "{b}");
    // Given back: wb claims it at once.
    let (st, r) = call(port, "DELETE", "/jobs/q/7/claim", Some(&token_body(&a))).await;
    assert_eq!(st, 200, "{r}");
    let (st, b) = call(port, "POST", "/jobs/q/7/claim?ttl=30s&owner=wb", None).await;
    assert_eq!(st, 200, "claimed at once after a give-back: {b}");
    assert!(fence(&b) > fence(&a), "{a} {b}");
    let (st, r) = call(port, "POST", &renew, None).await;
    assert_eq!(st, 410, "{r}");
    let (st, r) = call(port, "DELETE", "/jobs/q/7/claim", Some(&token_body(&a))).await;
    assert_eq!(st, 409, "{r}");
    // A completed job stays completed: no give-back, no new claim.
    let (st, r) = call(port, "POST", "/jobs/q/7/complete", Some(&token_body(&b))).await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = call(port, "DELETE", "/jobs/q/7/claim", Some(&token_body(&b))).await;
    assert_eq!(st, 409, "{r}");
    let (st, r) = call(port, "POST", "/jobs/q/7/claim", None).await;
    assert_eq!((st, r["state"].as_str()), (409, Some("completed")), "{r}");
    // An unrenewed claim does expire (the twin of "renew keeps it").
    let (st, c) = call(port, "POST", "/jobs/q/8/claim?ttl=1s&owner=wc", None).await;
    assert_eq!(st, 200, "{c}");
    sleep(Duration::from_millis(2600)).await;
    let (st, d) = call(port, "POST", "/jobs/q/8/claim?ttl=30s&owner=wd", None).await;
    assert_eq!(st, 200, "an unrenewed claim expired: {d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_renew_and_give_back_on_etcd() {
    claims_renew_and_give_back("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_renew_and_give_back_on_redis() {
    claims_renew_and_give_back("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_renew_and_give_back_on_kubernetes() {
    claims_renew_and_give_back("kubernetes").await;
}

/// Scripts run by a Redis server so far (`INFO commandstats`).
async fn scripts_run(server: &crate::support::RedisServer) -> u64 {
    let mut conn = server.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A writer waiting behind a reader, beside a reader that expired without
/// a release, looks again when the holder leaves or expires, not every
/// millisecond: the expired reader's entry is dropped by the first look
/// rather than read as a change due at once. Liveness twin: it is granted
/// once the live reader releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_waiting_beside_an_expired_reader_does_not_spin_on_redis() {
    let (b, _s, port) = sidecar("redis", "rw-no-spin").await;
    let crate::coord::Backend::Redis(server) = &b else {
        unreachable!("a Redis sidecar")
    };
    let (st, r) = call(port, "POST", "/rwlocks/s?mode=read&ttl=1s", None).await;
    assert_eq!(st, 200, "{r}");
    let (st, live) = call(port, "POST", "/rwlocks/s?mode=read&ttl=30s&owner=x", None).await;
    assert_eq!(st, 200, "{live}");
    sleep(Duration::from_millis(1300)).await;
    let before = scripts_run(server).await;
    let waiter = tokio::spawn(async move {
        call(
            port,
            "POST",
            "/rwlocks/s?mode=write&ttl=30s&wait=20s&owner=w",
            None,
        )
        .await
    });
    sleep(Duration::from_millis(1500)).await;
    let looks = scripts_run(server).await - before;
    assert!(
        looks < 20,
        "the waiting writer ran {looks} scripts in 1.5 s"
    );
    let (st, r) = call(port, "DELETE", "/rwlocks/s", Some(&token_body(&live))).await;
    assert_eq!(st, 200, "{r}");
    let (st, w) = waiter.await.unwrap();
    assert_eq!(st, 200, "granted once the reader left: {w}");
}

/// On Leases a read-write lock is one Lease (`le-rw-…`, kind `rwlock`)
/// whose state holds the readers and a waiting writer's intent; an intent
/// whose writer stopped waiting without removing it (written here by hand)
/// keeps readers out until its TTL ends by the sidecar's sight, then lets
/// them in (the liveness twin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_locks_lease_holds_its_readers_and_a_writers_intent_on_kubernetes() {
    use leader_elector::backend::kubernetes::coord::{STATE_ANNOTATION, object_name};
    use leader_elector::coord::Kind;
    let (b, _s, port) = sidecar("kubernetes", "rw-lease").await;
    let crate::coord::Backend::Kube(api, _) = &b else {
        unreachable!("a Kubernetes sidecar")
    };
    let object = object_name(Kind::RwLock, "My.Doc");
    assert!(object.starts_with("le-rw-my-doc-"), "{object}");
    let (st, a) = call(port, "POST", "/rwlocks/My.Doc?mode=read&owner=ra", None).await;
    assert_eq!(st, 200, "{a}");
    let state = |l: &Value| -> Value {
        serde_json::from_str(
            l["metadata"]["annotations"][STATE_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap()
    };
    let lease = api
        .lease(&object)
        .expect("one Lease for the read-write lock");
    assert_eq!(
        lease["metadata"]["labels"]["leader-elector.io/kind"],
        "rwlock"
    );
    assert_eq!(
        lease["metadata"]["annotations"]["leader-elector.io/name"],
        "My.Doc"
    );
    assert_eq!(lease["spec"]["holderIdentity"], "ra");
    let writer = tokio::spawn(async move {
        let path = "/rwlocks/My.Doc?mode=write&wait=10s&owner=w1";
        call(port, "POST", path, None).await
    });
    sleep(Duration::from_millis(500)).await;
    let st_now = state(&api.lease(&object).unwrap());
    assert_eq!(st_now["intent"]["owner"], "w1", "{st_now}");
    let (st, r) = call(port, "DELETE", "/rwlocks/My.Doc", Some(&token_body(&a))).await;
    assert_eq!(st, 200, "{r}");
    let (st, w) = writer.await.unwrap();
    assert_eq!(st, 200, "{w}");
    let l = api.lease(&object).unwrap();
    assert!(
        state(&l).get("intent").is_none(),
        "the grant removes it: {l}"
    );
    assert_eq!(l["spec"]["holderIdentity"], "w1");
    let (st, r) = call(port, "DELETE", "/rwlocks/My.Doc", Some(&token_body(&w))).await;
    assert_eq!(st, 200, "{r}");
    // An intent left behind by a writer that stopped waiting, 1 s TTL.
    assert!(api.edit_lease(&object, |l| {
        let mut st = state(l);
        st["intent"] =
            serde_json::json!({"token": "gone", "owner": "ghost", "ttl_ms": 1000, "at_ms": 1});
        l["metadata"]["annotations"][STATE_ANNOTATION] = Value::String(st.to_string());
    }));
    sleep(Duration::from_millis(200)).await;
    let (st, r) = call(port, "POST", "/rwlocks/My.Doc?mode=read", None).await;
    assert_eq!((st, r["holder"].as_str()), (409, Some("ghost")), "{r}");
    let t = Instant::now();
    let (st, r) = call(port, "POST", "/rwlocks/My.Doc?mode=read&wait=5s", None).await;
    assert_eq!(st, 200, "readers enter once the intent's TTL ends: {r}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(fence(&r) > fence(&w), "{w} {r}");
}

/// On Leases, a writer and a reader waiting on one sidecar behind a held
/// reader (the writer's intent recorded) wait on the watch: they read the
/// Lease at most a few times in 1.5 s rather than looking in a loop. The
/// liveness twin: once the reader releases, the writer is granted, and once
/// the writer releases, the waiting reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_and_reader_do_not_poll_the_lease_on_kubernetes() {
    let api = crate::support::kube_api::KubeApi::start("rw-poll");
    let ep = api.endpoint("me").await;
    let kubeconfig = ep.kubeconfig().to_string_lossy().into_owned();
    let args: Vec<String> = ["--backend", "kubernetes"]
        .iter()
        .chain(crate::support::FAST)
        .chain(crate::support::CONTROL)
        .map(|s| s.to_string())
        .collect();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let side =
        crate::support::Sidecar::start_env(&crate::support::election("rw-poll"), "me", &args, &env);
    let port = side.control();
    let (st, a) = call(port, "POST", "/rwlocks/p?mode=read&ttl=30s", None).await;
    assert_eq!(st, 200, "{a}");
    let wait = |mode: &'static str| {
        tokio::spawn(async move {
            let path = format!("/rwlocks/p?mode={mode}&ttl=30s&wait=20s&owner={mode}r");
            call(port, "POST", &path, None).await
        })
    };
    let writer = wait("write");
    sleep(Duration::from_millis(300)).await;
    let reader = wait("read");
    sleep(Duration::from_millis(300)).await;
    let reads = || ep.counts().get("GET lease").copied().unwrap_or(0);
    let before = reads();
    sleep(Duration::from_millis(1500)).await;
    let looked = reads() - before;
    assert!(
        looked <= 3,
        "two waiters read the Lease {looked} times in 1.5 s"
    );
    let (st, r) = call(port, "DELETE", "/rwlocks/p", Some(&token_body(&a))).await;
    assert_eq!(st, 200, "{r}");
    let (st, w) = writer.await.unwrap();
    assert_eq!(st, 200, "{w}");
    sleep(Duration::from_millis(300)).await;
    let (st, r) = call(port, "DELETE", "/rwlocks/p", Some(&token_body(&w))).await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = reader.await.unwrap();
    assert_eq!(st, 200, "{r}");
    assert!(fence(&r) > fence(&w), "{w} {r}");
}
