//! Faults only Redis has: a restart that forgets the key (no persistence, or
//! while the leader is cut off), Redlock losing servers, and a foreign value
//! without expiry.

use super::*;

// ----------------------------------------------------------- Redis scenarios

/// Wait until the wall clock is `frac` into a second.
pub(super) async fn until_wall_fraction(frac: f64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    sleep(Duration::from_secs_f64(
        (frac - now.fract()).rem_euclid(1.0),
    ))
    .await;
}

/// The leader is cut off (a partition), and Redis restarts
/// empty late in a wall-clock second, when `uptime_in_seconds` runs up to a
/// second ahead of real uptime. Nobody may be elected on the emptied server
/// before the cut-off leader's term has run out on its own clock. On the
/// original code a follower led 400-700 ms before the old leader stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_while_the_leader_is_cut_off() {
    let mut servers = Servers::Redis(own_redis(&[]).await);
    let g = Group::start(&servers, "redis-amnesia-cut", ABC).await;
    for round in 0..3 {
        let (l, tok) = g.leader("a leader before the cut").await;
        until_wall_fraction(0.85).await;
        let f = g.rec.fault(Fault {
            ends_term: Some((l, tok)),
            ..Fault::new(
                &format!("leader cut off, Redis restarted empty #{round}"),
                Some(l),
                Expect::CutOff,
                REDIS_RESTART_BOUND,
            )
        });
        g.cut(l, Mode::Blackhole);
        let v = servers.redis_servers_mut();
        restart_redis(&mut v[0]).await;
        sleep(TTL * 2).await;
        g.cut(l, Mode::Pass);
        g.rec.heal(f, false);
        sleep(Duration::from_secs(1)).await;
    }
    g.leader("a leader at the end").await;
    g.finish("redis: restarted empty while the leader is cut off (3 times)")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_loses_one_server_then_two() {
    let mut servers = Servers::Redlock(three_redis().await);
    let mut g = Group::start(&servers, "redlock-lose", ABC).await;
    let key = key_of(Kind::Redis, &g.election);
    let v = servers.redis_servers_mut();
    let (l, tok) = leader_on_all_three(&mut g, v, &key).await;
    // One server of three gone: the quorum (2) still renews; no failover.
    let one = g.rec.fault(Fault {
        keeps_token: Some(tok),
        ..Fault::new(
            "1 of 3 servers SIGKILLed",
            Some(l),
            Expect::NoFailover,
            Duration::ZERO,
        )
    });
    v[0].stop();
    sleep(TTL * 2).await;
    g.rec.heal(one, false);
    // A second one gone: no quorum, the leader steps down by valid_until.
    let two = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new(
            "2 of 3 servers down for 2 x TTL",
            Some(l),
            Expect::CutOff,
            REDIS_RESTART_BOUND,
        )
    });
    v[1].stop();
    sleep(TTL * 2).await;
    restart_redis(&mut v[0]).await;
    restart_redis(&mut v[1]).await;
    g.rec.heal(two, true);
    within(
        REDIS_RESTART_BOUND + Duration::from_secs(5),
        "a leader after the servers came back",
        g.rec
            .wait_leader(REDIS_RESTART_BOUND + Duration::from_secs(4)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    g.finish("redlock: lose 1 of 3 servers, then 2, then restore")
        .await;
}

/// Three redis-servers of our own, durable, for Redlock.
pub(super) async fn three_redis() -> Vec<RedisServer> {
    let mut v = Vec::new();
    for _ in 0..3 {
        v.push(own_redis(DURABLE).await);
    }
    v
}

/// The leader (slot, token) once it holds `key` on all three servers `v`.
///
/// A term granted by a bare quorum (one server too slow at acquisition,
/// e.g. under CPU load) is never extended to the third server: renewals
/// only PEXPIRE existing keys. Such a term cannot survive the loss of a
/// server (see the report); the scenario needs a term on all three, so
/// this hands over (SIGTERM, same name again) until one is.
pub(super) async fn leader_on_all_three(
    g: &mut Group,
    v: &[RedisServer],
    key: &str,
) -> (usize, u64) {
    let mut attempt = 0;
    loop {
        let (l, tok) = g.leader("a Redlock leader").await;
        sleep(RENEW).await;
        let holding = servers_holding(v, key, &g.id(l)).await;
        if holding == 3 {
            return (l, tok);
        }
        attempt += 1;
        eprintln!(
            "redlock: leader {} (token {tok}) holds the key on only {holding} of 3 servers; handing over (attempt {attempt})",
            g.id(l)
        );
        assert!(
            attempt < 4,
            "no Redlock term held all 3 servers in 4 attempts"
        );
        let id = g.id(l);
        g.signal(l, Signal::SIGTERM);
        let mut s = g.sidecars[l].take().unwrap();
        within(
            Duration::from_secs(5),
            "a SIGTERMed sidecar to exit",
            s.wait_exit(Duration::from_secs(4)),
        )
        .await;
        g.rec.stop_polling(l);
        g.spawn(&id).await;
    }
}

/// How many of the servers `v` hold `key` for the sidecar named `id`.
pub(super) async fn servers_holding(v: &[RedisServer], key: &str, id: &str) -> usize {
    let mut holding = 0;
    for server in v {
        let mut c = within(Duration::from_secs(5), "connecting to redis", server.conn()).await;
        let value: Option<String> = within(
            Duration::from_secs(5),
            "redis GET",
            ::redis::cmd("GET").arg(key).query_async(&mut c),
        )
        .await
        .expect("GET the election key");
        if value.is_some_and(|v| v.ends_with(&format!("|{id}"))) {
            holding += 1;
        }
    }
    holding
}

/// What happens: a Redis restarted without persistence forgets the key and
/// the fencing counter. The old leader still has time left on its own clock
/// (`valid_until`) and learns of the loss only at its next renewal (≤ renew
/// interval); a follower whose campaign reaches the empty server first is
/// elected at once with fencing token 1. The README lists this under "Known
/// limits"; the checker still holds the sidecars' own answers to the safety
/// rule, so an overlap found here is reported with its numbers.
///
/// It found one (18 ms to hundreds of ms) and fencing token 1 handed out
/// twice. Fixed in the product: the campaign script refuses a server whose
/// uptime is under one TTL (a restart may have forgotten a live term), and a
/// missing fencing counter starts at the server's clock in milliseconds.
/// Kept as the regression test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_without_persistence() {
    let mut servers = Servers::Redis(own_redis(&[]).await);
    let g = Group::start(&servers, "redis-amnesia", ABC).await;
    for round in 0..3 {
        let (l, tok) = g.leader("a leader before the restart").await;
        sleep(Duration::from_millis(300 + 150 * round)).await;
        let f = g.rec.fault(Fault {
            ends_term: Some((l, tok)),
            ..Fault::new(
                &format!("restart without persistence #{round}"),
                Some(l),
                Expect::Other,
                REDIS_RESTART_BOUND,
            )
        });
        let v = servers.redis_servers_mut();
        restart_redis(&mut v[0]).await;
        g.rec.heal(f, true);
        sleep(TTL).await;
    }
    g.leader("a leader at the end").await;
    g.finish("redis: restarted without persistence (3 times)")
        .await;
}

