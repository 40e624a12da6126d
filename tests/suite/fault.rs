//! Fault injection: proves from recordings of every sidecar's `/leader` that no
//! two sidecars ever lead at once, while leaders are killed, paused, cut off,
//! slowed down, and backends stop, lose members, lose their data, or have the
//! election key changed by hand.
//!
//! Each sidecar reaches each backend server through its own fault proxy
//! (`support::proxy`), so a fault can hit only the leader's connections. A
//! recorder (`support::recorder`) asks every sidecar's `/leader` every few ms
//! and its checker proves, for each scenario: no definite overlap of leader
//! intervals, no claim after the claimant's own `valid_until`, fencing tokens
//! that grow from term to term, recovery within the README's failover bounds,
//! and no sidecar exiting because of a backend fault. Each scenario prints its
//! summary (run with `--nocapture`) and the running total; the totals are also
//! written to `$CARGO_TARGET_TMPDIR/fault-summary.tsv`.
//!
//! `randomized` runs a seeded schedule of these faults: 30 s by default, or
//! `FAULT_MINUTES` with `FAULT_LONG=1` (see `scripts/fault-soak`); it prints the
//! seed first (`FAULT_SEED` replays it) and takes `FAULT_BACKEND=etcd|redis`
//! (and `FAULT_ONLY=Kind,Kind` to draw only some kinds of fault).

use crate::support;

use std::future::Future;
use std::io::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use crate::support::proxy::{Mode, Proxy};
use crate::support::recorder::{Answer, Expect, Fault, Recorder, Report, Sample, check};
use crate::support::*;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(500);
const RETRY: Duration = Duration::from_millis(500);
/// README's failover bound for a crashed or cut-off leader: TTL + renew
/// interval + retry period.
const FAILOVER_BOUND: Duration = Duration::from_millis(3000);
/// README: after an etcd restart (or a Raft leader change) leases get their
/// full TTL again, so a dead holder can keep the key up to 2 × TTL.
const RESTART_BOUND: Duration = Duration::from_secs(4);
/// After a Redis restart (or a new server process behind the address) nobody
/// is elected for one TTL plus the uptime clock's second, counted from the
/// restart (server uptime) or from a candidate's first answer from the new
/// process (its own clock). That first answer comes within a retry period
/// when the candidate's connections break with the old process, and at the
/// latest at its next campaign (≤ TTL); so TTL (first contact) + TTL + 1 s +
/// a retry period + scheduling slack.
const REDIS_RESTART_BOUND: Duration = Duration::from_millis(2000 + 2000 + 1000 + 500 + 500);
/// A follower stops vouching for the leader this long into a backend's
/// silence (`ElectorConfig::silence_bound`: TTL + ⅔ of the renew interval),
/// plus 20 ms for the signal that starts the silence to be delivered.
const SILENT_BOUND: Duration = Duration::from_millis(2000 + 333 + 20);
/// A cut shorter than the safety margin: must not cause a failover.
const BLIP: Duration = Duration::from_millis(150);
/// Answers delayed by more than the renew interval.
const SLOW: Duration = Duration::from_millis(700);
/// Redis with a durable fencing counter (appendfsync always), so a restart
/// keeps keys and counters.
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// A redis-server started by this process: `free_port` can hand the same port
/// to a test running at the same time, whose server would then answer the
/// readiness probe; start again on another port when that happened.
async fn own_redis(extra: &[&str]) -> RedisServer {
    for _ in 0..3 {
        let s = within(
            Duration::from_secs(20),
            "redis-server start-up",
            RedisServer::start_with(extra),
        )
        .await;
        if redis_is_ours(&s).await {
            return s;
        }
        eprintln!(
            "port {} is served by another process's redis-server; trying another port",
            s.port
        );
    }
    panic!("could not start a redis-server of our own in 3 attempts (ports taken)");
}

/// Restart `s` and check that the server answering is ours again.
async fn restart_redis(s: &mut RedisServer) {
    within(Duration::from_secs(20), "redis-server restart", s.restart()).await;
    assert!(
        redis_is_ours(s).await,
        "redis-server port {} was taken by another process while the server was down",
        s.port
    );
}

/// Await `fut` for at most `limit`; the panic message says what probably hung.
async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Etcd,
    Redis,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Etcd => "etcd",
            Kind::Redis => "redis",
        }
    }
}

/// The backend servers the proxies forward to.
enum Servers {
    /// One or more etcd members (a single etcd is a 1-member cluster).
    Cluster(EtcdCluster),
    Redis(Vec<RedisServer>),
}

impl Servers {
    async fn single(kind: Kind) -> Servers {
        match kind {
            Kind::Etcd => Servers::Cluster(
                within(
                    Duration::from_secs(70),
                    "etcd start-up",
                    EtcdCluster::start(1),
                )
                .await,
            ),
            Kind::Redis => Servers::Redis(vec![own_redis(DURABLE).await]),
        }
    }

    fn urls(&self) -> Vec<String> {
        match self {
            Servers::Cluster(c) => c.urls(),
            Servers::Redis(v) => v.iter().map(|r| r.url.clone()).collect(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Servers::Redis(_) => Kind::Redis,
            _ => Kind::Etcd,
        }
    }
}

/// Sidecars (one per slot; a restarted sidecar takes a new slot), their
/// proxies, and the recorder polling them.
struct Group {
    kind: Kind,
    election: String,
    upstream: Vec<String>,
    sidecars: Vec<Option<Sidecar>>,
    proxies: Vec<Vec<Proxy>>,
    rec: Recorder,
    started: Instant,
}

impl Group {
    async fn start(servers: &Servers, test: &str, ids: &[&str]) -> Group {
        let mut g = Group {
            kind: servers.kind(),
            election: election(test),
            upstream: servers.urls(),
            sidecars: Vec::new(),
            proxies: Vec::new(),
            rec: Recorder::new(TTL),
            started: Instant::now(),
        };
        for id in ids {
            g.spawn(id).await;
        }
        g
    }

