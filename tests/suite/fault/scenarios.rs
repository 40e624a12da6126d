//! The scenarios every backend runs (`fault_table!` in the module above):
//! one fault against three sidecars on a single etcd member or redis-server,
//! and the hand edits of the election key.

use super::*;

// ---------------------------------------------------------------- scenarios

pub(super) async fn kill_leader(kind: Kind) {
    let servers = Servers::single(kind).await;
    let mut g = Group::start(&servers, &format!("{}-kill", kind.name()), ABC).await;
    let (l, tok) = g.leader("first election").await;
    g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new("SIGKILL leader", Some(l), Expect::Killed, FAILOVER_BOUND)
    });
    g.kill(l).await;
    within(
        FAILOVER_BOUND + Duration::from_secs(3),
        "a new leader after SIGKILL",
        g.rec
            .wait_new_leader((l, tok), FAILOVER_BOUND + Duration::from_secs(2)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    g.finish(&format!("{}: SIGKILL the leader", kind.name()))
        .await;
}

pub(super) async fn pause_leader(kind: Kind) {
    let servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-pause", kind.name()), ABC).await;
    let (l, tok) = g.leader("first election").await;
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new(
            "SIGSTOP leader for 2 x TTL",
            Some(l),
            Expect::Paused,
            FAILOVER_BOUND,
        )
    });
    g.signal(l, Signal::SIGSTOP);
    sleep(TTL * 2).await;
    g.signal(l, Signal::SIGCONT);
    g.rec.heal(f, false);
    sleep(Duration::from_secs(2)).await;
    g.leader("one leader after SIGCONT").await;
    g.finish(&format!("{}: SIGSTOP the leader 2 x TTL", kind.name()))
        .await;
}

pub(super) async fn cut_leader(kind: Kind, mode: Mode, label: &str) {
    let servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-cut-{label}", kind.name()), ABC).await;
    let (l, tok) = g.leader("first election").await;
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new(
            &format!("{label} leader 2 x TTL"),
            Some(l),
            Expect::CutOff,
            FAILOVER_BOUND,
        )
    });
    g.cut(l, mode);
    sleep(TTL * 2).await;
    g.cut(l, Mode::Pass);
    g.rec.heal(f, false);
    sleep(Duration::from_secs(2)).await;
    g.leader("one leader after the cut healed").await;
    g.finish(&format!(
        "{}: {label} the leader's connections 2 x TTL",
        kind.name()
    ))
    .await;
}

