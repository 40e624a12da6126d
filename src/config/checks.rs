//! Value parsers used by clap, the limits every duration and count must
//! respect, and the checks of single values (files, PEM, election names).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use super::{Cli, ConfigError, config_error};
use crate::backend::redis::redact;

/// Parse a humantime duration (`15s`, `500ms`, `1m30s`).
///
/// # Errors
/// A message with the value and an example.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}; use a duration such as 15s, 500ms or 1m30s"))
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

/// Check one etcd endpoint: `http://host:port` or `https://host:port`, with
/// a port other than 0 and no credentials. Messages show the value redacted.
/// (Checked after parsing, not by clap, which would echo the raw value.)
///
/// # Errors
/// A message with the redacted value and an example.
pub fn parse_endpoint(s: &str) -> Result<String, String> {
    let s = s.trim();
    let shown = redact(s);
    let uri: axum::http::Uri = s.parse().map_err(|_| {
        format!("{shown} is not a URL; use http://HOST:PORT, e.g. http://127.0.0.1:2379")
    })?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => {
            return Err(format!(
                "{shown} needs the scheme http:// or https://, e.g. http://127.0.0.1:2379"
            ));
        }
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(format!(
            "{shown} carries credentials, which are not used\nhint: remove them from the URL and pass --etcd-username with --etcd-password-file"
        ));
    }
    let port = uri.authority().and_then(|a| a.port_u16());
    if port.is_none() || !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!(
            "{shown} must be http(s)://HOST:PORT with a port and no path, e.g. http://127.0.0.1:2379"
        ));
    }
    if port == Some(0) {
        return Err(format!(
            "{shown} has port 0, which cannot be dialled; give etcd's client port, e.g. http://127.0.0.1:2379"
        ));
    }
    Ok(s.trim_end_matches('/').to_owned())
}

pub(crate) fn read_file(flag: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| {
        config_error(format!(
            "{flag} ({}) cannot be read: {e}\nhint: give the path of a readable file",
            path.display()
        ))
    })
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
            "{flag} ({}) must be between {} and {}\nhint: see the README's table of flags and ranges",
            humantime::format_duration(value),
            if min.is_zero() {
                "0s".to_owned()
            } else {
                humantime::format_duration(min).to_string()
            },
            humantime::format_duration(max)
        )));
    }
    Ok(())
}

pub(crate) fn check_ranges(cli: &Cli) -> Result<(), ConfigError> {
    let given: [(&str, Option<Duration>); 12] = [
        ("--lease-duration", Some(cli.lease_duration)),
        ("--renew-interval", cli.renew_interval),
        ("--retry-period", Some(cli.retry_period)),
        ("--drift-margin", cli.drift_margin),
        ("--drain-timeout", cli.drain_timeout),
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

/// Check that `pem` holds a PEM block with `label` in its `BEGIN` line
/// (`CERTIFICATE`, `PRIVATE KEY`).
pub(crate) fn check_pem(
    flag: &str,
    path: &Path,
    pem: &[u8],
    label: &str,
) -> Result<(), ConfigError> {
    let text = String::from_utf8_lossy(pem);
    let found = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.contains(label));
    if !found {
        let what = if pem.iter().all(u8::is_ascii_whitespace) {
            "is empty".to_owned()
        } else {
            format!("holds no PEM {label}")
        };
        return Err(config_error(format!(
            "{flag} ({}) {what}\nhint: give a PEM file starting with -----BEGIN {label}-----",
            path.display()
        )));
    }
    Ok(())
}

/// HTTP/2 keep-alive ping interval towards etcd. etcd closes connections that
/// ping more often than `--grpc-keepalive-min-time` (default 5 s) with
/// GOAWAY `too_many_pings`, which would break every watch; 10 s stays clear.
pub const ETCD_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

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