    /// Start a sidecar `id` behind fresh proxies; returns its slot.
    async fn spawn(&mut self, id: &str) -> usize {
        let mut proxies = Vec::new();
        for u in &self.upstream {
            proxies.push(
                within(
                    Duration::from_secs(5),
                    "starting a fault proxy",
                    Proxy::to_url(u),
                )
                .await,
            );
        }
        let urls: Vec<String> = proxies
            .iter()
            .zip(&self.upstream)
            .map(|(p, u)| p.url_for(u))
            .collect();
        let sidecar = match self.kind {
            Kind::Etcd => Sidecar::start(&urls.join(","), &self.election, id, FAST),
            Kind::Redis => {
                let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
                redis_sidecar(&refs, &self.election, id, FAST)
            }
        };
        let slot = self.rec.add(id, sidecar.port);
        assert_eq!(slot, self.sidecars.len());
        self.sidecars.push(Some(sidecar));
        self.proxies.push(proxies);
        slot
    }

    fn id(&self, slot: usize) -> String {
        self.sidecars[slot]
            .as_ref()
            .map_or_else(|| format!("#{slot}"), |s| s.identity.clone())
    }

    /// Set the mode of every proxy of `slot`.
    fn cut(&self, slot: usize, mode: Mode) {
        for p in &self.proxies[slot] {
            p.set(mode);
        }
    }

    /// Set the mode of every proxy.
    fn cut_all(&self, mode: Mode) {
        for slot in 0..self.proxies.len() {
            self.cut(slot, mode);
        }
    }

    /// Slots whose process is running.
    fn live(&self) -> Vec<usize> {
        (0..self.sidecars.len())
            .filter(|i| self.sidecars[*i].is_some())
            .collect()
    }

    /// Wait for one leader (every live sidecar answering, exactly one claiming).
    async fn leader(&self, what: &str) -> (usize, u64) {
        within(
            Duration::from_secs(20),
            what,
            self.rec.wait_leader(Duration::from_secs(15)),
        )
        .await
        .unwrap_or_else(|| panic!("no single leader within 15 s: {what}"))
    }

    fn signal(&self, slot: usize, sig: Signal) {
        self.sidecars[slot]
            .as_ref()
            .expect("a live sidecar")
            .signal(sig);
    }

    /// SIGKILL the sidecar in `slot` and stop polling it.
    async fn kill(&mut self, slot: usize) {
        let mut s = self.sidecars[slot].take().expect("a live sidecar");
        s.signal(Signal::SIGKILL);
        within(
            Duration::from_secs(5),
            "a SIGKILLed sidecar to exit",
            s.wait_exit(Duration::from_secs(4)),
        )
        .await
        .expect("the sidecar exits after SIGKILL");
        self.rec.stop_polling(slot);
    }

    /// Check the recording, print the summary, add it to the totals, and
    /// fail on any problem not matched by `tolerated`.
    async fn finish_with(mut self, scenario: &str, tolerated: &[&str]) -> Report {
        let mut report = self.rec.check(scenario);
        // e. No sidecar exited because of a backend fault.
        for (slot, s) in self.sidecars.iter_mut().enumerate() {
            if let Some(s) = s
                && let Some(status) = s.exited()
            {
                report.problems.push(format!(
                    "EXIT: {}#{slot} exited with {status} during the faults",
                    s.identity
                ));
            }
        }
        report.scenario = format!("{scenario} ({:.0} s)", self.started.elapsed().as_secs_f64());
        eprintln!("{}", report.summary());
        add_to_totals(&report);
        let unexpected: Vec<&String> = report
            .problems
            .iter()
            .filter(|p| !tolerated.iter().any(|t| p.contains(t)))
            .collect();
        if !unexpected.is_empty() {
            for slot in self.live() {
                eprintln!(
                    "--- log of {} ---\n{}",
                    self.id(slot),
                    tail(&self.sidecars[slot].as_ref().unwrap().log(), 80)
                );
            }
            for s in &mut self.sidecars {
                // Logs were printed above; keep Drop from printing them again.
                drop(s.take());
            }
            panic!(
                "{scenario}: {} problem(s):\n{}",
                unexpected.len(),
                report.summary()
            );
        }
        report
    }

    async fn finish(self, scenario: &str) -> Report {
        self.finish_with(scenario, &[]).await
    }
}

fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Running totals over the scenarios of this process.
static TOTALS: Mutex<Vec<Report>> = Mutex::new(Vec::new());

fn add_to_totals(r: &Report) {
    let mut all = TOTALS.lock().unwrap();
    all.push(r.clone());
    let faults: usize = all.iter().map(|r| r.faults).sum();
    let transitions: usize = all.iter().map(|r| r.transitions).sum();
    let overlaps: usize = all.iter().map(|r| r.overlaps.len()).sum();
    let gap = all.iter().max_by_key(|r| r.longest_gap).unwrap();
    let stale = all.iter().filter_map(|r| r.worst_stale_ms).max();
    let slow = all
        .iter()
        .filter_map(|r| {
            r.slowest_recovery
                .as_ref()
                .map(|s| (s.0, &r.scenario, &s.2))
        })
        .max_by_key(|s| s.0);
    eprintln!(
        "== running total after {} scenario(s): faults {faults}, transitions {transitions}, overlaps {overlaps}, longest leaderless gap {} ms ({}), worst stale claim {}, slowest recovery {}",
        all.len(),
        gap.longest_gap.as_millis(),
        gap.scenario,
        stale.map_or("n/a".into(), |v| format!("{v} ms")),
        slow.map_or("n/a".into(), |(d, sc, f)| format!(
            "{} ms ({sc}: {f})",
            d.as_millis()
        )),
    );
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fault-summary.tsv");
    static FIRST: std::sync::Once = std::sync::Once::new();
    FIRST.call_once(|| {
        let _ = std::fs::write(
            &path,
            "scenario\ttransitions\tfaults\toverlaps\tlongest_gap_ms\tworst_stale_ms\tslowest_recovery_ms\tproblems\n",
        );
    });
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&path) {
        let _ = writeln!(f, "{}", r.line());
    }
}

