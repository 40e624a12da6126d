//! The Redis backend's flags (`--redis-*`), their checks, and the settings
//! they resolve to: one server, or a Redlock group of three or more.

// The flags' doc comments are clap's `--help` text, not Markdown.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::coord::RedisCoord;
use super::sentinel::{SentinelOptions, sentinel_url};
use super::{RedisBackend, RedisOptions, check_url};
use crate::backend::registry::{Auto, BackendArgs, Common, Connected, Row, Settings};
use crate::flags::{ConfigError, config_error, read_pem, read_secret, redact};

/// The Redis backend's registry row.
pub const ROW: Row = Row {
    name: "redis",
    help: "a Redis key, one server or a Redlock group (--redis-url), the primary a Sentinel group names (--redis-sentinel), or a Redis Cluster (--redis-cluster)",
    auto: Auto::Flag {
        flag: "--redis-url",
        example: "--redis-url (e.g. redis://127.0.0.1:6379)",
        given: |a| !a.redis.redis_url.is_empty() || !a.redis.redis_sentinel.is_empty(),
    },
    resolve,
    coordination: Some("one server or a Redlock group: locks, semaphores, job claims"),
    failsafe: true,
    // One server only: `check_shards` refuses Redlock, Sentinel and Cluster.
    shards: true,
};

/// The Redis flags.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Redis")]
pub struct RedisArgs {
    /// Redis URL (redis://host:port or rediss://); repeat for Redlock across 3 or more servers.
    ///
    /// Redis URL (redis://[user[:password]@]host:port[/db] or rediss://); repeat for Redlock across independent servers (3 or more; the env variable takes a comma-separated list).
    #[arg(
        long,
        env = "LEADER_ELECTOR_REDIS_URL",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub redis_url: Vec<String>,

    /// File holding the Redis password (its first line), for URLs that carry none.
    #[arg(long, env = "LEADER_ELECTOR_REDIS_PASSWORD_FILE", value_name = "FILE")]
    pub redis_password_file: Option<PathBuf>,

    /// PEM file of the CA that signed the Redis servers' certificates (rediss:// with a private CA).
    #[arg(long, env = "LEADER_ELECTOR_REDIS_CA_FILE", value_name = "FILE")]
    pub redis_ca_file: Option<PathBuf>,

    /// Key prefix; the election key is <prefix>{<election>}.
    #[arg(
        long,
        default_value = "leader-elector:",
        env = "LEADER_ELECTOR_REDIS_PREFIX",
        value_name = "PREFIX"
    )]
    pub redis_prefix: String,

    /// Replicas of each Redis server that must acknowledge a grant, a renewal and a fencing-counter raise (WAIT) before it counts; a grant they do not acknowledge is given back [range: 0-100; 0 = off].
    #[arg(
        long,
        default_value_t = 0,
        env = "LEADER_ELECTOR_REDIS_MIN_REPLICAS",
        value_parser = parse_min_replicas,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub redis_min_replicas: u32,

    /// Sentinels to ask for the primary instead of --redis-url (host:port, redis://host:port or rediss://host:port; comma-separated); failovers are followed, and a newly promoted primary is campaigned on only after one lease duration.
    #[arg(
        long,
        env = "LEADER_ELECTOR_REDIS_SENTINEL",
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    pub redis_sentinel: Vec<String>,

    /// The master's name in the Sentinels' configuration (sentinel monitor NAME ...); required with --redis-sentinel.
    #[arg(
        long,
        env = "LEADER_ELECTOR_REDIS_SENTINEL_MASTER",
        value_name = "NAME"
    )]
    pub redis_sentinel_master: Option<String>,

    /// File holding the Sentinels' password (its first line), for Sentinel addresses that carry none.
    #[arg(
        long,
        env = "LEADER_ELECTOR_REDIS_SENTINEL_PASSWORD_FILE",
        value_name = "FILE"
    )]
    pub redis_sentinel_password_file: Option<PathBuf>,

    /// The --redis-url URLs are seed nodes of one Redis Cluster, not independent servers: each election's keys live in one slot, MOVED/ASK and failovers are followed, and a newly promoted primary of the slot is campaigned on only after one lease duration [default: off].
    #[arg(long, env = "LEADER_ELECTOR_REDIS_CLUSTER", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub redis_cluster: Option<bool>,
}