pub(super) async fn delay_all(kind: Kind) {
    let servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-delay", kind.name()), ABC).await;
    let (l, tok) = g.leader("first election").await;
    // Every answer 700 ms late (> renew interval, > the 333 ms call deadline):
    // no renewal can succeed, so the leader steps down by its valid_until and
    // nobody can be elected until the delay ends.
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new(
            "answers delayed 700 ms for 2 x TTL",
            Some(l),
            Expect::CutOff,
            FAILOVER_BOUND,
        )
    });
    g.cut_all(Mode::Delay(SLOW));
    sleep(TTL * 2).await;
    g.cut_all(Mode::Pass);
    g.rec.heal(f, true);
    within(
        FAILOVER_BOUND + Duration::from_secs(5),
        "a leader after the delay ended",
        g.rec.wait_leader(FAILOVER_BOUND + Duration::from_secs(4)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    g.finish(&format!(
        "{}: every backend answer delayed 700 ms",
        kind.name()
    ))
    .await;
}

pub(super) async fn blip(kind: Kind, mode: Mode, label: &str) {
    let servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-blip-{label}", kind.name()), ABC).await;
    let (l, tok) = g.leader("first election").await;
    // Let the leader settle into its renew cycle first.
    sleep(Duration::from_secs(1)).await;
    let f = g.rec.fault(Fault {
        keeps_token: Some(tok),
        ..Fault::new(
            &format!("{label} leader 150 ms"),
            Some(l),
            Expect::NoFailover,
            Duration::ZERO,
        )
    });
    g.cut(l, mode);
    sleep(BLIP).await;
    g.cut(l, Mode::Pass);
    g.rec.heal(f, false);
    sleep(Duration::from_secs(2)).await;
    let (l2, tok2) = g.leader("the same leader after the blip").await;
    assert_eq!(
        (g.id(l2), tok2),
        (g.id(l), tok),
        "a 150 ms {label} changed the leader"
    );
    g.finish(&format!(
        "{}: 150 ms {label} blip of the leader",
        kind.name()
    ))
    .await;
}

pub(super) async fn backend_down(kind: Kind) {
    let mut servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-down", kind.name()), ABC).await;
    let (l, tok) = g.leader("first election").await;
    let bound = match kind {
        Kind::Etcd => RESTART_BOUND,
        Kind::Redis => REDIS_RESTART_BOUND,
    };
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new("backend stopped 3 x TTL", Some(l), Expect::CutOff, bound)
    });
    servers.kill(0);
    sleep(TTL * 3).await;
    servers.revive(0).await;
    servers.wait_healthy().await;
    g.rec.heal(f, true);
    within(
        bound + Duration::from_secs(5),
        "a leader after the backend came back",
        g.rec.wait_leader(bound + Duration::from_secs(4)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    g.finish(&format!(
        "{}: backend stopped 3 x TTL and started again",
        kind.name()
    ))
    .await;
}

pub(super) fn key_of(kind: Kind, election: &str) -> String {
    match kind {
        Kind::Etcd => format!("/leader-elector/{election}"),
        Kind::Redis => format!("leader-elector:{{{election}}}"),
    }
}

/// Delete the election key (`value` None) or overwrite it with `value`
/// (etcd: a put with no lease; Redis: a SET with no expiry).
pub(super) async fn tamper(servers: &Servers, key: &str, value: Option<&str>) {
    match servers {
        Servers::Redis(_) | Servers::Redlock(_) => {
            // On every server of a Redlock group (a server that is down is
            // skipped): changing one server alone does not end a term.
            for server in servers.redis_servers() {
                let conn = timeout(Duration::from_secs(2), server.conn()).await;
                let Ok(mut c) = conn else { continue };
                let cmd = match value {
                    None => ::redis::cmd("DEL").arg(key).clone(),
                    Some(val) => ::redis::cmd("SET").arg(key).arg(val).clone(),
                };
                within(
                    Duration::from_secs(5),
                    "redis DEL/SET",
                    cmd.query_async::<()>(&mut c),
                )
                .await
                .expect("change the key");
            }
        }
        Servers::EtcdCluster(c) => {
            let mut cl = cluster_client(c).await;
            let r = match value {
                None => within(Duration::from_secs(5), "etcd delete", cl.delete(key, None))
                    .await
                    .map(|_| ()),
                Some(v) => within(Duration::from_secs(5), "etcd put", cl.put(key, v, None))
                    .await
                    .map(|_| ()),
            };
            r.expect("change the key on the cluster");
        }
        other => unreachable!("no fault scenario runs on {}", other.name()),
    }
}

pub(super) async fn acquire_attempts(g: &Group) -> u64 {
    let mut total = 0;
    for slot in g.live() {
        let port = g.sidecars[slot].as_ref().unwrap().port;
        let (_, text) = within(
            Duration::from_secs(5),
            "GET /metrics",
            http_get(port, "/metrics"),
        )
        .await
        .expect("metrics answer");
        total += text
            .lines()
            .filter(|l| l.starts_with("leader_election_acquire_attempts_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64;
    }
    total
}

/// Rounds of "delete the key by hand", each after a different wait so the
/// delete lands at different points of the leader's and the followers' cycles.
pub(super) const DELETE_WAITS_MS: &[u64] = &[700, 1900, 2650, 3400];

pub(super) async fn key_deleted(kind: Kind) -> Report {
    let servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-del", kind.name()), ABC).await;
    let key = key_of(kind, &g.election);
    // etcd: the holder's watch sees the delete at once; Redis: its next
    // renewal (≤ renew interval) finds the key gone (README, known limits).
    let limit = match kind {
        Kind::Etcd => Duration::from_millis(300),
        Kind::Redis => RENEW + Duration::from_millis(150),
    };
    for (round, wait) in DELETE_WAITS_MS.iter().enumerate() {
        let (l, tok) = g.leader("a leader before the delete").await;
        sleep(Duration::from_millis(*wait)).await;
        let f = g.rec.fault(Fault {
            ends_term: Some((l, tok)),
            ..Fault::new(
                &format!("key deleted by hand #{round}"),
                Some(l),
                Expect::Other,
                FAILOVER_BOUND,
            )
        });
        let t = Instant::now();
        tamper(&servers, &key, None).await;
        within(
            FAILOVER_BOUND + Duration::from_secs(3),
            "a new term after the key was deleted",
            g.rec
                .wait_new_leader((l, tok), FAILOVER_BOUND + Duration::from_secs(2)),
        )
        .await;
        g.rec.heal(f, false);
        sleep(Duration::from_millis(500)).await;
        let stepped = last_claim(&g.rec, l, tok).map(|c| c.saturating_duration_since(t));
        eprintln!(
            "{} delete #{round}: the holder's last claim came {stepped:?} after the delete",
            kind.name()
        );
        assert!(
            stepped.is_some_and(|d| d <= limit),
            "the holder kept claiming {stepped:?} after its key was deleted (limit {limit:?})"
        );
    }
    let name = format!("{}: election key deleted by hand (4 times)", kind.name());
    match kind {
        Kind::Etcd => g.finish(&name).await,
        // Redis has no lease apart from the key (README, known limits): the
        // holder claims until its next renewal while a follower may already
        // have taken the free key. Such overlaps are reported, bounded by the
        // renew interval, and otherwise tolerated here.
        Kind::Redis => {
            let r = g.finish_with(&name, &["OVERLAP"]).await;
            for o in &r.overlaps {
                assert!(
                    o.at_least <= RENEW + Duration::from_millis(100),
                    "an overlap after DEL outlasted the renew interval: {o:?}"
                );
            }
            r
        }
    }
}

pub(super) async fn key_overwritten(kind: Kind) {
    let servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-put", kind.name()), ABC).await;
    let key = key_of(kind, &g.election);
    let (l, tok) = g.leader("first election").await;
    sleep(Duration::from_millis(700)).await;
    let before = acquire_attempts(&g).await;
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new(
            "key overwritten by hand (no lease / no TTL)",
            Some(l),
            Expect::Other,
            FAILOVER_BOUND,
        )
    });
    let t = Instant::now();
    tamper(&servers, &key, Some("intruder")).await;
    sleep(TTL * 2).await;
    // Nobody may claim while a foreign value holds the key.
    let settle = t + RENEW + Duration::from_millis(150);
    let during = claims_between(&g.rec, settle, Instant::now());
    let attempts = acquire_attempts(&g).await - before;
    let held = t.elapsed();
    tamper(&servers, &key, None).await;
    g.rec.heal(f, true);
    within(
        FAILOVER_BOUND + Duration::from_secs(3),
        "a leader after the foreign key was removed",
        g.rec.wait_leader(FAILOVER_BOUND + Duration::from_secs(2)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    let stepped = last_claim(&g.rec, l, tok).map(|c| c.saturating_duration_since(t));
    eprintln!(
        "{}: holder's last claim {stepped:?} after the overwrite; {attempts} campaign attempts by the followers in {held:?} while the foreign value stood",
        kind.name()
    );
    assert!(
        during.is_empty(),
        "sidecars claimed while a foreign value held the key: {:?}",
        during
            .iter()
            .map(|(l, s)| (l, s.answer.clone()))
            .collect::<Vec<_>>()
    );
    let limit = match kind {
        Kind::Etcd => Duration::from_millis(300),
        Kind::Redis => RENEW + Duration::from_millis(150),
    };
    assert!(
        stepped.is_some_and(|d| d <= limit),
        "the holder kept claiming {stepped:?} after its key was overwritten (limit {limit:?})"
    );
    g.finish(&format!(
        "{}: election key overwritten by hand",
        kind.name()
    ))
    .await;
}

impl Servers {
    /// Freeze (SIGSTOP) or thaw (SIGCONT) every server: sockets stay open,
    /// nothing answers.
    pub(super) fn freeze(&self, frozen: bool) {
        let sig = if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        self.signal(sig);
    }
}

/// The backend freezes (SIGSTOP: TCP stays open, nothing
/// answers). The leader steps down by its `valid_until`; every follower must
/// report `error`, `backend_healthy: false` and stop naming the leader within
/// the silence bound. On the original code followers kept vouching for the
/// old leader until HTTP/2 keep-alive gave up (~13 s).
pub(super) async fn backend_frozen(kind: Kind) {
    let servers = Servers::single(kind).await;
    let g = Group::start(&servers, &format!("{}-frozen", kind.name()), ABC).await;
    let (l, tok) = g.leader("first election").await;
    sleep(Duration::from_secs(1)).await;
    let bound = match kind {
        Kind::Etcd => RESTART_BOUND,
        Kind::Redis => FAILOVER_BOUND,
    };
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        silent_after: Some(SILENT_BOUND),
        ..Fault::new(
            "backend frozen (SIGSTOP) 3 x TTL",
            Some(l),
            Expect::CutOff,
            bound,
        )
    });
    servers.freeze(true);
    sleep(TTL * 3).await;
    g.rec.end_silence(f);
    servers.freeze(false);
    g.rec.heal(f, true);
    within(
        bound + Duration::from_secs(5),
        "a leader after the backend thawed",
        g.rec.wait_leader(bound + Duration::from_secs(4)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    g.finish(&format!(
        "{}: backend frozen (SIGSTOP) 3 x TTL",
        kind.name()
    ))
    .await;
}
