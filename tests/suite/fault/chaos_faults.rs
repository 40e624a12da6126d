//! The faults of the randomized schedule, one method each, and the summary
//! per kind of fault.

use super::chaos::*;
use super::*;

impl ChaosRun {
    /// Start the servers (`FAULT_SERVERS`, 1 or 3) and 3 to 5 sidecars.
    pub(super) async fn start(kind: Kind, seed: u64) -> ChaosRun {
        let mut rng = StdRng::seed_from_u64(seed);
        let n_servers: usize = env_or("FAULT_SERVERS", 3);
        assert!(
            n_servers == 1 || n_servers == 3,
            "FAULT_SERVERS must be 1 or 3"
        );
        let n_sidecars = rng.random_range(3..=5usize);
        let servers = chaos_servers(kind, n_servers).await;
        eprintln!(
            "== randomized: {n_sidecars} sidecars, {} {} server(s)",
            servers.count(),
            kind.name()
        );
        let ids: Vec<String> = (0..n_sidecars).map(|i| format!("s{i}")).collect();
        let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let g = Group::start(&servers, &format!("chaos-{}", kind.name()), &id_refs).await;
        let key = key_of(kind, &g.election);
        let restart_bound = match kind {
            Kind::Etcd => RESTART_BOUND,
            Kind::Redis => REDIS_RESTART_BOUND,
        };
        ChaosRun {
            rng,
            g,
            servers,
            key,
            restart_bound,
        }
    }

    /// The kinds of fault to draw from (some twice, to draw them more often),
    /// narrowed by `FAULT_ONLY`.
    pub(super) fn menu(&self, kind: Kind) -> Vec<Chaos> {
        let mut menu = vec![
            Chaos::KillLeader,
            Chaos::TermLeader,
            Chaos::PauseLeader,
            Chaos::CutLeader,
            Chaos::CutLeader,
            Chaos::CutFollower,
            Chaos::SlowAll,
            Chaos::SlowLeader,
            Chaos::BackendDown,
            Chaos::KeyOverwritten,
        ];
        menu.push(Chaos::BackendFrozen);
        if kind == Kind::Etcd {
            menu.extend([Chaos::KeyDeleted, Chaos::Compaction]);
        } else {
            menu.extend([Chaos::AmnesiaWhileCutOff, Chaos::ReplicaPromoted]);
        }
        if self.servers.count() == 3 {
            menu.extend([Chaos::ServerDown, Chaos::ServerDown, Chaos::QuorumLost]);
        }
        // FAULT_ONLY=BackendFrozen,Compaction: draw only these kinds (to soak one).
        if let Ok(only) = std::env::var("FAULT_ONLY") {
            let only: Vec<&str> = only.split(',').map(str::trim).collect();
            menu.retain(|c| only.contains(&format!("{c:?}").as_str()));
            assert!(
                !menu.is_empty(),
                "FAULT_ONLY={only:?} leaves no fault for {}",
                kind.name()
            );
        }
        menu
    }

    /// Inject one fault of kind `chaos`, declare it to the recorder, and heal
    /// it.
    pub(super) async fn inject(&mut self, chaos: Chaos, t: &Turn) {
        match chaos {
            Chaos::KillLeader => self.stop_leader(t, Signal::SIGKILL).await,
            Chaos::TermLeader => self.stop_leader(t, Signal::SIGTERM).await,
            Chaos::PauseLeader => self.pause_leader(t).await,
            Chaos::CutLeader => self.cut(t, true).await,
            Chaos::CutFollower => self.cut(t, false).await,
            Chaos::SlowAll => self.slow(t, true).await,
            Chaos::SlowLeader => self.slow(t, false).await,
            Chaos::BackendDown => self.backend_down(t).await,
            Chaos::ServerDown => self.server_down(t).await,
            Chaos::QuorumLost => self.quorum_lost(t).await,
            Chaos::BackendFrozen => self.backend_frozen(t).await,
            Chaos::Compaction => self.compaction(t).await,
            Chaos::AmnesiaWhileCutOff => self.amnesia_while_cut_off(t).await,
            Chaos::ReplicaPromoted => self.replica_promoted(t).await,
            Chaos::KeyDeleted => self.key_deleted(t).await,
            Chaos::KeyOverwritten => self.key_overwritten(t).await,
        }
    }