/// The receive instant of the last claim of the term (`slot`, `token`).
fn last_claim(rec: &Recorder, slot: usize, token: u64) -> Option<Instant> {
    rec.snapshot()[slot]
        .1
        .iter()
        .filter(|s| s.is_true() && s.answer.as_ref().unwrap().fencing_token == Some(token))
        .map(|s| s.recv)
        .next_back()
}

/// Claims by anybody whose request was sent in `[from, to]`.
fn claims_between(rec: &Recorder, from: Instant, to: Instant) -> Vec<(String, Sample)> {
    rec.snapshot()
        .into_iter()
        .flat_map(|(label, s)| s.into_iter().map(move |s| (label.clone(), s)))
        .filter(|(_, s)| s.is_true() && s.send >= from && s.send <= to)
        .collect()
}

const ABC: &[&str] = &["a", "b", "c"];

// ---------------------------------------------------------------- scenarios

async fn kill_leader(kind: Kind) {
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

async fn pause_leader(kind: Kind) {
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

async fn cut_leader(kind: Kind, mode: Mode, label: &str) {
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

async fn delay_all(kind: Kind) {
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

async fn blip(kind: Kind, mode: Mode, label: &str) {
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

async fn backend_down(kind: Kind) {
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

fn key_of(kind: Kind, election: &str) -> String {
    match kind {
        Kind::Etcd => format!("/leader-elector/{election}"),
        Kind::Redis => format!("leader-elector:{{{election}}}"),
    }
}

/// Delete the election key (`value` None) or overwrite it with `value`
/// (etcd: a put with no lease; Redis: a SET with no expiry).
async fn tamper(servers: &Servers, key: &str, value: Option<&str>) {
    match servers {
        Servers::Redis(v) => {
            // On every server of a Redlock group (a server that is down is
            // skipped): changing one server alone does not end a term.
            for server in v {
                let conn = timeout(Duration::from_secs(2), server.conn()).await;
                let Ok(mut c) = conn else { continue };
                let cmd = match value {
                    None => redis::cmd("DEL").arg(key).clone(),
                    Some(val) => redis::cmd("SET").arg(key).arg(val).clone(),
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
        Servers::Cluster(c) => {
            let opts = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2));
            let mut cl = within(
                Duration::from_secs(5),
                "connecting to the etcd cluster",
                etcd_client::Client::connect(c.urls(), Some(opts)),
            )
            .await
            .expect("connect to the etcd cluster");
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
    }
}

async fn acquire_attempts(g: &Group) -> u64 {
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
const DELETE_WAITS_MS: &[u64] = &[700, 1900, 2650, 3400];

async fn key_deleted(kind: Kind) -> Report {
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

async fn key_overwritten(kind: Kind) {
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

// ------------------------------------- scenarios on a single etcd or Redis

/// One `#[tokio::test]` on etcd and one on Redis for each scenario listed:
/// `etcd_x, redis_x => scenario(args);` runs `scenario(Kind::Etcd, args)` and
/// `scenario(Kind::Redis, args)` (the tests of a pair differ only by backend).
macro_rules! on_both_backends {
    ($($etcd:ident, $redis:ident => $scenario:ident($($arg:expr),*);)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $etcd() {
                $scenario(Kind::Etcd $(, $arg)*).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $redis() {
                $scenario(Kind::Redis $(, $arg)*).await;
            }
        )*
    };
}

on_both_backends! {
    etcd_sigkill_leader, redis_sigkill_leader => kill_leader();
    etcd_sigstop_leader, redis_sigstop_leader => pause_leader();
    etcd_blackhole_leader, redis_blackhole_leader =>
        cut_leader(Mode::Blackhole, "blackhole");
    etcd_reset_leader, redis_reset_leader => cut_leader(Mode::Reset, "reset");
    etcd_slow_answers, redis_slow_answers => delay_all();
    etcd_blackhole_blip_keeps_the_leader, redis_blackhole_blip_keeps_the_leader =>
        blip(Mode::Blackhole, "blackhole");
    etcd_reset_blip_keeps_the_leader, redis_reset_blip_keeps_the_leader =>
        blip(Mode::Reset, "reset");
    etcd_down_and_back, redis_down_and_back => backend_down();
    etcd_key_deleted, redis_key_deleted => key_deleted();
    etcd_key_overwritten, redis_key_overwritten => key_overwritten();
}

// ------------------------------------------------------------ etcd scenarios

async fn cluster_group(test: &str) -> (Servers, Group) {
    let servers = Servers::Cluster(
        within(
            Duration::from_secs(40),
            "a 3-member etcd cluster to start",
            EtcdCluster::start(3),
        )
        .await,
    );
    let g = Group::start(&servers, test, ABC).await;
    (servers, g)
}

fn cluster(s: &mut Servers) -> &mut EtcdCluster {
    match s {
        Servers::Cluster(c) => c,
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_raft_leader_killed() {
    let (mut servers, g) = cluster_group("cluster-raft").await;
    let (_l, _tok) = g.leader("first election on the cluster").await;
    let c = cluster(&mut servers);
    let raft = within(Duration::from_secs(10), "member status", c.raft_leader())
        .await
        .expect("the cluster has a Raft leader");
    // The sidecar leader may keep its term (renewals go to the new Raft
    // leader) or lose it during the election; either way one leader within
    // 2 x TTL (a Raft leader change gives every lease its full TTL again).
    let f = g.rec.fault(Fault::new(
        &format!("Raft leader member m{raft} SIGKILLed"),
        None,
        Expect::Other,
        RESTART_BOUND,
    ));
    c.kill(raft);
    within(
        RESTART_BOUND + Duration::from_secs(4),
        "a leader after the Raft leader member died",
        g.rec.wait_leader(RESTART_BOUND + Duration::from_secs(3)),
    )
    .await;
    sleep(TTL).await;
    c.restart(raft);
    within(
        Duration::from_secs(30),
        "the member to rejoin",
        c.wait_healthy(Duration::from_secs(25)),
    )
    .await;
    g.rec.heal(f, false);
    sleep(Duration::from_secs(2)).await;
    g.leader("one leader after the member rejoined").await;
    g.finish("etcd cluster: Raft leader member SIGKILLed, then back")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_quorum_lost_and_restored() {
    let (mut servers, g) = cluster_group("cluster-quorum").await;
    let (l, tok) = g.leader("first election on the cluster").await;
    // Issue 12: the remaining member still answers pings, but nothing
    // trustworthy: every sidecar reports it within the silence bound.
    let f = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        silent_after: Some(SILENT_BOUND),
        ..Fault::new(
            "2 of 3 members SIGKILLed for 3 x TTL",
            Some(l),
            Expect::CutOff,
            RESTART_BOUND,
        )
    });
    let c = cluster(&mut servers);
    c.kill(0);
    c.kill(1);
    sleep(TTL * 3).await;
    g.rec.end_silence(f);
    c.restart(0);
    c.restart(1);
    within(
        Duration::from_secs(30),
        "the cluster to regain quorum",
        c.wait_healthy(Duration::from_secs(25)),
    )
    .await;
    g.rec.heal(f, true);
    within(
        RESTART_BOUND + Duration::from_secs(5),
        "a leader after quorum came back",
        g.rec.wait_leader(RESTART_BOUND + Duration::from_secs(4)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
    g.finish("etcd cluster: quorum lost 3 x TTL, then restored")
        .await;
}

impl Servers {
    /// Freeze (SIGSTOP) or thaw (SIGCONT) every server: sockets stay open,
    /// nothing answers.
    fn freeze(&self, frozen: bool) {
        let sig = if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        match self {
            Servers::Cluster(c) => (0..c.len()).for_each(|i| c.signal(i, sig)),
            Servers::Redis(v) => v.iter().for_each(|r| r.signal(sig)),
        }
    }
}

/// Move etcd's revision on with writes to other keys, then compact its whole
/// history: a watch from any earlier revision can no longer be opened.
async fn compact(servers: &Servers) {
    let Servers::Cluster(c) = servers else {
        unreachable!("compaction is an etcd fault")
    };
    let opts = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2));
    let mut cl = within(
        Duration::from_secs(5),
        "connecting to the etcd cluster",
        etcd_client::Client::connect(c.urls(), Some(opts)),
    )
    .await
    .expect("connect to the etcd cluster");
    let mut rev = 0;
    for i in 0..20 {
        rev = within(
            Duration::from_secs(5),
            "etcd put",
            cl.put(format!("/other/{i}"), "x", None),
        )
        .await
        .expect("put another key")
        .header()
        .map_or(0, |h| h.revision());
    }
    within(
        Duration::from_secs(5),
        "etcd compact",
        cl.compact(rev, None),
    )
    .await
    .expect("compact");
}

/// Issue 12, item 1: the backend freezes (SIGSTOP: TCP stays open, nothing
/// answers). The leader steps down by its `valid_until`; every follower must
/// report `error`, `backend_healthy: false` and stop naming the leader within
/// the silence bound. On the original code followers kept vouching for the
/// old leader until HTTP/2 keep-alive gave up (~13 s).
async fn backend_frozen(kind: Kind) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_frozen() {
    backend_frozen(Kind::Etcd).await;
}

/// Returns as soon as the sidecar's count of acknowledged renewals grows
/// (`leader_election_renew_duration_seconds_count` on `/metrics`), polled
/// every 5 ms: the next renewal is then about a renew interval away.
async fn just_after_a_renewal(s: &Sidecar) {
    async fn renewals(s: &Sidecar) -> Option<u64> {
        let (_, body) = http_get(s.port, "/metrics").await.ok()?;
        body.lines()
            .find(|l| l.starts_with("leader_election_renew_duration_seconds_count"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }
    let before = renewals(s).await;
    within(Duration::from_secs(5), "a renewal of the holder", async {
        while renewals(s).await == before {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Issue 12, item 2: etcd compacts its history during a long term, then the
/// leader's watch breaks (a reset of its connections shorter than the safety
/// margin). The watch must come back from a revision etcd still has, so a key
/// deleted by hand afterwards is noticed by the watch, not by the next
/// renewal. On the original code every reopen failed ("revision compacted").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compaction_during_a_term() {
    let servers = Servers::single(Kind::Etcd).await;
    let g = Group::start(&servers, "etcd-compaction", ABC).await;
    let key = key_of(Kind::Etcd, &g.election);
    let (l, tok) = g.leader("first election").await;
    sleep(Duration::from_secs(1)).await;
    let f = g.rec.fault(Fault::new(
        "compaction, then a 150 ms reset of the leader",
        Some(l),
        Expect::Other,
        FAILOVER_BOUND,
    ));
    compact(&servers).await;
    g.cut(l, Mode::Reset);
    sleep(BLIP).await;
    g.cut(l, Mode::Pass);
    g.rec.heal(f, false);
    // Renewals reopen the watch.
    sleep(RENEW * 4).await;
    let (l2, tok2) = g.leader("the same leader after the blip").await;
    assert_eq!(
        (l2, tok2),
        (l, tok),
        "a 150 ms reset changed the leader: the scenario needs one long term"
    );
    let d = g.rec.fault(Fault {
        ends_term: Some((l, tok)),
        ..Fault::new(
            "key deleted after the compaction",
            Some(l),
            Expect::Other,
            FAILOVER_BOUND,
        )
    });
    // Right after a renewal: the renewal also reads the key, so a delete
    // just before one would race the watch (CI under load saw it lose).
    let holder = g.sidecars[l].as_ref().expect("the holder runs");
    just_after_a_renewal(holder).await;
    tamper(&servers, &key, None).await;
    within(
        FAILOVER_BOUND + Duration::from_secs(3),
        "a new term after the key was deleted",
        g.rec
            .wait_new_leader((l, tok), FAILOVER_BOUND + Duration::from_secs(2)),
    )
    .await;
    g.rec.heal(d, false);
    sleep(Duration::from_millis(500)).await;
    let log = g.sidecars[l].as_ref().expect("the holder runs").log();
    assert!(
        // The original code's watch error ("revision compacted at N").
        !log.contains("revision compacted at"),
        "the holder's watch could not come back after the compaction:\n{}",
        tail(&log, 30)
    );
    assert!(
        log.contains("key deleted, overwritten or edited by someone else"),
        "the holder learned of the delete from a renewal, not from its watch:\n{}",
        tail(&log, 30)
    );
    g.finish("etcd: compaction during a term, then the key deleted by hand")
        .await;
}

// ----------------------------------------------------------- Redis scenarios

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen() {
    backend_frozen(Kind::Redis).await;
}

/// Wait until the wall clock is `frac` into a second.
async fn until_wall_fraction(frac: f64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    sleep(Duration::from_secs_f64(
        (frac - now.fract()).rem_euclid(1.0),
    ))
    .await;
}

/// Issue 12, item 5: the leader is cut off (a partition), and Redis restarts
/// empty late in a wall-clock second, when `uptime_in_seconds` runs up to a
/// second ahead of real uptime. Nobody may be elected on the emptied server
/// before the cut-off leader's term has run out on its own clock. On the
/// original code a follower led 400-700 ms before the old leader stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_while_the_leader_is_cut_off() {
    let mut servers = Servers::Redis(vec![own_redis(&[]).await]);
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
        let Servers::Redis(v) = &mut servers else {
            unreachable!()
        };
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
    let mut servers = Servers::Redis(three_redis().await);
    let mut g = Group::start(&servers, "redlock-lose", ABC).await;
    let key = key_of(Kind::Redis, &g.election);
    let Servers::Redis(v) = &mut servers else {
        unreachable!()
    };
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
async fn three_redis() -> Vec<RedisServer> {
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
async fn leader_on_all_three(g: &mut Group, v: &[RedisServer], key: &str) -> (usize, u64) {
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
async fn servers_holding(v: &[RedisServer], key: &str, id: &str) -> usize {
    let mut holding = 0;
    for server in v {
        let mut c = within(Duration::from_secs(5), "connecting to redis", server.conn()).await;
        let value: Option<String> = within(
            Duration::from_secs(5),
            "redis GET",
            redis::cmd("GET").arg(key).query_async(&mut c),
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
    let mut servers = Servers::Redis(vec![own_redis(&[]).await]);
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
        let Servers::Redis(v) = &mut servers else {
            unreachable!()
        };
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
    let mut servers = Servers::Redis(three_redis().await);
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

// ---------------------------------------------------------- randomized mode

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized() {
    let long = std::env::var("FAULT_LONG").is_ok_and(|v| v == "1");
    let duration = if long {
        Duration::from_secs_f64(env_or("FAULT_MINUTES", 10.0) * 60.0)
    } else {
        Duration::from_secs(30)
    };
    let seed: u64 = env_or("FAULT_SEED", rand::rng().random());
    let kind = match std::env::var("FAULT_BACKEND").as_deref() {
        Ok("redis") => Kind::Redis,
        Ok("etcd") | Err(_) => Kind::Etcd,
        Ok(other) => panic!("FAULT_BACKEND must be etcd or redis, not {other:?}"),
    };
    eprintln!(
        "== randomized: FAULT_SEED={seed} FAULT_BACKEND={} for {:?}{}",
        kind.name(),
        duration,
        if long {
            ""
        } else {
            " (short mode; FAULT_LONG=1 FAULT_MINUTES=N for a soak)"
        }
    );
    randomized_run(kind, seed, duration).await;
}

impl Servers {
    fn count(&self) -> usize {
        self.urls().len()
    }

    /// SIGKILL server (member) `i`.
    fn kill(&mut self, i: usize) {
        match self {
            Servers::Cluster(c) => c.kill(i),
            Servers::Redis(v) => v[i].stop(),
        }
    }

    /// Start server `i` again; for a cluster, call [`Servers::wait_healthy`] after.
    async fn revive(&mut self, i: usize) {
        match self {
            Servers::Cluster(c) => c.restart(i),
            Servers::Redis(v) => restart_redis(&mut v[i]).await,
        }
    }

    /// Redis: forget everything on server `i` (a restart without persistence
    /// after [`Servers::kill`] and [`Servers::revive`]).
    async fn flush(&self, i: usize) {
        if let Servers::Redis(v) = self {
            let mut c = within(Duration::from_secs(5), "connecting to redis", v[i].conn()).await;
            within(
                Duration::from_secs(5),
                "FLUSHALL",
                redis::cmd("FLUSHALL").arg("SYNC").query_async::<()>(&mut c),
            )
            .await
            .expect("FLUSHALL");
        }
    }

    async fn wait_healthy(&mut self) {
        if let Servers::Cluster(c) = self {
            within(
                Duration::from_secs(40),
                "the etcd cluster to be healthy",
                c.wait_healthy(Duration::from_secs(35)),
            )
            .await;
        }
    }

    /// Index of a server worth killing: the etcd Raft leader half of the time.
    async fn pick(&self, rng: &mut StdRng) -> usize {
        if let Servers::Cluster(c) = self
            && rng.random_bool(0.5)
            && let Some(i) = within(Duration::from_secs(10), "member status", c.raft_leader()).await
        {
            return i;
        }
        rng.random_range(0..self.count())
    }
}

/// Redis: start a replica of server `i`, let it copy, cut replication (it
/// lags from here on, and has lost the election key's last writes), wait
/// `lag`, then kill server `i` and send every sidecar's connections for it to
/// the replica.
async fn promote_replica(servers: &mut Servers, g: &mut Group, i: usize, key: &str, lag: Duration) {
    let Servers::Redis(v) = servers else {
        unreachable!("replica promotion is a Redis fault")
    };
    let replica = own_redis(DURABLE).await;
    let mut c = within(
        Duration::from_secs(5),
        "connecting to the replica",
        replica.conn(),
    )
    .await;
    within(
        Duration::from_secs(5),
        "REPLICAOF",
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(v[i].port)
            .query_async::<()>(&mut c),
    )
    .await
    .expect("REPLICAOF");
    wait_for(Duration::from_secs(10), "the replica to sync", || {
        let mut c = c.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            info.contains("master_link_status:up")
        }
    })
    .await;
    within(
        Duration::from_secs(5),
        "REPLICAOF NO ONE",
        redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async::<()>(&mut c),
    )
    .await
    .expect("REPLICAOF NO ONE");
    within(
        Duration::from_secs(5),
        "DEL on the replica",
        redis::cmd("DEL").arg(key).query_async::<()>(&mut c),
    )
    .await
    .expect("DEL on the replica");
    sleep(lag).await;
    v[i].stop();
    let to = support::proxy::addr_of(&replica.url);
    for slot in 0..g.proxies.len() {
        g.proxies[slot][i].redirect(to).await;
    }
    g.upstream[i] = replica.url.clone();
    v[i] = replica;
}

/// The faults of the randomized schedule. Redis DEL by hand is left out: the
/// README documents that it lets a follower lead before the holder's next
/// renewal (see `redis_key_deleted`), so it would only repeat that finding.
#[derive(Clone, Copy, Debug)]
enum Chaos {
    KillLeader,
    TermLeader,
    PauseLeader,
    CutLeader,
    CutFollower,
    SlowAll,
    SlowLeader,
    BackendDown,
    ServerDown,
    QuorumLost,
    KeyDeleted,
    KeyOverwritten,
    /// Every server SIGSTOPped (sockets open, nothing answers).
    BackendFrozen,
    /// etcd: history compacted during a term, the leader's watch broken by a
    /// short reset, then the key deleted by hand.
    Compaction,
    /// Redis: the leader cut off while every server restarts empty.
    AmnesiaWhileCutOff,
    /// Redis: a lagging replica of one server promoted in its place.
    ReplicaPromoted,
}

fn ms_between(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

async fn randomized_run(kind: Kind, seed: u64, duration: Duration) {
    let mut run = ChaosRun::start(kind, seed).await;
    let menu = run.menu(kind);
    let end = Instant::now() + duration;
    let mut n = 0;
    while Instant::now() < end {
        let Some((l, tok)) = within(
            Duration::from_secs(25),
            "waiting for a leader between faults",
            run.g.rec.wait_leader(Duration::from_secs(20)),
        )
        .await
        else {
            eprintln!("no leader for 20 s between faults; stopping the schedule");
            break;
        };
        let chaos = menu[run.rng.random_range(0..menu.len())];
        let followers: Vec<usize> = run.g.live().into_iter().filter(|i| *i != l).collect();
        n += 1;
        let turn = Turn {
            prefix: format!("{n:>3} {chaos:?}: "),
            l,
            tok,
            followers,
        };
        run.inject(chaos, &turn).await;
        let rest = ms_between(&mut run.rng, 200, 2000);
        sleep(rest).await;
    }
    run.finish(kind, seed, n).await;
}

/// The servers of a randomized run: one, or three (an etcd cluster, or three
/// Redis servers for Redlock).
async fn chaos_servers(kind: Kind, n_servers: usize) -> Servers {
    match (kind, n_servers) {
        (_, 1) => Servers::single(kind).await,
        (Kind::Etcd, _) => Servers::Cluster(
            within(
                Duration::from_secs(40),
                "a 3-member etcd cluster to start",
                EtcdCluster::start(3),
            )
            .await,
        ),
        (Kind::Redis, _) => Servers::Redis(three_redis().await),
    }
}

/// One randomized run: the servers, the sidecars behind their proxies, and
/// the seeded random source. Every choice is drawn from `rng` in a fixed
/// order, so a seed replays the same schedule.
struct ChaosRun {
    rng: StdRng,
    // Before `servers`: fields drop in order, and the sidecars should stop
    // before their backend does (as the locals of the old loop did).
    g: Group,
    servers: Servers,
    key: String,
    restart_bound: Duration,
}

/// One turn of the schedule: the leader found before the fault, the other
/// live slots, and the prefix of the fault's label (turn number and kind).
struct Turn {
    prefix: String,
    l: usize,
    tok: u64,
    followers: Vec<usize>,
}

impl Turn {
    /// A fault's label: the turn's prefix, then `what`.
    fn label(&self, what: String) -> String {
        format!("{}{what}", self.prefix)
    }
}

impl ChaosRun {
    /// Start the servers (`FAULT_SERVERS`, 1 or 3) and 3 to 5 sidecars.
    async fn start(kind: Kind, seed: u64) -> ChaosRun {
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
    fn menu(&self, kind: Kind) -> Vec<Chaos> {
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
    async fn inject(&mut self, chaos: Chaos, t: &Turn) {
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
    async fn stop_leader(&mut self, t: &Turn, sig: Signal) {
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
    async fn pause_leader(&mut self, t: &Turn) {
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
    async fn cut(&mut self, t: &Turn, leader: bool) {
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
    async fn slow(&mut self, t: &Turn, all: bool) {
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
    async fn backend_down(&mut self, t: &Turn) {
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
    async fn server_down(&mut self, t: &Turn) {
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
    async fn quorum_lost(&mut self, t: &Turn) {
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
    async fn backend_frozen(&mut self, t: &Turn) {
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
    async fn compaction(&mut self, t: &Turn) {
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
    async fn amnesia_while_cut_off(&mut self, t: &Turn) {
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
    async fn replica_promoted(&mut self, t: &Turn) {
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
    async fn key_deleted(&mut self, t: &Turn) {
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
    async fn key_overwritten(&mut self, t: &Turn) {
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
    async fn finish(self, kind: Kind, seed: u64, n: usize) {
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
fn per_kind_summary(r: &Report) {
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

// ------------------------------------------- self-tests of the test machinery

/// The proxy does what each mode promises, against a loopback echo server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_modes_behave_as_documented() {
    let upstream = echo_server().await;
    let proxy = within(
        Duration::from_secs(5),
        "starting the proxy",
        Proxy::start(upstream),
    )
    .await;
    let mut c = connect_proxy(&proxy).await;
    assert_eq!(
        ask(&mut c, b"pass", Duration::from_secs(1))
            .await
            .as_deref(),
        Some(&b"pass"[..])
    );
    proxy_delays(&proxy, &mut c).await;
    proxy_blackholes(&proxy, &mut c).await;
    proxy_resets(&proxy, &mut c).await;
    proxy.set(Mode::Pass);
    let mut again = connect_proxy(&proxy).await;
    assert_eq!(
        ask(&mut again, b"back", Duration::from_secs(1))
            .await
            .as_deref(),
        Some(&b"back"[..])
    );
}

/// A loopback server that echoes every byte back; returns its address.
async fn echo_server() -> std::net::SocketAddr {
    let echo = within(
        Duration::from_secs(2),
        "binding the echo server",
        tokio::net::TcpListener::bind("127.0.0.1:0"),
    )
    .await
    .unwrap();
    let upstream = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    upstream
}

/// A new connection to `proxy`.
async fn connect_proxy(proxy: &Proxy) -> tokio::net::TcpStream {
    within(
        Duration::from_secs(2),
        "connecting to the proxy",
        tokio::net::TcpStream::connect(("127.0.0.1", proxy.port)),
    )
    .await
    .unwrap()
}

/// Send `msg` and read as many bytes back, each within `wait`; `None` when
/// either did not happen in time or failed.
async fn ask(s: &mut tokio::net::TcpStream, msg: &[u8], wait: Duration) -> Option<Vec<u8>> {
    timeout(wait, s.write_all(msg)).await.ok()?.ok()?;
    let mut buf = vec![0u8; msg.len()];
    match timeout(wait, s.read_exact(&mut buf)).await {
        Ok(Ok(_)) => Some(buf),
        _ => None,
    }
}

/// `Mode::Delay` holds answers for about the delay.
async fn proxy_delays(proxy: &Proxy, c: &mut tokio::net::TcpStream) {
    proxy.set(Mode::Delay(Duration::from_millis(200)));
    let t = Instant::now();
    assert!(ask(c, b"slow", Duration::from_secs(1)).await.is_some());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(600),
        "delay: {took:?}"
    );
}

/// `Mode::Blackhole` answers nothing, on `c` or a new connection, and
/// delivers what it held once the proxy passes again.
async fn proxy_blackholes(proxy: &Proxy, c: &mut tokio::net::TcpStream) {
    proxy.set(Mode::Blackhole);
    assert_eq!(
        ask(c, b"held", Duration::from_millis(300)).await,
        None,
        "blackhole answered"
    );
    let mut fresh = connect_proxy(proxy).await;
    assert_eq!(
        ask(&mut fresh, b"new!", Duration::from_millis(300)).await,
        None,
        "blackhole answered a new connection"
    );
    proxy.set(Mode::Pass);
    // What was held is delivered when the partition heals.
    let mut buf = [0u8; 4];
    within(
        Duration::from_secs(1),
        "held bytes after the heal",
        c.read_exact(&mut buf),
    )
    .await
    .unwrap();
    assert_eq!(&buf, b"held");
    within(
        Duration::from_secs(1),
        "held bytes of a new connection",
        fresh.read_exact(&mut buf),
    )
    .await
    .unwrap();
    assert_eq!(&buf, b"new!");
}

/// `Mode::Reset` ends `c` and resets new connections at once.
async fn proxy_resets(proxy: &Proxy, c: &mut tokio::net::TcpStream) {
    let mut buf = [0u8; 4];
    proxy.set(Mode::Reset);
    let r = within(
        Duration::from_secs(1),
        "a reset connection to end",
        c.read(&mut buf),
    )
    .await;
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "reset left the connection open: {r:?}"
    );
    // A new connection is reset at once: connect fails, or the first read does.
    let conn = within(
        Duration::from_secs(2),
        "connecting to the proxy in reset mode",
        tokio::net::TcpStream::connect(("127.0.0.1", proxy.port)),
    )
    .await;
    if let Ok(mut refused) = conn {
        let r = within(
            Duration::from_secs(1),
            "a new connection to be reset",
            refused.read(&mut buf),
        )
        .await;
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "reset accepted a connection: {r:?}"
        );
    }
}

/// The checker catches a real overlap and a stale claim, and does not call a
/// clean handover an overlap even when the polls straddle it.
#[test]
fn checker_tells_overlaps_from_polling_artifacts() {
    let s = Synthetic { t0: Instant::now() };
    s.handover_is_no_overlap_but_overlap_is();
    s.cut_off_claims_are_stale();
    s.only_the_paused_term_is_stale();
    // A later term with a smaller token.
    let slots = vec![
        ("a".to_owned(), s.series(0, 100, true, 5, 2000)),
        ("b".to_owned(), s.series(200, 300, true, 4, 2000)),
    ];
    let r = check("fencing", s.t0, TTL, &slots, &[]);
    assert_eq!(r.token_regressions.len(), 1, "{}", r.summary());
}

/// Made-up recordings for the checker's self-test, on a clock starting at
/// `t0`.
struct Synthetic {
    t0: Instant,
}

impl Synthetic {
    /// The instant `ms` milliseconds after `t0`.
    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// An answer claiming (or not) leadership with `token`.
    fn answer(&self, leader: bool, token: u64, valid_for_ms: u64) -> Answer {
        Answer {
            status: if leader { 200 } else { 503 },
            is_leader: leader,
            leader: None,
            fencing_token: Some(token),
            valid_for_ms,
            transitions: 1,
            backend_healthy: true,
            error: None,
        }
    }

    /// Polls every 5 ms from `from` to `to`, each answered 3 ms after it was
    /// sent, valid until `deadline`.
    fn series(&self, from: u64, to: u64, leader: bool, token: u64, deadline: u64) -> Vec<Sample> {
        (from..to)
            .step_by(5)
            .map(|ms| Sample {
                send: self.at(ms),
                recv: self.at(ms + 3),
                answer: Some(self.answer(leader, token, deadline.saturating_sub(ms))),
            })
            .collect()
    }

    /// Polls that straddle a clean handover are no overlap; a second leader
    /// claiming for ~100 ms while the first still claims is one.
    fn handover_is_no_overlap_but_overlap_is(&self) {
        // a leads until ~100 ms; b from ~101 ms. a's last true poll (sent 95,
        // answered 98) and b's first true poll (sent 100, answered 103) straddle
        // the handover: not an overlap.
        let mut a = self.series(0, 100, true, 1, 2000);
        a.extend(self.series(100, 300, false, 1, 0));
        let mut b = self.series(0, 100, false, 0, 0);
        b.extend(self.series(100, 300, true, 2, 2000));
        let slots = vec![("a".to_owned(), a.clone()), ("b".to_owned(), b.clone())];
        let r = check("handover", self.t0, TTL, &slots, &[]);
        assert!(r.overlaps.is_empty(), "{}", r.summary());
        assert!(r.problems.is_empty(), "{}", r.summary());

        // b starts claiming while a still claims (a until 200 ms): caught.
        let mut a2 = self.series(0, 200, true, 1, 2000);
        a2.extend(self.series(200, 300, false, 1, 0));
        let slots = vec![("a".to_owned(), a2), ("b".to_owned(), b.clone())];
        let r = check("overlap", self.t0, TTL, &slots, &[]);
        assert_eq!(r.overlaps.len(), 1, "{}", r.summary());
        assert!(
            r.overlaps[0].at_least >= Duration::from_millis(90),
            "{}",
            r.summary()
        );
    }

    /// A cut-off leader that reported valid_until ≈ 150 ms keeps claiming
    /// until 250 ms: a stale claim.
    fn cut_off_claims_are_stale(&self) {
        let mut c = self.series(0, 250, true, 3, 150);
        for s in &mut c {
            let ms = (s.send - self.t0).as_millis() as u64;
            s.answer = Some(self.answer(true, 3, 150u64.saturating_sub(ms)));
        }
        let fault = Fault::new("cut", Some(0), Expect::CutOff, FAILOVER_BOUND);
        let fault = Fault {
            start: self.at(0),
            recover_from: self.at(0),
            end: Some(self.at(400)),
            ..fault
        };
        let r = check("stale", self.t0, TTL, &[("c".to_owned(), c)], &[fault]);
        assert!(r.worst_stale_ms.is_some_and(|v| v > 0), "{}", r.summary());
    }

    /// A paused leader's answers after SIGCONT, ending in claims under
    /// `new_token` from 3.6 s on.
    fn paused(&self, new_token: u64) -> Vec<Sample> {
        let mut v = self.series(0, 100, true, 8, 2000);
        v.push(Sample {
            send: self.at(100),
            recv: self.at(2600),
            answer: Some(self.answer(false, 8, 0)),
        });
        v.extend(self.series(2605, 3600, false, 8, 0));
        v.extend(self.series(3600, 3700, true, new_token, 5600));
        v
    }

    /// A leader paused at 100 ms for 2.5 s that wins a new term (token 9)
    /// 1 s after SIGCONT: its old term is not claimed after SIGCONT, so
    /// nothing is stale; the same answers under the old token would be.
    fn only_the_paused_term_is_stale(&self) {
        let fault = Fault::new("pause", Some(0), Expect::Paused, FAILOVER_BOUND);
        let fault = Fault {
            start: self.at(100),
            recover_from: self.at(100),
            end: Some(self.at(2600)),
            ..fault
        };
        let r = check(
            "new term after pause",
            self.t0,
            TTL,
            &[("p".to_owned(), self.paused(9))],
            std::slice::from_ref(&fault),
        );
        assert!(r.worst_stale_ms.is_some_and(|v| v <= 0), "{}", r.summary());
        let r = check(
            "old term after pause",
            self.t0,
            TTL,
            &[("p".to_owned(), self.paused(8))],
            &[fault],
        );
        assert!(r.worst_stale_ms.is_some_and(|v| v > 0), "{}", r.summary());
    }
}
