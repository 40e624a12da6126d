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
//! The scenarios every backend runs are one table (`fault_table!` below:
//! `fault::<backend>::<scenario>`); faults only one backend has are in
//! [`etcd_only`] and [`redis_only`].
//!
//! `chaos::randomized` runs a seeded schedule of these faults: 30 s by default, or
//! `FAULT_MINUTES` with `FAULT_LONG=1` (see `scripts/fault-soak`); it prints the
//! seed first (`FAULT_SEED` replays it) and takes `FAULT_BACKEND=etcd|redis`
//! (and `FAULT_ONLY=Kind,Kind` to draw only some kinds of fault).

mod chaos;
mod chaos_faults;
mod etcd_only;
mod group;
mod machinery;
mod redis_only;
mod scenarios;

use std::future::Future;
use std::io::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use crate::support::backends::Backend;
use crate::support::proxy::{Mode, Proxy};
use crate::support::recorder::{Answer, Expect, Fault, Recorder, Report, Sample, check};
use crate::support::*;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::{Instant, sleep, timeout};

use etcd_only::compact;
use group::*;
use redis_only::{three_redis, until_wall_fraction};
use scenarios::*;

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

/// A client of every member of `c` (2 s per request), for edits by hand.
async fn cluster_client(c: &EtcdCluster) -> etcd_client::Client {
    let opts = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2));
    within(
        Duration::from_secs(5),
        "connecting to the etcd cluster",
        etcd_client::Client::connect(c.urls(), Some(opts)),
    )
    .await
    .expect("connect to the etcd cluster")
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

/// The backend servers the proxies forward to: the one backend fixture,
/// etcd always as a cluster (of one member here), Redis as one server or a
/// Redlock group.
type Servers = Backend;

impl Servers {
    async fn single(kind: Kind) -> Servers {
        match kind {
            Kind::Etcd => Servers::EtcdCluster(
                within(
                    Duration::from_secs(70),
                    "etcd start-up",
                    EtcdCluster::start(1),
                )
                .await,
            ),
            Kind::Redis => Servers::Redis(own_redis(DURABLE).await),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Servers::Redis(_) | Servers::Redlock(_) => Kind::Redis,
            _ => Kind::Etcd,
        }
    }
}

/// The scenarios every backend runs: for each backend listed (`module =>
/// Kind`) a module of one `#[tokio::test]` per scenario, `name =>
/// scenario(args);` running `scenario(kind, args)`. A new backend is one more
/// entry in `backends` (and its arms in `Servers`, `Group::spawn` and
/// `key_of`).
macro_rules! fault_table {
    (backends: [$($backend:ident => $kind:expr),* $(,)?]; $scenarios:tt) => {
        $(
            mod $backend {
                use super::*;
                fault_table!(@tests $kind; $scenarios);
            }
        )*
    };
    (@tests $kind:expr; { $($test:ident => $scenario:ident($($arg:expr),*);)* }) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$scenario($kind $(, $arg)*).await;
            }
        )*
    };
}

fault_table! {
    backends: [etcd => Kind::Etcd, redis => Kind::Redis];
    {
        sigkill_leader => kill_leader();
        sigstop_leader => pause_leader();
        blackhole_leader => cut_leader(Mode::Blackhole, "blackhole");
        reset_leader => cut_leader(Mode::Reset, "reset");
        slow_answers => delay_all();
        blackhole_blip_keeps_the_leader => blip(Mode::Blackhole, "blackhole");
        reset_blip_keeps_the_leader => blip(Mode::Reset, "reset");
        down_and_back => backend_down();
        key_deleted => key_deleted();
        key_overwritten => key_overwritten();
        frozen => backend_frozen();
    }
}