    /// SIGKILL or SIGTERM the leader, then start it again under the same name.
    pub(super) async fn stop_leader(&mut self, t: &Turn, sig: Signal) {
        let (g, l) = (&mut self.g, t.l);
        g.rec.fault(Fault {
            ends_term: Some((l, t.tok)),
            ..Fault::new(
                &t.label(format!("{sig} {}", g.id(l))),
                Some(l),
                Expect::Killed,
                FAILOVER_BOUND,
            )
        });
        let id = g.id(l);
        if sig == Signal::SIGKILL {
            g.kill(l).await;
        } else {
            g.signal(l, Signal::SIGTERM);
            let mut s = g.sidecars[l].take().unwrap();
            let status = within(
                Duration::from_secs(5),
                "a SIGTERMed sidecar to exit",
                s.wait_exit(Duration::from_secs(4)),
            )
            .await;
            assert_eq!(status.and_then(|s| s.code()), Some(0), "SIGTERM exits 0");
            g.rec.stop_polling(l);
        }
        sleep(ms_between(&mut self.rng, 0, 2500)).await;
        // The Pod comes back under the same name.
        g.spawn(&id).await;
    }

    /// SIGSTOP the leader, for longer than the TTL or not.
    pub(super) async fn pause_leader(&mut self, t: &Turn) {
        let (g, rng, l) = (&mut self.g, &mut self.rng, t.l);
        let long = rng.random_bool(0.6);
        let d = if long {
            TTL + ms_between(rng, 300, 2000)
        } else {
            ms_between(rng, 50, 900)
        };
        let expect = if long { Expect::Paused } else { Expect::Other };
        let f = g.rec.fault(Fault {
            ends_term: long.then_some((l, t.tok)),
            ..Fault::new(
                &t.label(format!("SIGSTOP {} {} ms", g.id(l), d.as_millis())),
                Some(l),
                expect,
                FAILOVER_BOUND,
            )
        });
        g.signal(l, Signal::SIGSTOP);
        sleep(d).await;
        g.signal(l, Signal::SIGCONT);
        g.rec.heal(f, false);
    }

    /// Blackhole or reset the connections of the leader (`leader`) or of a
    /// random follower.
    pub(super) async fn cut(&mut self, t: &Turn, leader: bool) {
        let (g, rng, l) = (&mut self.g, &mut self.rng, t.l);
        let target = if leader || t.followers.is_empty() {
            l
        } else {
            t.followers[rng.random_range(0..t.followers.len())]
        };
        let mode = if rng.random_bool(0.5) {
            Mode::Blackhole
        } else {
            Mode::Reset
        };
        let d = if rng.random_bool(0.3) {
            ms_between(rng, 50, 300)
        } else {
            ms_between(rng, 300, 5000)
        };
        let expect = if target == l {
            Expect::CutOff
        } else {
            Expect::Other
        };
        let f = g.rec.fault(Fault::new(
            &t.label(format!("{mode:?} {} {} ms", g.id(target), d.as_millis())),
            Some(target),
            expect,
            FAILOVER_BOUND,
        ));
        g.cut(target, mode);
        sleep(d).await;
        g.cut(target, Mode::Pass);
        // A cut shorter than the validity may keep the term: recovery
        // then counts from the heal.
        g.rec.heal(f, d < TTL);
    }

    /// Delay the answers to every sidecar (`all`) or to the leader only.
    pub(super) async fn slow(&mut self, t: &Turn, all: bool) {
        let (g, rng, l) = (&mut self.g, &mut self.rng, t.l);
        let delay = ms_between(rng, 50, 900);
        let d = ms_between(rng, 500, 5000);
        // Past the 333 ms call deadline no renewal can succeed.
        let expect = if delay > Duration::from_millis(400) {
            Expect::CutOff
        } else {
            Expect::Other
        };
        let f = g.rec.fault(Fault::new(
            &t.label(format!(
                "answers +{} ms for {} ms ({})",
                delay.as_millis(),
                d.as_millis(),
                if all { "all" } else { "leader" }
            )),
            Some(l),
            expect,
            FAILOVER_BOUND,
        ));
        if all {
            g.cut_all(Mode::Delay(delay));
        } else {
            g.cut(l, Mode::Delay(delay));
        }
        sleep(d).await;
        g.cut_all(Mode::Pass);
        g.rec.heal(f, true);
    }

    /// Kill every server, then start them again.
    pub(super) async fn backend_down(&mut self, t: &Turn) {
        let (g, servers, l) = (&mut self.g, &mut self.servers, t.l);
        let d = ms_between(&mut self.rng, 200, 6000);
        let f = g.rec.fault(Fault {
            ends_term: (d > TTL).then_some((l, t.tok)),
            ..Fault::new(
                &t.label(format!("all servers down {} ms", d.as_millis())),
                Some(l),
                Expect::CutOff,
                self.restart_bound,
            )
        });
        for i in 0..servers.count() {
            servers.kill(i);
        }
        sleep(d).await;
        for i in 0..servers.count() {
            servers.revive(i).await;
        }
        servers.wait_healthy().await;
        g.rec.heal(f, true);
    }

