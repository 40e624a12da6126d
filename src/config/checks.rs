//! Value parsers used by clap, the limits every duration and count must
//! respect, and the checks of single values (files, PEM, election names).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::{Cli, ConfigError, config_error};

/// Parse `host:port`, `:port` (all interfaces) or `localhost:port`.
///
/// # Errors
/// A message with the value and an example.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let text = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{s} resolves to no address")),
        Err(_) => Err(format!(
            "{s} is not a listen address; use HOST:PORT such as 0.0.0.0:4040 or 127.0.0.1:4040"
        )),
    }
}

/// Check a hook URL (`--candidate-health-url`, `--notify-url`): `http://host[:port]/path`.
///
/// # Errors
/// A message with the value and an example.
pub fn parse_http_url(s: &str) -> Result<String, String> {
    let s = s.trim();
    let uri: axum::http::Uri = s
        .parse()
        .map_err(|_| format!("{s} is not a URL; use e.g. http://127.0.0.1:8080/healthz"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!(
            "{s} must be an http:// URL with a host, e.g. http://127.0.0.1:8080/healthz (https is not supported for local hooks)"
        ));
    }
    Ok(s.to_owned())
}

/// The default identity: `POD_NAME`, else the host name.
pub(crate) fn default_identity() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| gethostname::gethostname().into_string().ok())
        .filter(|s| !s.trim().is_empty())
}

pub use crate::serve::{
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_BODY_TIMEOUT,
};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// The accepted range of every duration flag: `(flag, min, max)`, inclusive.
/// Values outside cannot work (a TTL etcd refuses, a busy loop, an
/// `Instant` overflow) and stop start-up. README "Flags and ranges" lists them.
pub const DURATION_RANGES: &[(&str, Duration, Duration)] = &[
    ("--lease-duration", SEC, HOUR),
    ("--renew-interval", Duration::from_millis(100), HOUR),
    (
        "--retry-period",
        Duration::from_millis(10),
        Duration::from_secs(300),
    ),
    ("--drift-margin", Duration::ZERO, HOUR),
    ("--drain-timeout", Duration::ZERO, HOUR),
    ("--preempt-after", Duration::ZERO, DAY),
    ("--resign-cooldown", Duration::ZERO, DAY),
    (
        "--health-interval",
        Duration::from_millis(100),
        Duration::from_secs(600),
    ),
    ("--health-grace", Duration::ZERO, DAY),
    (
        "--completed-retention",
        SEC,
        Duration::from_secs(30 * 24 * 3600),
    ),
    ("--kill-grace", MS, HOUR),
    (
        "--header-read-timeout",
        Duration::from_millis(100),
        Duration::from_secs(300),
    ),
    (
        "--request-body-timeout",
        Duration::from_millis(100),
        Duration::from_secs(300),
    ),
];

/// Highest accepted `--max-connections`.
pub const MAX_CONNECTIONS_LIMIT: usize = 65536;
/// Highest accepted `--coord-max-waiters`.
pub const COORD_MAX_WAITERS_LIMIT: usize = 65536;

pub(crate) fn check_range(flag: &str, value: Duration) -> Result<(), ConfigError> {
    let Some(&(_, min, max)) = DURATION_RANGES.iter().find(|(f, ..)| *f == flag) else {
        return Ok(());
    };
    if value < min || value > max {
        return Err(config_error(format!(
            "{flag} ({}) must be between {} and {}\nhint: see the book's table of flags and ranges (Flags in detail, docs/src/configuration.md)",
            crate::flags::format_duration(value),
            if min.is_zero() {
                "0s".to_owned()
            } else {
                crate::flags::format_duration(min).to_string()
            },
            crate::flags::format_duration(max)
        )));
    }
    Ok(())
}

pub(crate) fn check_ranges(cli: &Cli) -> Result<(), ConfigError> {
    let given: [(&str, Option<Duration>); 13] = [
        ("--lease-duration", Some(cli.lease_duration)),
        ("--renew-interval", cli.renew_interval),
        ("--retry-period", Some(cli.retry_period)),
        ("--drift-margin", cli.drift_margin),
        ("--drain-timeout", cli.drain_timeout),
        ("--preempt-after", Some(cli.preempt_after)),
        ("--resign-cooldown", cli.resign_cooldown),
        ("--health-interval", Some(cli.health_interval)),
        ("--health-grace", cli.health_grace),
        ("--completed-retention", Some(cli.completed_retention)),
        ("--kill-grace", cli.kill_grace),
        ("--header-read-timeout", Some(cli.header_read_timeout)),
        ("--request-body-timeout", Some(cli.request_body_timeout)),
    ];
    for (flag, value) in given {
        if let Some(v) = value {
            check_range(flag, v)?;
        }
    }
    if cli.max_connections == 0 || cli.max_connections > MAX_CONNECTIONS_LIMIT {
        return Err(config_error(format!(
            "--max-connections ({}) must be between 1 and {MAX_CONNECTIONS_LIMIT}\nhint: each open connection holds about 21 KiB; the default is {DEFAULT_MAX_CONNECTIONS}",
            cli.max_connections
        )));
    }
    if cli.shards as usize > crate::shards::MAX_SHARDS {
        return Err(config_error(format!(
            "--shards ({}) must be between 1 and {}, or 0 for none\nhint: a shard is a hash range of the objects your app works on; a few per member is plenty",
            cli.shards,
            crate::shards::MAX_SHARDS
        )));
    }
    if cli.coord_max_waiters == 0 || cli.coord_max_waiters > COORD_MAX_WAITERS_LIMIT {
        return Err(config_error(format!(
            "--coord-max-waiters ({}) must be between 1 and {COORD_MAX_WAITERS_LIMIT}\nhint: beyond the cap an acquisition with a wait answers 429; the default is {}",
            cli.coord_max_waiters,
            crate::coord::DEFAULT_MAX_WAITERS
        )));
    }
    if cli.log_level.trim().is_empty() {
        return Err(config_error(
            "--log-level must not be empty\nhint: use e.g. info or leader_elector=debug",
        ));
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&cli.log_level) {
        return Err(config_error(format!(
            "--log-level ({}) is not a log filter: {e}\nhint: use e.g. info or leader_elector=debug",
            cli.log_level
        )));
    }
    Ok(())
}

/// Longest accepted election name, in bytes.
pub const MAX_ELECTION_LEN: usize = 128;

pub(crate) fn check_election(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(config_error(
            "--election must not be empty\nhint: name the singleton, e.g. --election billing-scheduler",
        ));
    }
    if name.len() > MAX_ELECTION_LEN
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(config_error(format!(
            "--election ({name}) may hold only letters, digits, '-', '_' and '.', at most {MAX_ELECTION_LEN} characters"
        )));
    }
    Ok(())
}
