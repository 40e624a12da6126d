//! Operations on real Redis servers (one, and a Redlock group of three),
//! through the backend trait: the scenarios of [`crate::etcd_ops`] (the
//! registry, a release naming a successor, the pause), keys written or
//! deleted by hand, and Redlock's pause rule: it counts only when a quorum
//! of servers took it.

use std::sync::Arc;
use std::time::Duration;

use leader_elector::backend::controls::Controls;
use leader_elector::backend::redis::{FALLBACK, RedisBackend, RedisOptions};
use leader_elector::backend::{Campaign, ControlStore, LeaseBackend, Renewal, Term, WaitReason};
use tokio::time::timeout;

use crate::etcd_ops::*;
use crate::support::*;

fn backend(urls: &[String], election: &str) -> Backend {
    let b: Arc<RedisBackend> = RedisBackend::new(
        "leader-elector:",
        election,
        RedisOptions {
            urls: urls.to_vec(),
            per_server_timeout: Duration::from_millis(500),
            ..RedisOptions::default()
        },
    )
    .expect("a Redis backend");
    b
}

fn maker(servers: &[&RedisServer], test: &str) -> impl Fn() -> Backend + use<> {
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let el = election(test);
    move || backend(&urls, &el)
}

fn base(test: &str) -> String {
    format!("leader-elector:{{{}}}", election(test))
}