    /// Kill one server (the etcd Raft leader half of the time), then start
    /// it again.
    pub(super) async fn server_down(&mut self, t: &Turn) {
        let (g, servers) = (&mut self.g, &mut self.servers);
        let i = servers.pick(&mut self.rng).await;
        let d = ms_between(&mut self.rng, 500, 6000);
        let f = g.rec.fault(Fault::new(
            &t.label(format!("server {i} down {} ms", d.as_millis())),
            None,
            Expect::Other,
            self.restart_bound,
        ));
        servers.kill(i);
        sleep(d).await;
        servers.revive(i).await;
        servers.wait_healthy().await;
        g.rec.heal(f, false);
    }

    /// Kill two of the three servers (no quorum), then start them again.
    pub(super) async fn quorum_lost(&mut self, t: &Turn) {
        let (g, servers, rng, l) = (&mut self.g, &mut self.servers, &mut self.rng, t.l);
        let i = rng.random_range(0..3);
        let d = ms_between(rng, 500, 6000);
        let f = g.rec.fault(Fault {
            silent_after: Some(SILENT_BOUND),
            ..Fault::new(
                &t.label(format!(
                    "servers {i},{} down {} ms",
                    (i + 1) % 3,
                    d.as_millis()
                )),
                Some(l),
                Expect::CutOff,
                self.restart_bound,
            )
        });
        servers.kill(i);
        servers.kill((i + 1) % 3);
        sleep(d).await;
        g.rec.end_silence(f);
        servers.revive(i).await;
        servers.revive((i + 1) % 3).await;
        servers.wait_healthy().await;
        g.rec.heal(f, true);
    }

    /// SIGSTOP every server, then SIGCONT them.
    pub(super) async fn backend_frozen(&mut self, t: &Turn) {
        let (g, l) = (&mut self.g, t.l);
        let d = ms_between(&mut self.rng, 300, 6000);
        let f = g.rec.fault(Fault {
            ends_term: (d > TTL).then_some((l, t.tok)),
            silent_after: Some(SILENT_BOUND),
            ..Fault::new(
                &t.label(format!("all servers frozen {} ms", d.as_millis())),
                Some(l),
                Expect::CutOff,
                self.restart_bound,
            )
        });
        self.servers.freeze(true);
        sleep(d).await;
        g.rec.end_silence(f);
        self.servers.freeze(false);
        g.rec.heal(f, true);
    }

    /// etcd: compact the history, reset the leader's connections briefly,
    /// then delete the key of whoever leads after the renewals.
    pub(super) async fn compaction(&mut self, t: &Turn) {
        let (g, servers, l) = (&mut self.g, &self.servers, t.l);
        let f = g.rec.fault(Fault::new(
            &t.label("compaction, then a 150 ms reset of the leader".into()),
            Some(l),
            Expect::Other,
            FAILOVER_BOUND,
        ));
        compact(servers).await;
        g.cut(l, Mode::Reset);
        sleep(BLIP).await;
        g.cut(l, Mode::Pass);
        g.rec.heal(f, false);
        // Renewals reopen the leader's watch; then the key goes.
        sleep(RENEW * 4).await;
        if let Some((l, tok)) = g.rec.leader_now(Instant::now() - RENEW) {
            g.rec.fault(Fault {
                ends_term: Some((l, tok)),
                ..Fault::new(
                    &t.label(format!("key of {} deleted after the compaction", g.id(l))),
                    Some(l),
                    Expect::Other,
                    FAILOVER_BOUND,
                )
            });
            tamper(servers, &self.key, None).await;
        }
    }

    /// Redis: blackhole the leader while every server restarts empty.
    pub(super) async fn amnesia_while_cut_off(&mut self, t: &Turn) {
        let (g, servers, l) = (&mut self.g, &mut self.servers, t.l);
        until_wall_fraction(0.85).await;
        let f = g.rec.fault(Fault {
            ends_term: Some((l, t.tok)),
            ..Fault::new(
                &t.label(format!("{} cut off, every server restarted empty", g.id(l))),
                Some(l),
                Expect::CutOff,
                REDIS_RESTART_BOUND,
            )
        });
        g.cut(l, Mode::Blackhole);
        for i in 0..servers.count() {
            servers.flush(i).await;
            servers.kill(i);
            servers.revive(i).await;
        }
        sleep(TTL + ms_between(&mut self.rng, 0, 2000)).await;
        g.cut(l, Mode::Pass);
        g.rec.heal(f, false);
    }