/// Redlock fencing tokens are "the largest counter in the quorum", and each
/// server's counter grows only with the terms it took part in. Servers that
/// were down for different terms fall behind by different amounts, and a later
/// quorum made of two such servers hands out a token that is not larger than
/// an earlier one — with no data lost anywhere (appendfsync always):
///
/// counters A/B/C = 1/1/1; C down, 2 terms on {A,B} → 3/3/1 (token 3);
/// C up, A down, 2 terms on {B,C} → -/5/3 (token 5); A up, B down, 1 term
/// on {A,C} → 4/-/4: token 4 after 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_fencing_tokens_grow_across_server_outages() {
    let mut v = three_redis().await;
    let urls: Vec<String> = v.iter().map(|r| r.url.clone()).collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let name = election("redlock-fencing");
    let mut tokens: Vec<u64> = Vec::new();
    // One term: a sidecar is elected, reports its token, hands over (SIGTERM).
    let run_terms = async |tokens: &mut Vec<u64>, n: usize| {
        for _ in 0..n {
            let s = redis_sidecar(&refs, &name, "x", FAST);
            wait_for(Duration::from_secs(10), "the sidecar to lead", || {
                s.is_leader()
            })
            .await;
            tokens.push(within(Duration::from_secs(5), "GET /leader", token_of(&s)).await);
            s.signal(Signal::SIGTERM);
            let mut s = s;
            within(
                Duration::from_secs(5),
                "the sidecar to exit",
                s.wait_exit(Duration::from_secs(4)),
            )
            .await;
        }
    };
    run_terms(&mut tokens, 1).await;
    v[2].stop();
    run_terms(&mut tokens, 2).await;
    restart_redis(&mut v[2]).await;
    v[0].stop();
    run_terms(&mut tokens, 2).await;
    restart_redis(&mut v[0]).await;
    v[1].stop();
    run_terms(&mut tokens, 1).await;
    eprintln!("fencing tokens of successive terms: {tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "fencing tokens did not grow: {tokens:?}"
    );
}

