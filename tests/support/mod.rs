//! The test kit, shared by tests/ and benches/ (`#[path]` includes it):
//! real server processes on loopback, each in its own temporary directory and
//! killed on `Drop`, and the small tools every suite needs.
//!
//! - [`ports`]: ports for servers that cannot bind port 0 (below the kernel's
//!   ephemeral range, per-process, never probed-and-released in that range),
//!   and `RefusedPort` for a URL that must refuse connections.
//! - [`backends`]: the one backend fixture (`Backend`: etcd, Redis, a
//!   Redlock group or the Kubernetes stand-in) and a sidecar's flags for it.
//! - [`failover`]: one failover run of Redis Cluster or Sentinel under
//!   the recorder, judged once (safety and its liveness twin).
//! - [`etcd`], [`redis_server`], [`sidecar`]: the processes (`Etcd`,
//!   `EtcdCluster`, `RedisServer`, `Sidecar`); the sidecar binds port 0 and
//!   reports its addresses in its log.
//! - [`http`]: one HTTP/1.1 client, always with a time limit.
//! - [`stats`]: percentiles and means for tests and benches; [`procfs`]: a
//!   process's memory, CPU time and open files.
//! - [`waits`]: polling with a limit.
//! - [`netns`]: real partitions (a network namespace per node, nftables
//!   cuts); [`history`]: the fenced register and leaderless time after heals.
//! - [`certs`]: TLS certificates.
//! - [`kube_api`], [`proxy`]: in-process stand-ins (bind port 0);
//!   [`old_elector`]: the archived leader-elector image's loop, on the
//!   Kubernetes stand-in;
//!   [`recorder`]: the fault suite's recorder and checker;
//!   [`sentinel`]: a Redis Sentinel group (a primary, two replicas, three
//!   Sentinels); [`cluster`]: a Redis Cluster (three primaries, three
//!   replicas).
//!
//! A missing binary fails the test loudly with the package to install; it
//! never skips.

#![allow(dead_code, unused_imports)]

pub mod backends;
pub mod bench_md;
pub mod certs;
pub mod cluster;
pub mod etcd;
pub mod failover;
pub mod fleet;
pub mod history;
pub mod http;
pub mod kube_api;
pub mod netns;
pub mod old_elector;
pub mod ports;
pub mod procfs;
pub mod proxy;
pub mod recorder;
pub mod redis_server;
pub mod sentinel;
pub mod sidecar;
pub mod stats;
pub mod waits;

use std::path::PathBuf;
use std::time::Duration;

pub use certs::Certs;
pub use etcd::{Etcd, EtcdCluster, etcd_messages};
pub use http::{HTTP_LIMIT, http_get, http_get_within, http_json, http_request};
pub use ports::{RefusedPort, server_port};
pub use redis_server::{RedisServer, parent_of, redis_calls, redis_is_ours};
pub use sidecar::{
    CONTROL, FAST, Sidecar, election, leaders, one_leader, redis_sidecar, token_of,
    watch_no_overlap,
};
pub use waits::{block, port_open, wait_for};

/// The path of `bin` on `PATH`; panics naming the Debian package when missing.
pub fn require(bin: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(bin);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{bin}` is not installed: this test needs a real {bin}. Install the Debian package `{package}` (sudo apt-get install -y {package}), or run scripts/test, which installs it."
    );
}

/// The environment variable `name` parsed as a `T`, or `default` when it is
/// unset or does not parse (the knobs of soaks and benches).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A duration between `lo` and `hi` milliseconds (both included), drawn
/// from `rng` (a seeded schedule replays it).
pub fn ms_between(rng: &mut impl rand::Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

/// Panics unless fencing token `later` is above `earlier`: a later term's
/// token is larger than every earlier term's (the fencing rule); `what` names
/// the later term.
pub fn assert_token_grew(earlier: u64, later: u64, what: &str) {
    assert!(
        later > earlier,
        "{what}: fencing token {later} after {earlier}, not larger (reused or gone back)"
    );
}