    /// Redis: put a lagging replica without the key in one server's place.
    pub(super) async fn replica_promoted(&mut self, t: &Turn) {
        let i = self.rng.random_range(0..self.servers.count());
        let lag = ms_between(&mut self.rng, 0, 2000);
        let f = self.g.rec.fault(Fault {
            ends_term: (self.servers.count() == 1).then_some((t.l, t.tok)),
            ..Fault::new(
                &t.label(format!(
                    "a replica of server {i}, {} ms behind and without the key, promoted",
                    lag.as_millis()
                )),
                Some(t.l),
                Expect::Other,
                REDIS_RESTART_BOUND,
            )
        });
        promote_replica(&mut self.servers, &mut self.g, i, &self.key, lag).await;
        self.g.rec.heal(f, true);
    }

    /// Delete the election key by hand.
    pub(super) async fn key_deleted(&mut self, t: &Turn) {
        self.g.rec.fault(Fault {
            ends_term: Some((t.l, t.tok)),
            ..Fault::new(
                &t.label("key deleted".into()),
                Some(t.l),
                Expect::Other,
                FAILOVER_BOUND,
            )
        });
        tamper(&self.servers, &self.key, None).await;
    }

    /// Overwrite the election key with another holder for a while, then
    /// delete it.
    pub(super) async fn key_overwritten(&mut self, t: &Turn) {
        let d = ms_between(&mut self.rng, 300, 4000);
        let f = self.g.rec.fault(Fault {
            ends_term: Some((t.l, t.tok)),
            ..Fault::new(
                &t.label(format!("key overwritten for {} ms", d.as_millis())),
                Some(t.l),
                Expect::Other,
                FAILOVER_BOUND,
            )
        });
        tamper(&self.servers, &self.key, Some("intruder")).await;
        sleep(d).await;
        tamper(&self.servers, &self.key, None).await;
        self.g.rec.heal(f, true);
    }

    /// Every fault healed: wait for one leader, check the recording of the
    /// `n` faults and print the per-kind summary.
    pub(super) async fn finish(self, kind: Kind, seed: u64, n: usize) {
        let _ = within(
            Duration::from_secs(25),
            "a leader at the end",
            self.g.rec.wait_leader(Duration::from_secs(20)),
        )
        .await;
        sleep(Duration::from_secs(1)).await;
        // FAULT_TOLERATE=FENCING,LIVENESS: report those problems but do not fail
        // on them (e.g. a known product finding, to soak for the others).
        let tolerate = std::env::var("FAULT_TOLERATE").unwrap_or_default();
        let tolerated: Vec<&str> = tolerate.split(',').filter(|t| !t.is_empty()).collect();
        let r = self
            .g
            .finish_with(
                &format!("randomized {} seed {seed} ({} faults)", kind.name(), n),
                &tolerated,
            )
            .await;
        per_kind_summary(&r);
    }
}

/// Faults grouped by kind: count, slowest recovery against its bound, worst stale claim.
pub(super) fn per_kind_summary(r: &Report) {
    let mut kinds: std::collections::BTreeMap<String, (usize, Duration, Duration, Option<i64>)> =
        std::collections::BTreeMap::new();
    for f in &r.per_fault {
        let kind = f
            .name
            .split(':')
            .next()
            .unwrap_or("")
            .trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
        let e = kinds
            .entry(kind.to_owned())
            .or_insert((0, Duration::ZERO, f.bound, None));
        e.0 += 1;
        e.1 = e.1.max(f.recovery.unwrap_or_default());
        e.2 = e.2.max(f.bound);
        if let Some(s) = f.stale {
            let v = if f.stale_positive {
                s.as_millis() as i64
            } else {
                -(s.as_millis() as i64)
            };
            e.3 = Some(e.3.map_or(v, |w| w.max(v)));
        }
    }
    eprintln!("== per fault kind: count, slowest recovery (bound), worst stale claim");
    for (k, (n, slow, bound, stale)) in kinds {
        eprintln!(
            "   {k:<15} {n:>3}  {:>5} ms ({} ms)  {}",
            slow.as_millis(),
            bound.as_millis(),
            stale.map_or("n/a".into(), |v| format!("{v} ms"))
        );
    }
}