/// A Redlock term granted by a bare quorum (2 of 3: the third server was
/// unreachable at that moment) is never extended to the third server once it
/// is back — renewals only PEXPIRE keys that exist — so the term tolerates no
/// server loss at all: losing one of its two servers ends it although two of
/// three servers are up. Expected (README: "lose a minority: one leader
/// stays"): the leader keeps its term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_term_on_a_bare_quorum_survives_losing_a_server() {
    let mut servers = Servers::Redlock(three_redis().await);
    let g = Group::start(&servers, "redlock-bare", ABC).await;
    // Server 2 unreachable for every sidecar during the first election.
    for slot in 0..3 {
        g.proxies[slot][2].set(Mode::Reset);
    }
    let (l, tok) = g.leader("a Redlock leader on servers 0 and 1").await;
    for slot in 0..3 {
        g.proxies[slot][2].set(Mode::Pass);
    }
    sleep(TTL).await;
    let port = g.sidecars[l].as_ref().unwrap().port;
    let (_, body) = within(
        Duration::from_secs(5),
        "GET /leader",
        http_get(port, "/leader"),
    )
    .await
    .expect("the leader answers");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    eprintln!(
        "leader {} (token {tok}) after server 2 came back: servers_answered {} of {}",
        g.id(l),
        body["servers_answered"],
        body["servers_total"]
    );
    let f = g.rec.fault(Fault {
        keeps_token: Some(tok),
        ..Fault::new(
            "1 of 3 servers SIGKILLed (term held on 0 and 1)",
            Some(l),
            Expect::NoFailover,
            Duration::ZERO,
        )
    });
    servers.kill(0);
    sleep(TTL * 2).await;
    g.rec.heal(f, false);
    g.finish("redlock: term on a bare quorum loses a server")
        .await;
}

/// A foreign value without expiry on the Redis key (`SET key v`): followers
/// read `PTTL` −1, take it as "expires now" and campaign again after at most
/// 20 ms of jitter instead of the retry period: each follower then sends
/// about 70 campaign scripts a second for as long as the value stands.
/// Expected: at most about one attempt per follower per retry period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_foreign_value_without_ttl_does_not_make_followers_spin() {
    let servers = Servers::single(Kind::Redis).await;
    let g = Group::start(&servers, "redis-spin", ABC).await;
    g.leader("first election").await;
    let key = key_of(Kind::Redis, &g.election);
    tamper(&servers, &key, Some("intruder")).await;
    // Let the holder notice (next renewal) and everybody settle on following.
    sleep(RENEW * 2).await;
    let before = acquire_attempts(&g).await;
    let window = Duration::from_secs(2);
    sleep(window).await;
    let attempts = acquire_attempts(&g).await - before;
    let allowed = 3 * 2 * (window.as_millis() / RETRY.as_millis()) as u64 + 6;
    eprintln!(
        "campaign attempts in {window:?} with a foreign value without TTL: {attempts} (allowed {allowed})"
    );
    assert!(
        attempts <= allowed,
        "{attempts} campaign attempts in {window:?} by 3 sidecars while a foreign value without TTL held the key (allowed {allowed})"
    );
}
