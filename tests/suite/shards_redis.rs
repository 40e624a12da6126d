//! The Redis shard store on a real `redis-server`, through the
//! [`ShardStore`] trait: sessions, records, tokens per shard, expiry,
//! hand edits, a restart and change notices; then three keepers on it (16
//! shards sampled every 10 ms): never two claimants, tokens never go down,
//! every shard owned within 1 s of a join or a leave, and within 2 TTL + 1 s
//! of a crash (an expiry publishes nothing: the survivor's periodic read
//! finds it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leader_elector::backend::BackendError;
use leader_elector::backend::redis::shards::RedisShards;
use leader_elector::backend::redis::{RedisBackend, RedisOptions};
use leader_elector::backend::shards::{Session, ShardStore};
use leader_elector::shards::keeper::{Keeper, KeeperConfig, ShardView};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::support::*;

fn store(server: &RedisServer, test: &str) -> Arc<RedisShards> {
    let backend = RedisBackend::new(
        "leader-elector:",
        &election(test),
        RedisOptions {
            urls: vec![server.url.clone()],
            per_server_timeout: Duration::from_millis(500),
            ..RedisOptions::default()
        },
    )
    .expect("a Redis backend");
    Arc::new(RedisShards::new(backend).expect("one server keeps shards"))
}

fn base(test: &str) -> String {
    format!("leader-elector:{{{}}}:shards:", election(test))
}

/// Run one command by hand (as another program would), e.g. `["DEL", key]`.
async fn by_hand(server: &RedisServer, args: &[&str]) -> redis::Value {
    let mut c = server.conn().await;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut c).await.expect("a command by hand")
}

/// The server's `uptime_in_seconds`.
async fn uptime(server: &RedisServer) -> u64 {
    let info = by_hand(server, &["INFO", "server"]).await;
    let info = match info {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO answered {other:?}"),
    };
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"));
    line.and_then(|v| v.trim().parse().ok()).expect("an uptime")
}

/// A server up long enough for acquisitions under `ttl`: the store's
/// restart hold-off (uptime below TTL + 1 s) is over.
async fn started(ttl: Duration) -> RedisServer {
    let r = RedisServer::start().await;
    while Duration::from_secs(uptime(&r).await) < ttl + Duration::from_secs(1) {
        sleep(Duration::from_millis(50)).await;
    }
    r
}