/// The largest `--redis-min-replicas`: far above any real replica count, so
/// a slip (a port number, say) is caught at start instead of refusing every
/// grant.
pub const MAX_MIN_REPLICAS: u32 = 100;

/// Parse `--redis-min-replicas`: a whole number from 0 (off) to
/// [`MAX_MIN_REPLICAS`].
///
/// # Errors
/// A message with the value and what is allowed.
pub fn parse_min_replicas(s: &str) -> Result<u32, String> {
    let t = s.trim();
    match t.parse::<u32>() {
        Ok(n) if n <= MAX_MIN_REPLICAS => Ok(n),
        _ => Err(format!(
            "{t:?} is not a replica count: give a whole number from 0 (off, the default) to {MAX_MIN_REPLICAS}, e.g. 1 for a primary with one replica"
        )),
    }
}

/// Per-server timeout of a Redlock group: short against the TTL (the spec's
/// example is 5–50 ms for a 10 s TTL), but not so short that a busy loopback
/// server misses it.
pub fn redlock_server_timeout(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// The Redis backend's checked settings.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// Key prefix.
    pub prefix: String,
    /// Election name.
    pub election: String,
    /// How to reach the servers.
    pub options: RedisOptions,
    /// The longest the registry and controls watches wait for a pub/sub
    /// notice before reading again: the lease duration, at least
    /// [`FALLBACK`](super::FALLBACK).
    pub reread: std::time::Duration,
}

impl Settings for RedisSettings {
    fn name(&self) -> &'static str {
        ROW.name
    }

    fn connect(&self) -> Result<Connected, String> {
        let n = self.options.urls.len();
        if n > 1 && n.is_multiple_of(2) && !self.options.cluster {
            tracing::warn!(
                servers = n,
                quorum = n / 2 + 1,
                "an even number of Redlock servers tolerates no more failures than one server fewer; use an odd number (3 or 5)"
            );
        }
        let backend = RedisBackend::new(&self.prefix, &self.election, self.options.clone())?;
        backend.set_reread(self.reread);
        let coord = RedisCoord::new(backend.clone());
        // `None` on Redlock, Sentinel and Cluster (refused by `check_shards`).
        let shards = super::shards::RedisShards::new(backend.clone()).ok();
        Ok(Connected {
            registry: Some(backend.clone()),
            controls: Some(backend.clone()),
            roster: Some(backend.clone()),
            shards: shards.map(|s| Arc::new(s) as _),
            election: backend,
            coordination: Some(Box::new(coord)),
        })
    }
}

fn resolve(
    args: &BackendArgs,
    common: &Common,
    _chosen_by_auto: bool,
) -> Result<Arc<dyn Settings>, ConfigError> {
    let r = &args.redis;
    let sentinel = resolve_sentinel(r)?;
    if r.redis_url.is_empty() && sentinel.is_none() {
        return Err(config_error(
            "--redis-url is required with --backend redis (or --redis-sentinel with --redis-sentinel-master)\nhint: e.g. --redis-url redis://127.0.0.1:6379, or --redis-sentinel 127.0.0.1:26379 --redis-sentinel-master mymaster",
        ));
    }
    for url in &r.redis_url {
        check_url(url).map_err(|e| config_error(format!("--redis-url: {e}")))?;
    }
    let cluster = check_cluster(r, sentinel.is_some())?;
    // A cluster is one store: one request deadline, as one server's.
    let n = if cluster { 1 } else { r.redis_url.len().max(1) };
    let password = r
        .redis_password_file
        .as_deref()
        .map(|p| read_secret("--redis-password-file", p))
        .transpose()?;
    let ca_pem = r
        .redis_ca_file
        .as_deref()
        .map(|p| read_pem("--redis-ca-file", p, "CERTIFICATE"))
        .transpose()?;
    let tls = r
        .redis_url
        .iter()
        .chain(&r.redis_sentinel)
        .any(|u| u.starts_with("rediss://"));
    if ca_pem.is_some() && !tls {
        return Err(config_error(
            "--redis-ca-file needs rediss:// URLs in --redis-url (or rediss:// Sentinels in --redis-sentinel)",
        ));
    }
    let per_server_timeout = if n == 1 {
        common.call_timeout
    } else {
        redlock_server_timeout(common.lease_duration).min(common.call_timeout)
    };
    tracing::debug!(urls = ?r.redis_url.iter().map(|u| redact(u)).collect::<Vec<_>>(), "redis backend");
    Ok(Arc::new(RedisSettings {
        prefix: r.redis_prefix.clone(),
        election: common.election.clone(),
        options: RedisOptions {
            urls: r.redis_url.clone(),
            password,
            ca_pem,
            per_server_timeout,
            min_replicas: r.redis_min_replicas,
            sentinel,
            cluster,
        },
        reread: common.lease_duration.max(super::FALLBACK),
    }))
}