/// Run one command by hand (as another program would), e.g. `["DEL", key]`.
async fn by_hand<T: redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> T {
    let mut c = server.conn().await;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut c).await.expect("a command by hand")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_lists_what_was_published_until_withdrawn_or_lapsed() {
    let r = RedisServer::start().await;
    registry_lists_until_withdrawn_or_lapsed(&maker(&[&r], "r-registry")).await;
    let three = [
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ];
    let all: Vec<&RedisServer> = three.iter().collect();
    registry_lists_until_withdrawn_or_lapsed(&maker(&all, "r-registry-3")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_watch_resolves_on_join_and_leave() {
    let r = RedisServer::start().await;
    registry_watch_resolves_on_join_and_leave(&maker(&[&r], "r-registry-watch")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_to_a_named_successor_goes_to_it_and_the_third_waits() {
    let r = RedisServer::start().await;
    successor_takes_the_term(&maker(&[&r], "r-successor"), "redis").await;
    let three = [
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ];
    let all: Vec<&RedisServer> = three.iter().collect();
    successor_takes_the_term(&maker(&all, "r-successor-3"), "redlock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_names_the_registry_choice_on_redis() {
    let r = RedisServer::start().await;
    a_plain_release_names_the_registry_choice(&maker(&[&r], "r-registry-choice")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_unknown_successor_costs_at_most_the_wait() {
    let r = RedisServer::start().await;
    let make = maker(&[&r], "r-successor-dead");
    a_dead_successor_costs_at_most_the_wait(&make, "redis", WaitReason::SuccessorHeadStart).await;
    // Written by hand without a TTL: the campaign script gives it one.
    let test = "r-successor-foreign";
    let key = format!("{}:successor", base(test));
    by_hand::<()>(&r, &["SET", &key, "nobody"]).await;
    let b = maker(&[&r], test)();
    a_foreign_successor_costs_at_most_the_wait(&*b, "redis", WaitReason::SuccessorHeadStart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_election_starts_no_term_until_resumed() {
    let r = RedisServer::start().await;
    a_paused_election_starts_no_term(&maker(&[&r], "r-pause")).await;
    campaigns_racing_the_pause(&maker(&[&r], "r-pause-race")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controls_watch_reports_pause_switchover_and_a_foreign_resume() {
    let r = RedisServer::start().await;
    let test = "r-controls";
    let make = maker(&[&r], test);
    the_controls_watch_reports_changes(&make).await;
    let key = format!("{}:paused", base(test));
    // No message for an edit by hand: the watch's fallback re-read finds it.
    let limit = FALLBACK + Duration::from_secs(1);
    let args = ["DEL", key.as_str()];
    let delete = by_hand::<()>(&r, &args);
    a_pause_deleted_by_hand_resumes(&*make(), delete, limit).await;
}

/// Redlock: a pause on a quorum blocks every campaign, also with one server
/// down; a pause only a minority could take is refused and taken back.
/// Liveness twin: resumed, a campaign wins on the remaining quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_pause_counts_only_on_a_quorum() {
    let mut three = [
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ];
    let make = {
        let all: Vec<&RedisServer> = three.iter().collect();
        maker(&all, "r-pause-3")
    };
    let (op, c) = (make(), make());
    let t = elect(&*c, "c").await;
    c.release(&t, None).await.unwrap();
    three[2].stop();
    op.set_paused(true).await.expect("a pause on 2 of 3 counts");
    assert!(op.controls().await.unwrap().paused);
    for _ in 0..3 {
        match campaign(&*c, "c").await {
            Campaign::Waiting { why, .. } => assert_eq!(why, WaitReason::Paused),
            other => panic!("a campaign while a quorum is paused: {other:?}"),
        }
    }
    op.set_paused(false).await.unwrap();
    let t = elect(&*c, "c").await;
    c.release(&t, None).await.unwrap();
    // Two of three down: a pause on one server is refused and taken back.
    three[1].stop();
    let refused = op.set_paused(true).await;
    assert!(refused.is_err(), "{refused:?}");
    let key = format!("{}:paused", base("r-pause-3"));
    let left: bool = by_hand(&three[0], &["EXISTS", &key]).await;
    assert!(!left, "the minority's pause was not taken back");
}

/// One candidate's backend on `servers` that re-reads its controls only
/// every minute, elected: whatever its controls watch sees sooner came
/// from a notice or from its renewals.
async fn a_leader_on(servers: &[&RedisServer], test: &str) -> (Arc<RedisBackend>, Term) {
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let options = RedisOptions {
        urls,
        per_server_timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    let b = RedisBackend::new("leader-elector:", &election(test), options).expect("a backend");
    b.set_reread(Duration::from_secs(60));
    let t = elect(&*b, "leader").await;
    (b, t)
}

/// Renew `t` (TTL 2 s: each step renews before it waits).
async fn renewed(b: &RedisBackend, t: &Term) {
    let renewed = b.renew(t).await.expect("a renewal");
    assert!(matches!(renewed, Renewal::Renewed { .. }), "{renewed:?}");
}

/// What the leader's controls watch from `seen` delivers once `edit` ran
/// (nothing before the leader's next renewal: the edit published nothing)
/// and the leader renewed once; `None` when it delivers nothing within
/// 1 s of that renewal (the re-read is a minute away).
async fn after_one_renewal(
    b: &RedisBackend,
    t: &Term,
    seen: &Controls,
    edit: impl std::future::Future<Output = ()>,
) -> Option<Controls> {
    renewed(b, t).await;
    let w = b.watch_controls(seen);
    tokio::pin!(w);
    assert!(timeout(Duration::from_millis(200), &mut w).await.is_err());
    edit.await;
    let before = timeout(Duration::from_millis(200), &mut w).await;
    assert!(before.is_err(), "seen before a renewal: {before:?}");
    renewed(b, t).await;
    let after = timeout(Duration::from_secs(1), w).await;
    renewed(b, t).await;
    Some(after.ok()?.expect("the controls watch"))
}

/// A pause or switchover key set by hand (as `redis-cli SET` would: no
/// notice) reaches the leader's controls watch at its next renewal,
/// though the re-read is a minute away. Twin: a renewal without an edit
/// delivers nothing. Redlock: an edit on one server of three (no quorum)
/// delivers nothing; on two it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_key_set_by_hand_reaches_the_leader_at_its_next_renewal() {
    let r = RedisServer::start().await;
    let test = "r-renew-controls";
    let (b, t) = a_leader_on(&[&r], test).await;
    let none = Controls::default();
    let quiet = after_one_renewal(&b, &t, &none, async {}).await;
    assert_eq!(
        quiet, None,
        "a renewal without an edit changed the controls"
    );
    let (paused, to) = (
        format!("{}:paused", base(test)),
        format!("{}:switchover", base(test)),
    );
    let args = ["SET", paused.as_str(), "paused"];
    let pause = by_hand::<()>(&r, &args);
    let seen = after_one_renewal(&b, &t, &none, pause).await;
    let want = Controls {
        paused: true,
        switchover: None,
    };
    assert_eq!(seen.as_ref(), Some(&want), "a pause set by hand");
    let args = ["SET", to.as_str(), "b"];
    let ask = by_hand::<()>(&r, &args);
    let seen = after_one_renewal(&b, &t, &want, ask).await;
    let want = Controls {
        paused: true,
        switchover: Some("b".into()),
    };
    assert_eq!(seen, Some(want), "a switchover asked by hand");

    let three = [
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ];
    let test = "r-renew-controls-3";
    let all: Vec<&RedisServer> = three.iter().collect();
    let (b, t) = a_leader_on(&all, test).await;
    let paused = format!("{}:paused", base(test));
    let args = ["SET", paused.as_str(), "paused"];
    let one = by_hand::<()>(&three[0], &args);
    let seen = after_one_renewal(&b, &t, &none, one).await;
    assert_eq!(seen, None, "a pause on one server of three counted");
    let two = by_hand::<()>(&three[1], &args);
    let seen = after_one_renewal(&b, &t, &none, two).await;
    assert_eq!(
        seen,
        Some(Controls {
            paused: true,
            switchover: None
        })
    );
}