async fn take(s: &RedisShards, session: &Session, member: &str, shard: u32) -> u64 {
    s.acquire(session, member, shard)
        .await
        .expect("an answer")
        .unwrap_or_else(|| panic!("{member} is refused shard {shard}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_records_and_tokens_round_trip() {
    let r = started(Duration::from_secs(2)).await;
    let s = store(&r, "shards-round-trip");
    let ttl = Duration::from_secs(2);
    let a = s.open("a", 16, ttl).await.unwrap();
    assert_eq!(a.ttl, ttl);
    let t1 = take(&s, &a, "a", 0).await;
    let snap = s.read(16).await.unwrap();
    assert_eq!(snap.members.len(), 1);
    assert_eq!(
        (snap.members[0].identity.as_str(), snap.members[0].shards),
        ("a", 16)
    );
    assert_eq!(snap.shards.len(), 16);
    let rec = snap.shards[0].clone().expect("shard 0 held");
    assert_eq!(
        (rec.member.as_str(), rec.session.as_str(), rec.token),
        ("a", a.id.as_str(), t1)
    );
    assert!(snap.shards[1..].iter().all(Option::is_none));
    assert!(s.renew(&a).await.unwrap());
    // Taken again under the same session: a new, larger token.
    let t2 = take(&s, &a, "a", 0).await;
    assert!(t2 > t1, "{t1} then {t2}");
    s.release(&a, 0).await.unwrap();
    assert_eq!(s.read(16).await.unwrap().shards[0], None);
    let t3 = take(&s, &a, "a", 0).await;
    let u1 = take(&s, &a, "a", 1).await;
    let b = s.open("b", 16, ttl).await.unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(
        s.acquire(&b, "b", 0).await.unwrap(),
        None,
        "a holds shard 0"
    );
    // b's release of a's record does nothing.
    s.release(&b, 0).await.unwrap();
    assert_eq!(
        s.read(16).await.unwrap().shards[0].as_ref().unwrap().token,
        t3
    );
    s.close(&a).await.unwrap();
    let snap = s.read(16).await.unwrap();
    assert_eq!(snap.members.len(), 1, "{snap:?}");
    assert!(
        snap.shards.iter().all(Option::is_none),
        "a's records went with it"
    );
    let t4 = take(&s, &b, "b", 0).await;
    let u2 = take(&s, &b, "b", 1).await;
    assert!(t4 > t3 && t3 > t2 && u2 > u1, "tokens grow per shard");
    assert_eq!(
        s.acquire(&a, "a", 2).await.unwrap(),
        None,
        "a closed session takes nothing"
    );
    assert!(
        !s.renew(&a).await.unwrap(),
        "a closed session is not renewed"
    );
    s.close(&b).await.unwrap();
    let snap = s.read(16).await.unwrap();
    assert!(snap.members.is_empty() && snap.shards.iter().all(Option::is_none));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_shard_is_taken_only_once_its_session_ran_out() {
    let r = started(Duration::from_secs(2)).await;
    let s = store(&r, "shards-expiry");
    let ttl = Duration::from_secs(1);
    let sent = Instant::now();
    let a = s.open("a", 4, ttl).await.unwrap();
    let t1 = take(&s, &a, "a", 3).await;
    let b = s.open("b", 4, Duration::from_secs(2)).await.unwrap();
    // b asks until granted: never before a's TTL, counted from the send of
    // a's open (the server counts from its receipt, later).
    let granted = loop {
        if let Some(t) = s.acquire(&b, "b", 3).await.unwrap() {
            break t;
        }
        assert!(sent.elapsed() < ttl * 3, "a's record outlived its session");
        sleep(Duration::from_millis(5)).await;
    };
    let at = sent.elapsed();
    assert!(
        at >= ttl,
        "taken {at:?} after a's open, before its TTL {ttl:?}"
    );
    assert!(granted > t1, "{t1} then {granted}");
    let snap = s.read(4).await.unwrap();
    let ids: Vec<&str> = snap.members.iter().map(|m| m.identity.as_str()).collect();
    assert_eq!(ids, ["b"]);
    assert_eq!(snap.shards[3].as_ref().unwrap().session, b.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_ttl_is_not_renewed_nor_brought_back() {
    let r = started(Duration::from_millis(300)).await;
    let test = "shards-renew-late";
    let s = store(&r, test);
    let a = s.open("a", 4, Duration::from_millis(300)).await.unwrap();
    take(&s, &a, "a", 1).await;
    let key = format!("{}session:{}", base(test), a.id);
    // The server's own expiry is the event: wait for the key to go.
    let start = Instant::now();
    while by_hand(&r, &["EXISTS", &key]).await == redis::Value::Int(1) {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the session key stays"
        );
        sleep(Duration::from_millis(5)).await;
    }
    assert!(!s.renew(&a).await.unwrap());
    assert!(!s.renew(&a).await.unwrap());
    assert_eq!(by_hand(&r, &["EXISTS", &key]).await, redis::Value::Int(0));
    let snap = s.read(4).await.unwrap();
    assert!(snap.members.is_empty() && snap.shards.iter().all(Option::is_none));
    assert_eq!(s.acquire(&a, "a", 1).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_grants_nothing_for_one_ttl() {
    let ttl = Duration::from_secs(1);
    let mut r = started(ttl).await;
    let s = store(&r, "shards-restart");
    let a = s.open("a", 4, ttl).await.unwrap();
    let t1 = take(&s, &a, "a", 0).await;
    let before = Instant::now();
    r.restart().await;
    // The server forgot a's session and record; a's renewal says so, and
    // nobody takes the shard before a's validity has surely ended.
    let b = loop {
        match s.open("b", 4, ttl).await {
            Ok(b) => break b,
            Err(_) => sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(!s.renew(&a).await.unwrap());
    let granted = loop {
        if let Some(t) = s.acquire(&b, "b", 0).await.unwrap() {
            break t;
        }
        assert!(s.renew(&b).await.unwrap(), "b's session lives");
        assert!(
            before.elapsed() < ttl * 5,
            "never granted after the restart"
        );
        sleep(Duration::from_millis(20)).await;
    };
    let at = before.elapsed();
    assert!(
        at >= ttl,
        "granted {at:?} after the restart, within one TTL {ttl:?}"
    );
    assert!(
        granted > t1,
        "{t1} then {granted}: tokens grow across the restart"
    );
}

fn bad_counter(e: &BackendError) -> bool {
    matches!(
        e,
        BackendError::Rejected {
            code: "fencing_counter",
            ..
        }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_edits_never_crash_nor_give_a_smaller_token() {
    let r = started(Duration::from_secs(2)).await;
    let test = "shards-hand-edits";
    let s = store(&r, test);
    let ttl = Duration::from_secs(2);
    let (a, b) = (
        s.open("a", 4, ttl).await.unwrap(),
        s.open("b", 4, ttl).await.unwrap(),
    );
    let (record, counter) = (format!("{}s:2", base(test)), format!("{}t:2", base(test)));
    let t1 = take(&s, &a, "a", 2).await;
    by_hand(&r, &["DEL", &record]).await;
    assert_eq!(s.read(4).await.unwrap().shards[2], None);
    let t2 = take(&s, &b, "b", 2).await;
    assert!(t2 > t1, "{t1} then {t2}");
    by_hand(&r, &["SET", &record, "garbage"]).await;
    assert_eq!(
        s.read(4).await.unwrap().shards[2],
        None,
        "garbage is no record"
    );
    let t3 = take(&s, &a, "a", 2).await;
    assert!(t3 > t2, "{t2} then {t3}");
    // A forgotten counter starts again at the server's clock (ms), past
    // every earlier token once a millisecond went by.
    sleep(Duration::from_millis(3)).await;
    by_hand(&r, &["DEL", &counter]).await;
    let t4 = take(&s, &a, "a", 2).await;
    assert!(t4 > t3, "{t3} then {t4}");
    for garbage in ["abc", "-5", "1234567890123456"] {
        by_hand(&r, &["SET", &counter, garbage]).await;
        let e = s
            .acquire(&a, "a", 2)
            .await
            .expect_err("a garbage counter is refused");
        assert!(bad_counter(&e), "{garbage}: {e}");
        assert!(format!("{e:?}").contains(garbage), "{e:?}");
        let kept = s.read(4).await.unwrap().shards[2].clone().unwrap();
        assert_eq!(kept.token, t4, "a refusal writes nothing");
        let v = by_hand(&r, &["GET", &counter]).await;
        assert_eq!(v, redis::Value::BulkString(garbage.as_bytes().to_vec()));
    }
    by_hand(&r, &["SET", &counter, &t4.to_string()]).await;
    assert!(take(&s, &a, "a", 2).await > t4);
    // A session key deleted by hand: its member is gone, its renewal false.
    by_hand(&r, &["DEL", &format!("{}session:{}", base(test), b.id)]).await;
    let ids: Vec<String> = s
        .read(4)
        .await
        .unwrap()
        .members
        .into_iter()
        .map(|m| m.identity)
        .collect();
    assert_eq!(ids, ["a"]);
    assert!(!s.renew(&b).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_acquire_is_noticed() {
    let r = started(Duration::from_secs(2)).await;
    let (mine, theirs) = (store(&r, "shards-notice"), store(&r, "shards-notice"));
    let mut seen = 0;
    // The first call subscribes; nothing happened since.
    assert!(!mine.changed(&mut seen, Duration::from_millis(100)).await);
    let b = theirs.open("b", 4, Duration::from_secs(2)).await.unwrap();
    assert!(
        mine.changed(&mut seen, Duration::from_secs(2)).await,
        "open noticed"
    );
    // Drain what else came, then one acquire.
    while mine.changed(&mut seen, Duration::from_millis(100)).await {}
    let before = seen;
    let waiter = {
        let mine = mine.clone();
        tokio::spawn(async move { mine.changed(&mut { before }, Duration::from_secs(2)).await })
    };
    sleep(Duration::from_millis(50)).await;
    take(&theirs, &b, "b", 0).await;
    assert!(waiter.await.unwrap(), "the acquire was noticed");
    assert!(mine.changed(&mut seen, Duration::from_secs(2)).await);
    // Other elections' changes are not ours.
    let other = store(&r, "shards-notice-other");
    let c = other.open("c", 4, Duration::from_secs(2)).await.unwrap();
    take(&other, &c, "c", 0).await;
    assert!(
        !mine.changed(&mut seen, Duration::from_millis(300)).await,
        "{seen}"
    );
}

#[test]
fn shards_are_refused_on_redlock() {
    let urls = [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ];
    let backend = RedisBackend::new(
        "leader-elector:",
        "shards-redlock",
        RedisOptions {
            urls: urls.map(String::from).to_vec(),
            per_server_timeout: Duration::from_millis(500),
            ..RedisOptions::default()
        },
    )
    .unwrap();
    assert!(RedisShards::new(backend).is_err());
}

const N: u32 = 16;

struct Member {
    view: watch::Receiver<ShardView>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _gate: watch::Sender<bool>,
}

fn start(store: &Arc<RedisShards>, id: &str) -> Member {
    let ttl = Duration::from_secs(2);
    let cfg = KeeperConfig {
        identity: id.into(),
        shards: N,
        ttl,
        renew_interval: ttl / 3,
        margin: Duration::from_millis(50),
        call_timeout: Duration::from_millis(400),
    };
    let (keeper, view) = Keeper::new(cfg, store.clone());
    let (gate, eligible) = watch::channel(true);
    let stop = CancellationToken::new();
    let task = tokio::spawn(keeper.run(eligible, stop.clone()));
    Member {
        view,
        stop,
        task,
        _gate: gate,
    }
}

/// Sample every member's claims every 10 ms for `span`: panics on two
/// claimants of a shard or a token that went down; answers since when
/// every shard has been claimed (`None`: not at the end) and the owners.
async fn watch_claims(
    members: &BTreeMap<&str, Member>,
    tokens: &mut BTreeMap<u32, u64>,
    span: Duration,
) -> (Option<Instant>, BTreeMap<u32, String>) {
    let end = Instant::now() + span;
    let (mut settled, mut map) = (None, BTreeMap::new());
    while Instant::now() < end {
        let now = Instant::now();
        map.clear();
        for (id, m) in members {
            for (shard, token) in m.view.borrow().claimed_at(now) {
                if let Some(other) = map.insert(shard, id.to_string()) {
                    panic!("shard {shard} claimed by {other} and {id} at once");
                }
                let last = tokens.entry(shard).or_insert(token);
                assert!(token >= *last, "shard {shard}: token {token} after {last}");
                *last = token;
            }
        }
        if map.len() == N as usize {
            settled.get_or_insert(now);
        } else {
            settled = None;
        }
        sleep(Duration::from_millis(10)).await;
    }
    (settled, map)
}

fn balanced(map: &BTreeMap<u32, String>, ids: &[&str]) {
    let mut c: BTreeMap<&str, usize> = BTreeMap::new();
    for o in map.values() {
        *c.entry(o.as_str()).or_default() += 1;
    }
    let m = ids.len() as u32;
    let (lo, hi) = ((N / m) as usize, N.div_ceil(m) as usize);
    assert_eq!(c.len(), ids.len(), "owners {c:?}");
    assert!(c.values().all(|&k| k >= lo && k <= hi), "unbalanced: {c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_keepers_share_sixteen_shards_with_never_two_owners() {
    let r = started(Duration::from_secs(2)).await;
    let (mut members, mut tokens) = (BTreeMap::new(), BTreeMap::new());
    let mut ids = Vec::new();
    for id in ["a", "b", "c"] {
        members.insert(id, start(&store(&r, "shards-keepers"), id));
        ids.push(id);
        let joined = Instant::now();
        let (settled, map) = watch_claims(&members, &mut tokens, Duration::from_secs(2)).await;
        let at = settled.unwrap_or_else(|| panic!("{id} joined: not every shard owned: {map:?}"));
        assert!(
            at - joined <= Duration::from_secs(1),
            "{id}'s join settled after {:?}",
            at - joined
        );
        balanced(&map, &ids);
    }
    let c = members.remove("c").unwrap();
    c.stop.cancel();
    ids.pop();
    let left = Instant::now();
    let (settled, map) = watch_claims(&members, &mut tokens, Duration::from_secs(2)).await;
    let at = settled.unwrap_or_else(|| panic!("c left: not every shard owned: {map:?}"));
    assert!(
        at - left <= Duration::from_secs(1),
        "c's leave settled after {:?}",
        at - left
    );
    balanced(&map, &ids);
    // A crash (the task gone without a word): no notice comes at the
    // expiry; the survivor takes b's shards at its next read after b's TTL.
    members.remove("b").unwrap().task.abort();
    let crashed = Instant::now();
    let (settled, map) = watch_claims(&members, &mut tokens, Duration::from_secs(6)).await;
    let at = settled.unwrap_or_else(|| panic!("b crashed: not every shard owned: {map:?}"));
    eprintln!("a crash settled after {:?}", at - crashed);
    assert!(
        at - crashed <= Duration::from_secs(5),
        "b's crash settled after {:?}",
        at - crashed
    );
    balanced(&map, &["a"]);
    for m in members.values() {
        m.stop.cancel();
    }
}
