//! The Redis backend: a single Redis server, or **Redlock** across N
//! independent servers (quorum N/2 + 1), following the algorithm on
//! redis.io's "Distributed locks with Redis".
//!
//! Layers, each a client of the one below:
//! - [`lua`]: every script, by name, and the stored value's codec;
//! - [`server`]: one server (connection, timeouts, error classification);
//! - [`group`]: Redlock as a quorum combinator over servers (one server is a
//!   group of one), with the fencing rule that keeps tokens growing, and
//!   [`verdict`]: the one renew and release verdict of a tally of answers,
//!   and [`answered`]: the one "enough servers answered" rule of every
//!   other command sent to all servers;
//! - `election`: the election ([`RedisBackend`], a [`super::LeaseBackend`]),
//!   with its operations beside it: the candidate registry (`registry`)
//!   the pause and switchover controls (`controls`) and the shard records
//!   of one server ([`shards`]); the coordination
//!   API ([`coord`]) is the other client of [`group`].
//!
//! With `--redis-min-replicas N` ([`RedisOptions::min_replicas`]) every
//! write a grant, a renewal or a fencing-counter raise rests on is followed by
//! `WAIT N` on the same connection ([`server::Server::eval`]); fewer
//! acknowledgements fail that server's answer with [`UNREPLICATED`], and a
//! grant there is given back by its caller like any failed acquisition.
//!
//! Known limits (also in the README): a server restarted without persistence
//! forgets keys and counters; process pauses are covered by the Elector's
//! safety rule and by fencing tokens, not by Redis; `WAIT` is not consensus (a
//! failover may still promote a replica that missed an acknowledged write).

mod answer;
pub mod answered;
pub mod cluster;
mod conn;
mod controls;
pub mod coord;
mod election;
mod exclusive;
pub mod flags;
pub mod group;
mod holders;
pub mod lua;
mod lua_campaign;
mod lua_ops;
mod lua_rw;
mod lua_sem;
mod lua_shards;
mod registry;
mod released;
pub mod roster;
pub mod sentinel;
pub mod server;
pub mod shards;
pub mod verdict;

use std::time::Duration;

use crate::backend::About;

pub use answer::PAUSED_RETRY;
pub use election::RedisBackend;
#[cfg(test)]
pub(crate) use election::{renewal, resigned};
pub use group::{Group, drift};
pub use registry::FALLBACK;

/// The Redis backend's name and advice (see [`About`]).
pub(crate) const BACKEND: &About = &About {
    name: "redis",
    tls_hint: "check --redis-ca-file (the CA that signed the server certificate) and the host name in the rediss:// URL",
    auth_hint: "check the user and password in --redis-url or --redis-password-file, and that the ACL user may run GET, SET, INCR, EXISTS, PTTL, PEXPIRE, DEL, PUBLISH, EVAL/EVALSHA and SUBSCRIBE, and the candidate registry's HSET, HSETNX, HMGET, ZADD, ZRANGE, ZREM, ZSCORE and ZREMRANGEBYSCORE (with --shards also SADD, SREM, SMEMBERS, ZRANGEBYSCORE and INFO), on the election's keys and channels (and WAIT with --redis-min-replicas)",
    rejected: &[
        (
            "wrongtype",
            "another program stored a key of another type under the election key: delete it or choose another --redis-prefix",
        ),
        (
            "noscript",
            "the server did not know a script and loading it failed (SCRIPT FLUSH in between, or EVAL refused by the ACL: allow EVAL and EVALSHA); retrying",
        ),
        (
            "readonly",
            "this Redis is a read-only replica (after a failover?): with --redis-sentinel the sidecar asks the Sentinels for the new primary; with --redis-url use --redis-sentinel HOST:PORT --redis-sentinel-master NAME, or point --redis-url at the primary",
        ),
        (
            "loading",
            "Redis is loading its dataset after a restart; retrying",
        ),
        (
            roster::NO_PERSISTENCE,
            "failsafe on Redis needs persistence on every server: run redis-server with --appendonly yes (a restart without it forgets the failsafe roster); nobody campaigns until then",
        ),
        (
            "roster",
            "the failsafe roster key holds something that is not the leader's roster (edited by hand?), or the servers' rosters disagree: the leader's next renewal writes it again; with no leader, delete <prefix>{<election>}:failsafe:roster on every server only when no sidecar of the election runs in failsafe",
        ),
        (
            "oom",
            "Redis is out of memory (maxmemory): free memory or raise maxmemory; retrying",
        ),
        (
            UNREPLICATED,
            "a grant or renewal counts only once as many replicas as --redis-min-replicas asks have it (WAIT): check that the replicas run and are linked to this primary (INFO replication: connected_slaves), or lower --redis-min-replicas; the grant was given back (a renewal counts as failed), retrying",
        ),
    ],
    expiry: "its key's PTTL is 0: the server is expiring it (its holder did not renew it)",
    open_cause: None,
};