/// `--shards` (`on`: given) with these flags: shard records are kept on
/// one server only.
///
/// # Errors
/// A [`ConfigError`] naming `--shards` and the flag it cannot go with.
pub fn check_shards(r: &RedisArgs, on: bool) -> Result<(), ConfigError> {
    let with = if !on {
        return Ok(());
    } else if !r.redis_sentinel.is_empty() {
        "--redis-sentinel"
    } else if r.redis_cluster == Some(true) {
        "--redis-cluster"
    } else if r.redis_url.len() > 1 {
        "a Redlock group (--redis-url given more than once)"
    } else {
        return Ok(());
    };
    Err(config_error(format!(
        "--shards cannot go with {with}: the Redis backend keeps shard records on one server only\nhint: give one --redis-url (a single server), or leave --shards at 0"
    )))
}

/// Whether `--redis-cluster` is on, checked against the other flags: it
/// needs `--redis-url` seeds, excludes `--redis-sentinel`, and the prefix
/// may carry no hash tag braces (the election's and each coordination
/// object's own tag must decide the slot).
fn check_cluster(r: &RedisArgs, sentinel: bool) -> Result<bool, ConfigError> {
    if r.redis_cluster != Some(true) {
        return Ok(false);
    }
    if sentinel {
        return Err(config_error(
            "--redis-cluster and --redis-sentinel are both given: a Redis Cluster fails over by itself\nhint: drop --redis-sentinel and give the cluster's nodes with --redis-url",
        ));
    }
    if r.redis_url.is_empty() {
        return Err(config_error(
            "--redis-cluster needs seed nodes in --redis-url\nhint: e.g. --redis-cluster --redis-url redis://redis-cluster-0:6379,redis://redis-cluster-1:6379",
        ));
    }
    if r.redis_prefix.contains(['{', '}']) {
        return Err(config_error(format!(
            "--redis-prefix {:?} contains a brace: with --redis-cluster the hash tag of each key is the election's or the coordination object's name\nhint: drop the braces from --redis-prefix",
            r.redis_prefix
        )));
    }
    Ok(true)
}

/// The Sentinel settings of `--redis-sentinel*`, `None` without Sentinels.
fn resolve_sentinel(r: &RedisArgs) -> Result<Option<SentinelOptions>, ConfigError> {
    if r.redis_sentinel.is_empty() {
        if r.redis_sentinel_master.is_some() {
            return Err(config_error(
                "--redis-sentinel-master needs --redis-sentinel\nhint: e.g. --redis-sentinel 127.0.0.1:26379 --redis-sentinel-master mymaster",
            ));
        }
        return Ok(None);
    }
    if !r.redis_url.is_empty() {
        return Err(config_error(
            "--redis-sentinel and --redis-url are both given: the Sentinels name the one primary\nhint: drop --redis-url (Redlock over Sentinel groups is not supported)",
        ));
    }
    let master = match r.redis_sentinel_master.as_deref().map(str::trim) {
        Some(m) if !m.is_empty() && !m.contains(char::is_whitespace) => m.to_owned(),
        Some(m) => {
            return Err(config_error(format!(
                "--redis-sentinel-master {m:?} is not a master name: give the NAME of `sentinel monitor NAME host port quorum`, e.g. mymaster"
            )));
        }
        None => {
            return Err(config_error(
                "--redis-sentinel needs --redis-sentinel-master NAME (the name in `sentinel monitor NAME ...`), e.g. mymaster",
            ));
        }
    };
    for host in &r.redis_sentinel {
        check_url(&sentinel_url(host.trim()))
            .map_err(|e| config_error(format!("--redis-sentinel: {e}")))?;
    }
    let password = r
        .redis_sentinel_password_file
        .as_deref()
        .map(|p| read_secret("--redis-sentinel-password-file", p))
        .transpose()?;
    Ok(Some(SentinelOptions {
        hosts: r
            .redis_sentinel
            .iter()
            .map(|h| h.trim().to_owned())
            .collect(),
        master,
        password,
    }))
}