/// How to reach the Redis servers. Secrets are held in memory only; logs and
/// errors show the URLs with their passwords replaced by `***`.
#[derive(Clone, Default)]
pub struct RedisOptions {
    /// `redis://` or `rediss://` URLs, one per independent server (1 = single
    /// instance, 3 or more = Redlock).
    pub urls: Vec<String>,
    /// Password for every URL that does not carry one (`--redis-password-file`).
    pub password: Option<String>,
    /// PEM of the CA that signed the servers' certificates, for `rediss://`
    /// with a private CA (else the system's roots).
    pub ca_pem: Option<Vec<u8>>,
    /// Deadline of each request to one server (and of connecting to it).
    pub per_server_timeout: Duration,
    /// Replicas of each server that must acknowledge a grant, a renewal or a
    /// fencing-counter raise (`WAIT`) before it counts (`--redis-min-replicas`);
    /// 0 = off.
    pub min_replicas: u32,
    /// A Sentinel group that names the one primary (`--redis-sentinel`),
    /// instead of `urls`.
    pub sentinel: Option<sentinel::SentinelOptions>,
    /// `urls` are seeds of one Redis Cluster (`--redis-cluster`), not
    /// independent servers.
    pub cluster: bool,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
            )
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("per_server_timeout", &self.per_server_timeout)
            .field("min_replicas", &self.min_replicas)
            .field("sentinel", &self.sentinel)
            .field("cluster", &self.cluster)
            .finish()
    }
}

pub use crate::flags::redact;

/// Check a Redis URL: `redis://[user[:password]@]host:port[/db]` or `rediss://…`.
///
/// # Errors
/// A message with the redacted value and an example.
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    let shown = redact(url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(format!(
            "{shown} needs the scheme redis:// or rediss://, e.g. redis://127.0.0.1:6379"
        ));
    }
    redis::Client::open(url)
        .map(|_| ())
        .map_err(|e| format!("{shown} is not a Redis URL ({e}); use e.g. redis://user@host:6379/0"))
}

/// The code (and metric reason) of a write that fewer replicas acknowledged
/// than `--redis-min-replicas` asks for.
pub const UNREPLICATED: &str = "replicas";

/// A write that too few replicas acknowledged within the time given to
/// `WAIT` (`waited_ms`), or (`None`) a campaign refused before writing
/// because too few replicas are linked and acknowledging.
#[derive(Debug)]
pub struct Unreplicated {
    /// The server (redacted URL).
    pub server: String,
    /// Replicas that acknowledged (`WAIT`'s answer), or that are linked and
    /// acknowledging (`INFO replication`).
    pub acked: u64,
    /// Replicas asked for.
    pub wanted: u32,
    /// How long `WAIT` was allowed to block; `None` when nothing was written.
    pub waited_ms: Option<u64>,
}

impl std::fmt::Display for Unreplicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (acked, wanted, server) = (self.acked, self.wanted, &self.server);
        match self.waited_ms {
            Some(ms) => write!(
                f,
                "{acked} of the {wanted} replicas --redis-min-replicas asks for acknowledged the write on {server} within {ms} ms"
            ),
            None => write!(
                f,
                "{acked} of the {wanted} replicas --redis-min-replicas asks for are linked to {server} and acknowledging (INFO replication); nothing was written"
            ),
        }
    }
}

impl std::error::Error for Unreplicated {}

/// Whether `e` is one server's write that too few replicas acknowledged: the
/// write happened on the primary, so a grant there must be given back.
pub fn is_unreplicated(e: &crate::backend::BackendError) -> bool {
    match e {
        crate::backend::BackendError::Rejected {
            code: UNREPLICATED,
            source,
            ..
        } => source
            .downcast_ref::<Unreplicated>()
            .is_some_and(|u| u.waited_ms.is_some()),
        _ => false,
    }
}

/// Refusal of a fencing counter that is not a non-negative integer of at
/// most [`lua::COUNTER_DIGITS`] digits (the one counter rule of every script).
#[derive(Debug, thiserror::Error)]
#[error(
    "the fencing counter {key} holds {value:?}, not a non-negative integer of at most {digits} digits",
    digits = lua::COUNTER_DIGITS
)]
pub struct BadCounter {
    /// The counter key.
    pub key: String,
    /// What it holds.
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact("rediss://pw@h:1"), "rediss://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redis+unix:///run/r.sock?db=1&pass=pw"),
            "redis+unix:///run/r.sock?db=1&pass=***"
        );
        assert_eq!(
            redact("redis://u:pw@h:1/0?password=pw2"),
            "redis://u:***@h:1/0?password=***"
        );
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("redis://127.0.0.1:6379").is_ok());
        assert!(
            check_url("http://127.0.0.1:6379")
                .unwrap_err()
                .contains("redis://")
        );
        assert!(!check_url("localhost:6379").unwrap_err().contains("pw"));
    }
}
