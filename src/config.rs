//! Command line and environment (DESIGN.md, "CLI contract"): clap derive with
//! `env =` on every flag, and the cross-field validation that turns a [`Cli`]
//! into a checked [`Config`].
//!
//! Invariant: every value the rest of the program sees has been validated
//! here; a bad value is reported with the flag's name, what is allowed, and a
//! hint, and `main` exits with code 2.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use crate::backend::etcd::EtcdOptions;
use crate::backend::redis::{RedisOptions, check_url, redact};
use crate::elector::ElectorConfig;

/// leader-elector: one active replica at a time for a singleton workload.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "leader-elector",
    version,
    about,
    long_about = None,
    args_override_self = true,
    override_usage = "leader-elector [OPTIONS] --election <NAME> [--etcd-endpoints <URL> | --redis-url <URL>... | --backend kubernetes]\n       leader-elector run [OPTIONS] --election <NAME> ... -- COMMAND [ARGS]..."
)]
pub struct Cli {
    /// Name of the election; candidates with the same name compete for one leadership.
    #[arg(long, env = "LEADER_ELECTOR_ELECTION", value_name = "NAME")]
    pub election: String,

    /// Holder identity of this candidate [default: $POD_NAME, else the host name].
    #[arg(
        long,
        visible_alias = "id",
        env = "LEADER_ELECTOR_IDENTITY",
        value_name = "ID"
    )]
    pub identity: Option<String>,

    /// Which backend to campaign on; auto picks etcd when --etcd-endpoints is given, Redis when --redis-url is given, else a Kubernetes Lease.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "LEADER_ELECTOR_BACKEND"
    )]
    pub backend: BackendKind,

    /// etcd connection.
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Redis connection.
    #[command(flatten)]
    pub redis: RedisArgs,

    /// Kubernetes backend.
    #[command(flatten)]
    pub kubernetes: KubeArgs,

    /// Lease TTL: how long the backend keeps the key without a renewal (e.g. 15s).
    #[arg(long, visible_alias = "ttl", default_value = "15s", env = "LEADER_ELECTOR_LEASE_DURATION", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_duration: Duration,

    /// How often the leader renews its lease [default: a third of --lease-duration].
    #[arg(long, env = "LEADER_ELECTOR_RENEW_INTERVAL", value_parser = parse_duration, value_name = "DURATION")]
    pub renew_interval: Option<Duration>,

    /// Longest wait between attempts after a backend error (capped, jittered backoff).
    #[arg(long, default_value = "2s", env = "LEADER_ELECTOR_RETRY_PERIOD", value_parser = parse_duration, value_name = "DURATION")]
    pub retry_period: Duration,

    /// Safety margin subtracted from each lease's validity [default: max(1% of TTL, 2 x renew round trip, 50ms)].
    #[arg(long, env = "LEADER_ELECTOR_DRIFT_MARGIN", value_parser = parse_duration, value_name = "DURATION")]
    pub drift_margin: Option<Duration>,

    /// Address of the read-only HTTP API (/leader, /healthz, /readyz, /metrics).
    #[arg(long, visible_alias = "http", default_value = "0.0.0.0:4040", env = "LEADER_ELECTOR_HTTP_ADDR", value_parser = parse_addr, value_name = "HOST:PORT")]
    pub http_addr: SocketAddr,

    /// Address of the control API (POST /resign, /release; /locks, /semaphores, /jobs), loopback only; empty turns it off.
    #[arg(
        long,
        default_value = "127.0.0.1:4041",
        env = "LEADER_ELECTOR_CONTROL_ADDR",
        value_name = "HOST:PORT"
    )]
    pub control_addr: String,

    /// Connections each listener (--http-addr, --control-addr) serves at once; beyond it new connections get 503 (GET /healthz still 200) [range: 1-65536].
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, env = "LEADER_ELECTOR_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: usize,

    /// Acquisitions with a `wait` that may wait at once on this sidecar (locks, fair locks, semaphores); beyond it they get 429 [range: 1-65536].
    #[arg(long, default_value_t = crate::coord::DEFAULT_MAX_WAITERS, env = "LEADER_ELECTOR_COORD_MAX_WAITERS", value_name = "N")]
    pub coord_max_waiters: usize,

    /// Time a client has to send a request's headers; also how long an idle keep-alive connection stays open [range: 100ms-5m].
    #[arg(long, default_value = "10s", env = "LEADER_ELECTOR_HEADER_READ_TIMEOUT", value_parser = parse_duration, value_name = "DURATION")]
    pub header_read_timeout: Duration,

    /// Longest pause while a request body is being received; past it the request gets 400 [range: 100ms-5m].
    #[arg(long, default_value = "10s", env = "LEADER_ELECTOR_REQUEST_BODY_TIMEOUT", value_parser = parse_duration, value_name = "DURATION")]
    pub request_body_timeout: Duration,

    /// On SIGTERM, stop claiming at once but keep the lease until the app calls POST /release or this much time passes [default: release at once].
    #[arg(long, env = "LEADER_ELECTOR_DRAIN_TIMEOUT", value_parser = parse_duration, value_name = "DURATION")]
    pub drain_timeout: Option<Duration>,

    /// After POST /resign (or a resign caused by the app), stay out of campaigns this long [default: --lease-duration].
    #[arg(long, env = "LEADER_ELECTOR_RESIGN_COOLDOWN", value_parser = parse_duration, value_name = "DURATION")]
    pub resign_cooldown: Option<Duration>,

    /// Campaign only while this URL answers 2xx (http:// only; usually the app's readiness endpoint on localhost).
    #[arg(long, env = "LEADER_ELECTOR_CANDIDATE_HEALTH_URL", value_parser = parse_http_url, value_name = "URL")]
    pub candidate_health_url: Option<String>,

    /// A leader whose app stays unhealthy this long resigns [default: --lease-duration].
    #[arg(long, env = "LEADER_ELECTOR_HEALTH_GRACE", value_parser = parse_duration, value_name = "DURATION")]
    pub health_grace: Option<Duration>,

    /// How often to ask --candidate-health-url (also each request's timeout).
    #[arg(long, default_value = "1s", env = "LEADER_ELECTOR_HEALTH_INTERVAL", value_parser = parse_duration, value_name = "DURATION")]
    pub health_interval: Duration,

    /// POST a JSON event to this URL on each transition (http:// only), in order, with retries; never blocks the election.
    #[arg(long, env = "LEADER_ELECTOR_NOTIFY_URL", value_parser = parse_http_url, value_name = "URL")]
    pub notify_url: Option<String>,

    /// Label key set on this sidecar's own Pod: "true" while leading, "false" otherwise (needs POD_NAME and POD_NAMESPACE); empty turns it off.
    #[arg(long, default_value = crate::kube_label::DEFAULT_LABEL_KEY, env = "LEADER_ELECTOR_POD_LABEL_KEY", value_name = "KEY")]
    pub pod_label_key: String,

    /// Record a Kubernetes Event on this Pod for each transition (with --pod-label-key).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LEADER_ELECTOR_POD_EVENTS", value_name = "BOOL")]
    pub pod_events: bool,

    /// How long a completed job stays completed (job claims on the control API).
    #[arg(long, default_value = "24h", env = "LEADER_ELECTOR_COMPLETED_RETENTION", value_parser = parse_duration, value_name = "DURATION")]
    pub completed_retention: Duration,

    /// Run mode: time between SIGTERM and SIGKILL of the command, never past the validity deadline [default: min(5s, (TTL - renew interval) / 2)].
    #[arg(long, env = "LEADER_ELECTOR_KILL_GRACE", value_parser = parse_duration, value_name = "DURATION")]
    pub kill_grace: Option<Duration>,

    /// Run mode: what to do when the command exits on its own.
    #[arg(
        long,
        value_enum,
        default_value = "resign",
        env = "LEADER_ELECTOR_ON_CHILD_EXIT"
    )]
    pub on_child_exit: OnChildExit,

    /// Run mode (`leader-elector run [flags] -- COMMAND ARGS...`): the command to run only while leading.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,

    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "LEADER_ELECTOR_LOG_FORMAT"
    )]
    pub log_format: LogFormat,

    /// Log filter (tracing EnvFilter syntax), e.g. info or leader_elector=debug.
    #[arg(
        long,
        default_value = "info",
        env = "LEADER_ELECTOR_LOG_LEVEL",
        value_name = "FILTER"
    )]
    pub log_level: String,
}

/// The etcd flags.
#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// etcd client URLs, comma-separated (http://host:port or https://host:port).
    #[arg(
        long,
        env = "LEADER_ELECTOR_ETCD_ENDPOINTS",
        value_delimiter = ',',
        value_name = "URL[,URL...]"
    )]
    pub etcd_endpoints: Vec<String>,

    /// Key prefix; the election key is <prefix><election>.
    #[arg(
        long,
        default_value = "/leader-elector/",
        env = "LEADER_ELECTOR_ETCD_PREFIX",
        value_name = "PREFIX"
    )]
    pub etcd_prefix: String,

    /// PEM file of the CA that signed etcd's server certificates (turns on TLS; endpoints must be https://).
    #[arg(long, env = "LEADER_ELECTOR_ETCD_CA_FILE", value_name = "FILE")]
    pub etcd_ca_file: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --etcd-key-file).
    #[arg(long, env = "LEADER_ELECTOR_ETCD_CERT_FILE", value_name = "FILE")]
    pub etcd_cert_file: Option<PathBuf>,

    /// PEM private key of --etcd-cert-file.
    #[arg(long, env = "LEADER_ELECTOR_ETCD_KEY_FILE", value_name = "FILE")]
    pub etcd_key_file: Option<PathBuf>,

    /// etcd user name (etcd auth; with --etcd-password-file).
    #[arg(long, env = "LEADER_ELECTOR_ETCD_USERNAME", value_name = "USER")]
    pub etcd_username: Option<String>,

    /// File holding the etcd password (its first line), so it is not in the process list.
    #[arg(long, env = "LEADER_ELECTOR_ETCD_PASSWORD_FILE", value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

/// The Kubernetes Lease backend flags (the old `leader-elector` image's names).
#[derive(Args, Debug, Clone)]
pub struct KubeArgs {
    /// Namespace of the election Lease (--backend kubernetes) [default: $POD_NAMESPACE, else the kubeconfig's namespace].
    #[arg(
        long,
        env = "LEADER_ELECTOR_ELECTION_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub election_namespace: Option<String>,

    /// Accepted for compatibility with the old leader-elector image and ignored: the in-cluster config is used when present, else KUBECONFIG.
    #[arg(long, env = "LEADER_ELECTOR_USE_CLUSTER_CREDENTIALS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub use_cluster_credentials: Option<bool>,
}

/// The Redis flags.
#[derive(Args, Debug, Clone)]
pub struct RedisArgs {
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
}

/// Backend selection (`--backend`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// etcd when --etcd-endpoints is given, else Redis when --redis-url is given.
    Auto,
    /// etcd (--etcd-endpoints).
    Etcd,
    /// Redis (--redis-url), single instance or Redlock.
    Redis,
    /// A coordination.k8s.io/v1 Lease through the Kubernetes API (in-cluster config or KUBECONFIG).
    Kubernetes,
}

/// Log output format (`--log-format`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A configuration error: the flag at fault and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// The whole message, naming the flag and the fix.
    pub message: String,
}

fn config_error(message: impl Into<String>) -> ConfigError {
    ConfigError {
        message: message.into(),
    }
}

/// What to do when the child ends on its own (`--on-child-exit`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnChildExit {
    /// Give leadership up (and stay out for --resign-cooldown).
    Resign,
    /// Start the child again while still leading (with backoff).
    Restart,
    /// Resign and exit with the child's exit code.
    Exit,
}

/// Run-mode settings.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// Time between SIGTERM and SIGKILL, never past `valid_until`.
    pub kill_grace: Duration,
    /// What to do when the child exits on its own.
    pub on_child_exit: OnChildExit,
    /// Cooldown after a resign caused by the child's exit.
    pub resign_cooldown: Duration,
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Timing and identity of the Elector.
    pub elector: ElectorConfig,
    /// The backend to use, with its connection settings.
    pub backend: BackendConfig,
    /// Address of the read-only API.
    pub http_addr: SocketAddr,
    /// Address of the control API; `None` when turned off.
    pub control_addr: Option<SocketAddr>,
    /// Connection cap and timeouts of each listener.
    pub limits: crate::serve::Limits,
    /// Default cooldown after a resign.
    pub resign_cooldown: Duration,
    /// Health-gated candidacy: URL and poll interval.
    pub candidate_health: Option<(String, Duration)>,
    /// Transition notifications.
    pub notify_url: Option<String>,
    /// Run mode.
    pub run: Option<RunOptions>,
    /// How long completed jobs are remembered.
    pub completed_retention: Duration,
    /// How many coordination acquisitions may wait at once (`--coord-max-waiters`).
    pub coord_max_waiters: usize,
    /// Pod labelling: `None` when off (empty key, or not in a Pod).
    pub labeler: Option<crate::kube_label::LabelerConfig>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
}

/// The chosen backend, decided once at start-up.
#[derive(Debug, Clone)]
pub enum BackendConfig {
    /// etcd: the election key and how to connect.
    Etcd {
        /// `<prefix><election>`.
        key: String,
        /// The key prefix (coordination keys live under `<prefix>_coord/`).
        prefix: String,
        /// Connection settings.
        options: EtcdOptions,
    },
    /// Redis: one server, or Redlock across several.
    Redis {
        /// Key prefix.
        prefix: String,
        /// Election name.
        election: String,
        /// Connection settings.
        options: RedisOptions,
    },
    /// Kubernetes: a Lease named after the election.
    Kubernetes {
        /// The Lease name (the election name).
        name: String,
        /// Namespace and connection settings.
        options: crate::backend::kubernetes::KubeOptions,
    },
}

/// Parse a humantime duration (`15s`, `500ms`, `1m30s`).
///
/// # Errors
/// A message with the value and an example.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}; use a duration such as 15s, 500ms or 1m30s"))
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

fn read_file(flag: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| {
        config_error(format!(
            "{flag} ({}) cannot be read: {e}\nhint: give the path of a readable file",
            path.display()
        ))
    })
}

/// The default identity: `POD_NAME`, else the host name.
fn default_identity() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| gethostname::gethostname().into_string().ok())
        .filter(|s| !s.trim().is_empty())
}

/// Default of `--max-connections`: a sidecar's clients are its app (a few
/// long-polls), the kubelet and Prometheus; 256 leaves ample room and holds
/// about 6 MiB of connection state at the cap (about 21 KiB each, measured
/// by `benches/longpoll_memory.rs`), far inside the chart's 64 Mi limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default of `--header-read-timeout`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--request-body-timeout`.
pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(10);

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

fn check_range(flag: &str, value: Duration) -> Result<(), ConfigError> {
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

fn check_ranges(cli: &Cli) -> Result<(), ConfigError> {
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
fn check_pem(flag: &str, path: &Path, pem: &[u8], label: &str) -> Result<(), ConfigError> {
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

fn check_election(name: &str) -> Result<(), ConfigError> {
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

/// Per-server timeout of a Redlock group: short against the TTL (the spec's
/// example is 5–50 ms for a 10 s TTL), but not so short that a busy loopback
/// server misses it.
pub fn redlock_server_timeout(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

fn redis_backend(cli: &Cli, elector: &ElectorConfig) -> Result<BackendConfig, ConfigError> {
    let r = &cli.redis;
    if r.redis_url.is_empty() {
        return Err(config_error(
            "--redis-url is required with --backend redis\nhint: e.g. --redis-url redis://127.0.0.1:6379",
        ));
    }
    for url in &r.redis_url {
        check_url(url).map_err(|e| config_error(format!("--redis-url: {e}")))?;
    }
    let n = r.redis_url.len();
    let password = r
        .redis_password_file
        .as_deref()
        .map(|p| {
            let raw = read_file("--redis-password-file", p)?;
            let text = String::from_utf8(raw)
                .map_err(|_| config_error("--redis-password-file must hold UTF-8 text"))?;
            let pw = text.lines().next().unwrap_or("").to_owned();
            if pw.is_empty() {
                return Err(config_error(format!(
                    "--redis-password-file ({}) is empty",
                    p.display()
                )));
            }
            Ok(pw)
        })
        .transpose()?;
    let ca_pem = r
        .redis_ca_file
        .as_deref()
        .map(|p| {
            let pem = read_file("--redis-ca-file", p)?;
            check_pem("--redis-ca-file", p, &pem, "CERTIFICATE")?;
            Ok::<_, ConfigError>(pem)
        })
        .transpose()?;
    if ca_pem.is_some() && !r.redis_url.iter().any(|u| u.starts_with("rediss://")) {
        return Err(config_error(
            "--redis-ca-file needs rediss:// URLs in --redis-url",
        ));
    }
    let per_server_timeout = if n == 1 {
        elector.call_timeout()
    } else {
        redlock_server_timeout(elector.lease_duration).min(elector.call_timeout())
    };
    tracing::debug!(urls = ?r.redis_url.iter().map(|u| redact(u)).collect::<Vec<_>>(), "redis backend");
    Ok(BackendConfig::Redis {
        prefix: r.redis_prefix.clone(),
        election: cli.election.clone(),
        options: RedisOptions {
            urls: r.redis_url.clone(),
            password,
            ca_pem,
            per_server_timeout,
        },
    })
}

/// A Lease name must be a DNS subdomain name (RFC 1123): lowercase letters,
/// digits, '-' and '.', starting and ending alphanumeric, at most 253.
fn check_lease_name(name: &str) -> Result<(), ConfigError> {
    let ok = name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(config_error(format!(
            "--election ({name}) must be a lowercase DNS subdomain name with --backend kubernetes (the Lease is named after it): letters a-z, digits, '-' and '.', starting and ending with a letter or digit"
        )))
    }
}

/// Whether a Kubernetes client configuration can exist: in a Pod (the
/// service host variables), or a kubeconfig (`KUBECONFIG`, `~/.kube/config`).
fn kube_config_present() -> bool {
    #[cfg(test)]
    if let Some(v) = tests::KUBE_PRESENT.with(|c| c.get()) {
        return v;
    }
    let env = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    (env("KUBERNETES_SERVICE_HOST") && env("KUBERNETES_SERVICE_PORT"))
        || env("KUBECONFIG")
        || std::env::var_os("HOME")
            .is_some_and(|h| Path::new(&h).join(".kube").join("config").is_file())
}

fn kube_backend(cli: &Cli, chosen_by_auto: bool) -> Result<BackendConfig, ConfigError> {
    if !kube_config_present() {
        return Err(config_error(if chosen_by_auto {
            "no backend is configured: give --etcd-endpoints (e.g. http://127.0.0.1:2379) or --redis-url (e.g. redis://127.0.0.1:6379), or run in a Kubernetes Pod (or set KUBECONFIG) to elect through a Lease"
        } else {
            "--backend kubernetes needs a Kubernetes client configuration: run in a Pod with a ServiceAccount, or set KUBECONFIG"
        }));
    }
    check_lease_name(&cli.election)?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let namespace = match cli.kubernetes.election_namespace.as_deref().map(str::trim) {
        Some("") => {
            return Err(config_error(
                "--election-namespace must not be empty\nhint: leave it out to use $POD_NAMESPACE or the kubeconfig's namespace",
            ));
        }
        Some(ns) => Some(ns.to_owned()),
        None => env("POD_NAMESPACE"),
    };
    if let Some(ns) = &namespace
        && (ns.len() > 63
            || !ns
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            || ns.starts_with('-')
            || ns.ends_with('-'))
    {
        return Err(config_error(format!(
            "--election-namespace ({ns}) is not a namespace name: at most 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit"
        )));
    }
    Ok(BackendConfig::Kubernetes {
        name: cli.election.clone(),
        options: crate::backend::kubernetes::KubeOptions { namespace },
    })
}

fn labeler_config(cli: &Cli) -> Result<Option<crate::kube_label::LabelerConfig>, ConfigError> {
    let key = cli.pod_label_key.trim();
    if key.is_empty() {
        return Ok(None);
    }
    crate::kube_label::check_label_key(key)
        .map_err(|e| config_error(format!("--pod-label-key: {e}")))?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    match (env("POD_NAME"), env("POD_NAMESPACE")) {
        (Some(pod), Some(namespace)) => Ok(Some(crate::kube_label::LabelerConfig {
            key: key.to_owned(),
            pod,
            namespace,
            events: cli.pod_events,
        })),
        // Not in a Pod (or no Downward API): nothing to label; app::run says so.
        _ => Ok(None),
    }
}

impl Config {
    /// Validate `cli` and read the files it names.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag at fault and the fix.
    pub fn from_cli(cli: Cli) -> Result<Config, ConfigError> {
        Self::from_cli_mode(cli, false)
    }

    /// Validate `cli` for the plain sidecar (`run_mode == false`) or for
    /// `leader-elector run` (which needs a command after `--`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag at fault and the fix.
    pub fn from_cli_mode(cli: Cli, run_mode: bool) -> Result<Config, ConfigError> {
        check_election(&cli.election)?;
        check_ranges(&cli)?;
        let identity = match cli.identity.clone() {
            Some(id) if id.trim().is_empty() => {
                return Err(config_error(
                    "--identity must not be empty\nhint: leave it out to use $POD_NAME or the host name",
                ));
            }
            Some(id) => id,
            None => default_identity().ok_or_else(|| {
                config_error("--identity is not set and neither $POD_NAME nor the host name is available\nhint: pass --identity")
            })?,
        };
        if cli.lease_duration < Duration::from_secs(1) {
            return Err(config_error(format!(
                "--lease-duration ({}) must be at least 1s",
                humantime::format_duration(cli.lease_duration)
            )));
        }
        let renew_interval = cli.renew_interval.unwrap_or(cli.lease_duration / 3);
        if cli.retry_period.is_zero() {
            return Err(config_error("--retry-period must be greater than 0"));
        }
        let resign_cooldown = cli.resign_cooldown.unwrap_or(cli.lease_duration);
        let health_grace = cli.health_grace.unwrap_or(cli.lease_duration);
        if cli.health_interval.is_zero() {
            return Err(config_error("--health-interval must be greater than 0"));
        }
        let kill_grace = cli.kill_grace.unwrap_or_else(|| {
            (cli.lease_duration.saturating_sub(renew_interval) / 2).min(Duration::from_secs(5))
        });
        let run = match (run_mode, cli.command.is_empty()) {
            (true, true) => {
                return Err(config_error(
                    "run needs a command after --\nhint: leader-elector run --election NAME ... -- /usr/bin/my-singleton --flag",
                ));
            }
            (false, false) => {
                return Err(config_error(format!(
                    "a command after -- ({}) needs run mode\nhint: leader-elector run [flags] -- COMMAND ARGS...",
                    cli.command.join(" ")
                )));
            }
            (false, true) => None,
            (true, false) => {
                if kill_grace.is_zero() || kill_grace + renew_interval >= cli.lease_duration {
                    return Err(config_error(format!(
                        "--kill-grace ({}) plus --renew-interval ({}) must be shorter than --lease-duration ({})\nhint: the command is stopped kill-grace before the validity deadline when renewals fail",
                        humantime::format_duration(kill_grace),
                        humantime::format_duration(renew_interval),
                        humantime::format_duration(cli.lease_duration)
                    )));
                }
                Some(RunOptions {
                    command: cli.command.clone(),
                    kill_grace,
                    on_child_exit: cli.on_child_exit,
                    resign_cooldown,
                })
            }
        };
        // Run mode keeps the lease until the child is gone.
        let drain_timeout = match (&run, cli.drain_timeout) {
            (Some(r), d) => Some(
                d.unwrap_or_default()
                    .max(r.kill_grace + Duration::from_secs(1)),
            ),
            (None, d) => d.filter(|d| !d.is_zero()),
        };
        let control_addr = match cli.control_addr.trim() {
            "" => None,
            text => {
                let addr =
                    parse_addr(text).map_err(|e| config_error(format!("--control-addr: {e}")))?;
                if !addr.ip().is_loopback() {
                    return Err(config_error(format!(
                        "--control-addr ({addr}) must be a loopback address: the control API changes state\nhint: use 127.0.0.1:4041, or an empty value to turn it off"
                    )));
                }
                Some(addr)
            }
        };
        if drain_timeout.is_some() && run.is_none() && control_addr.is_none() {
            return Err(config_error(
                "--drain-timeout needs the control API (--control-addr) so the app can POST /release",
            ));
        }
        let elector = ElectorConfig {
            election: cli.election.clone(),
            identity,
            lease_duration: cli.lease_duration,
            renew_interval,
            retry_period: cli.retry_period,
            drift_margin: cli.drift_margin,
            drain_timeout,
            health_grace,
            release_wait: run
                .as_ref()
                .map(|r| r.kill_grace + Duration::from_millis(100)),
        };
        elector.validate().map_err(config_error)?;

        let kind = match cli.backend {
            BackendKind::Auto => {
                match (
                    cli.etcd.etcd_endpoints.is_empty(),
                    cli.redis.redis_url.is_empty(),
                ) {
                    (false, false) => {
                        return Err(config_error(
                            "both --etcd-endpoints and --redis-url are given: choose one with --backend etcd or --backend redis\nhint: the backend is fixed at start-up; two backends at once could elect two leaders",
                        ));
                    }
                    (false, true) => BackendKind::Etcd,
                    (true, false) => BackendKind::Redis,
                    // Neither: the API server every Kubernetes Pod already has.
                    (true, true) => BackendKind::Kubernetes,
                }
            }
            k => k,
        };
        let backend = match kind {
            BackendKind::Redis => redis_backend(&cli, &elector)?,
            BackendKind::Kubernetes => {
                kube_backend(&cli, matches!(cli.backend, BackendKind::Auto))?
            }
            BackendKind::Auto | BackendKind::Etcd => {
                let e = &cli.etcd;
                if e.etcd_endpoints.is_empty() {
                    return Err(config_error(
                        "--etcd-endpoints is required: no backend is configured\nhint: e.g. --etcd-endpoints http://127.0.0.1:2379",
                    ));
                }
                let endpoints = e
                    .etcd_endpoints
                    .iter()
                    .map(|ep| parse_endpoint(ep))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|m| config_error(format!("--etcd-endpoints: {m}")))?;
                let tls = e.etcd_ca_file.is_some();
                for ep in &endpoints {
                    if tls && ep.starts_with("http://") {
                        return Err(config_error(format!(
                            "--etcd-endpoints ({ep}) must use https:// when --etcd-ca-file is given"
                        )));
                    }
                    if !tls && ep.starts_with("https://") {
                        return Err(config_error(format!(
                            "--etcd-endpoints ({ep}) uses https:// but --etcd-ca-file is not set\nhint: pass the CA that signed etcd's certificate with --etcd-ca-file"
                        )));
                    }
                }
                let ca_pem = e
                    .etcd_ca_file
                    .as_deref()
                    .map(|p| {
                        let pem = read_file("--etcd-ca-file", p)?;
                        check_pem("--etcd-ca-file", p, &pem, "CERTIFICATE")?;
                        Ok::<_, ConfigError>(pem)
                    })
                    .transpose()?;
                let client_cert_pem = match (&e.etcd_cert_file, &e.etcd_key_file) {
                    (None, None) => None,
                    (Some(c), Some(k)) => {
                        if !tls {
                            return Err(config_error(
                                "--etcd-cert-file needs --etcd-ca-file (client certificates are sent over TLS)",
                            ));
                        }
                        let cert = read_file("--etcd-cert-file", c)?;
                        check_pem("--etcd-cert-file", c, &cert, "CERTIFICATE")?;
                        let key = read_file("--etcd-key-file", k)?;
                        check_pem("--etcd-key-file", k, &key, "PRIVATE KEY")?;
                        Some((cert, key))
                    }
                    (Some(_), None) => {
                        return Err(config_error(
                            "--etcd-cert-file needs --etcd-key-file (the certificate's private key)",
                        ));
                    }
                    (None, Some(_)) => {
                        return Err(config_error(
                            "--etcd-key-file needs --etcd-cert-file (the client certificate)",
                        ));
                    }
                };
                let credentials = match (&e.etcd_username, &e.etcd_password_file) {
                    (None, None) => None,
                    (Some(user), _) if user.trim().is_empty() => {
                        return Err(config_error(
                            "--etcd-username must not be empty\nhint: leave out --etcd-username and --etcd-password-file when etcd has no auth",
                        ));
                    }
                    (Some(user), Some(file)) => {
                        let raw = read_file("--etcd-password-file", file)?;
                        let text = String::from_utf8(raw).map_err(|_| {
                            config_error("--etcd-password-file must hold UTF-8 text")
                        })?;
                        let password = text.lines().next().unwrap_or("").to_owned();
                        if password.is_empty() {
                            return Err(config_error(format!(
                                "--etcd-password-file ({}) is empty",
                                file.display()
                            )));
                        }
                        Some((user.clone(), password))
                    }
                    (Some(_), None) => {
                        return Err(config_error(
                            "--etcd-username needs --etcd-password-file (a file holding the password)",
                        ));
                    }
                    (None, Some(_)) => {
                        return Err(config_error("--etcd-password-file needs --etcd-username"));
                    }
                };
                BackendConfig::Etcd {
                    key: format!("{}{}", e.etcd_prefix, cli.election),
                    prefix: e.etcd_prefix.clone(),
                    options: EtcdOptions {
                        endpoints,
                        ca_pem,
                        client_cert_pem,
                        credentials,
                        connect_timeout: elector.call_timeout(),
                        keepalive_interval: ETCD_KEEPALIVE_INTERVAL,
                    },
                }
            }
        };
        Ok(Config {
            elector,
            backend,
            http_addr: cli.http_addr,
            control_addr,
            limits: crate::serve::Limits {
                max_connections: cli.max_connections,
                header_read_timeout: cli.header_read_timeout,
                body_timeout: cli.request_body_timeout,
            },
            resign_cooldown,
            candidate_health: cli
                .candidate_health_url
                .clone()
                .map(|u| (u, cli.health_interval)),
            notify_url: cli.notify_url.clone(),
            labeler: labeler_config(&cli)?,
            completed_retention: cli.completed_retention,
            coord_max_waiters: cli.coord_max_waiters,
            run,
            log_format: cli.log_format,
            log_level: cli.log_level,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Result<Config, String> {
        let mut full = vec!["leader-elector"];
        full.extend_from_slice(args);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        Config::from_cli(cli).map_err(|e| e.to_string())
    }

    const EP: &str = "--etcd-endpoints=http://127.0.0.1:2379";

    #[test]
    fn defaults_follow_the_design() {
        let c = cli(&["--election", "a", "--identity", "me", EP]).unwrap();
        assert_eq!(c.elector.lease_duration, Duration::from_secs(15));
        assert_eq!(c.elector.renew_interval, Duration::from_secs(5));
        assert_eq!(c.elector.retry_period, Duration::from_secs(2));
        assert_eq!(c.http_addr, "0.0.0.0:4040".parse().unwrap());
        let BackendConfig::Etcd { key, .. } = c.backend else {
            panic!("etcd expected")
        };
        assert_eq!(key, "/leader-elector/a");
    }

    #[test]
    fn old_sidecar_aliases_are_accepted() {
        let c = cli(&["--election=a", "--id=me", "--ttl=10s", "--http=:4041", EP]).unwrap();
        assert_eq!(c.elector.identity, "me");
        assert_eq!(c.elector.lease_duration, Duration::from_secs(10));
        assert_eq!(c.http_addr, "0.0.0.0:4041".parse().unwrap());
    }

    #[test]
    fn renew_interval_must_be_shorter_than_the_ttl() {
        let e = cli(&[
            "--election=a",
            "--id=me",
            "--lease-duration=15s",
            "--renew-interval=20s",
            EP,
        ])
        .unwrap_err();
        assert!(
            e.contains("--renew-interval (20s) must be shorter than --lease-duration (15s)"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        let e = cli(&["--election=a", "--id=me", "--lease-duration=fast", EP]).unwrap_err();
        assert!(e.contains("--lease-duration"), "{e}");
        let e = cli(&["--election=", "--id=me", EP]).unwrap_err();
        assert!(e.contains("--election"), "{e}");
        let e = cli(&["--election=a", "--id=me", "--etcd-endpoints=127.0.0.1:2379"]).unwrap_err();
        assert!(e.contains("--etcd-endpoints"), "{e}");
        let e = cli(&[
            "--election=a",
            "--id=me",
            "--etcd-endpoints=http://h:1/path",
        ])
        .unwrap_err();
        assert!(e.contains("--etcd-endpoints"), "{e}");
        let e = cli(&["--election=a", "--id=me", "--backend=etcd"]).unwrap_err();
        assert!(e.contains("--etcd-endpoints is required"), "{e}");
        let e = cli(&["--election=a b", "--id=me", EP]).unwrap_err();
        assert!(e.contains("--election (a b)"), "{e}");
    }

    #[test]
    fn tls_flags_are_checked_together() {
        let e = cli(&["--election=a", "--id=me", "--etcd-endpoints=https://h:2379"]).unwrap_err();
        assert!(e.contains("--etcd-ca-file"), "{e}");
        let e = cli(&["--election=a", "--id=me", EP, "--etcd-username=u"]).unwrap_err();
        assert!(e.contains("--etcd-password-file"), "{e}");
        let e = cli(&[
            "--election=a",
            "--id=me",
            "--etcd-endpoints=https://h:2379",
            "--etcd-ca-file=/nonexistent",
        ])
        .unwrap_err();
        assert!(
            e.contains("--etcd-ca-file (/nonexistent) cannot be read"),
            "{e}"
        );
    }

    #[test]
    fn several_endpoints_split_on_commas() {
        let c = cli(&[
            "--election=a",
            "--id=me",
            "--etcd-endpoints=http://a:1,http://b:2",
        ])
        .unwrap();
        let BackendConfig::Etcd { options, .. } = c.backend else {
            panic!("etcd expected")
        };
        assert_eq!(options.endpoints, vec!["http://a:1", "http://b:2"]);
    }

    #[test]
    fn backend_choice_is_explicit_when_both_are_given() {
        let e = cli(&["--election=a", "--id=me", EP, "--redis-url=redis://h:1"]).unwrap_err();
        assert!(e.contains("--backend etcd or --backend redis"), "{e}");
        let c = cli(&[
            "--election=a",
            "--id=me",
            EP,
            "--redis-url=redis://h:1",
            "--backend=redis",
        ])
        .unwrap();
        assert!(matches!(c.backend, BackendConfig::Redis { .. }));
        let c = cli(&["--election=a", "--id=me", "--redis-url=redis://h:1"]).unwrap();
        assert!(matches!(c.backend, BackendConfig::Redis { .. }));
        let e = cli(&["--election=a", "--id=me", "--backend=redis", EP]).unwrap_err();
        assert!(e.contains("--redis-url is required"), "{e}");
    }

    #[test]
    fn redis_urls_repeat_or_split_on_commas_and_are_checked() {
        let c = cli(&[
            "--election=a",
            "--id=me",
            "--redis-url=redis://h:1",
            "--redis-url=redis://h:2,redis://h:3",
        ])
        .unwrap();
        let BackendConfig::Redis { options, .. } = c.backend else {
            panic!("redis expected")
        };
        assert_eq!(options.urls.len(), 3);
        assert_eq!(options.per_server_timeout, Duration::from_millis(500));
        let e = cli(&["--election=a", "--id=me", "--redis-url=http://u:secret@h:1"]).unwrap_err();
        assert!(e.contains("--redis-url") && !e.contains("secret"), "{e}");
    }

    thread_local! {
        /// Overrides the kubeconfig/in-cluster detection in this thread.
        pub(super) static KUBE_PRESENT: std::cell::Cell<Option<bool>> =
            const { std::cell::Cell::new(None) };
    }

    #[test]
    fn auto_without_any_backend_or_kubernetes_config_is_a_usage_error() {
        KUBE_PRESENT.with(|c| c.set(Some(false)));
        let e = cli(&["--election=a", "--id=me"]).unwrap_err();
        assert!(e.contains("no backend is configured"), "{e}");
        assert!(e.contains("KUBECONFIG"), "{e}");
        let e = cli(&["--election=a", "--id=me", "--backend=kubernetes"]).unwrap_err();
        assert!(e.contains("needs a Kubernetes client configuration"), "{e}");
    }

    #[test]
    fn auto_without_etcd_or_redis_is_the_kubernetes_lease() {
        KUBE_PRESENT.with(|c| c.set(Some(true)));
        let c = cli(&[
            "--election=my-app",
            "--id=me",
            "--election-namespace=team-a",
            "--use-cluster-credentials",
        ])
        .unwrap();
        let BackendConfig::Kubernetes { name, options } = c.backend else {
            panic!("kubernetes expected")
        };
        assert_eq!(name, "my-app");
        assert_eq!(options.namespace.as_deref(), Some("team-a"));
        // The old image's flag spelled with a value is accepted too.
        let c = cli(&[
            "--election=my-app",
            "--id=me",
            "--backend=kubernetes",
            "--use-cluster-credentials=false",
        ])
        .unwrap();
        assert!(matches!(c.backend, BackendConfig::Kubernetes { .. }));
        // A given endpoint still picks its backend.
        let c = cli(&["--election=my-app", "--id=me", EP]).unwrap();
        assert!(matches!(c.backend, BackendConfig::Etcd { .. }));
    }

    #[test]
    fn kubernetes_names_are_checked() {
        KUBE_PRESENT.with(|c| c.set(Some(true)));
        let e = cli(&["--election=My_App", "--id=me", "--backend=kubernetes"]).unwrap_err();
        assert!(e.contains("DNS subdomain"), "{e}");
        let e = cli(&[
            "--election=a",
            "--id=me",
            "--backend=kubernetes",
            "--election-namespace=Bad_NS",
        ])
        .unwrap_err();
        assert!(e.contains("--election-namespace (Bad_NS)"), "{e}");
    }

    /// Issue 13: every setting that cannot work stops start-up, naming the flag.
    #[test]
    fn unworkable_values_are_refused_naming_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--lease-duration=1000y"],
                "--lease-duration (1000years) must be between 1s and 1h",
            ),
            (
                &["--renew-interval=1ms"],
                "--renew-interval (1ms) must be between 100ms and 1h",
            ),
            (&["--completed-retention=1000y"], "--completed-retention"),
            (&["--health-interval=1ns"], "--health-interval (1ns)"),
            (&["--drain-timeout=100y"], "--drain-timeout"),
            (&["--resign-cooldown=100y"], "--resign-cooldown"),
            (&["--retry-period=100y"], "--retry-period"),
            (&["--health-grace=100y"], "--health-grace"),
            (&["--header-read-timeout=0s"], "--header-read-timeout"),
            (&["--request-body-timeout=1h"], "--request-body-timeout"),
            (&["--max-connections=0"], "--max-connections (0)"),
            (
                &["--coord-max-waiters=0"],
                "--coord-max-waiters (0) must be between 1 and 65536",
            ),
            (
                &["--coord-max-waiters=65537"],
                "--coord-max-waiters (65537)",
            ),
            (&["--log-level="], "--log-level must not be empty"),
            (&["--log-level=info,[bad"], "--log-level"),
            (
                &["--etcd-username=", "--etcd-password-file=/dev/null"],
                "--etcd-username must not be empty",
            ),
        ];
        for (extra, want) in cases {
            let mut args = vec!["--election=a", "--id=me", EP];
            args.extend_from_slice(extra);
            let e = cli(&args).expect_err(want);
            assert!(e.contains(want), "{extra:?}: {e}");
        }
    }

    #[test]
    fn etcd_endpoints_with_port_0_or_credentials_are_refused_without_echoing_the_secret() {
        let e = cli(&["--election=a", "--id=me", "--etcd-endpoints=http://h:0"]).unwrap_err();
        assert!(
            e.contains("--etcd-endpoints") && e.contains("port 0"),
            "{e}"
        );
        let e = cli(&[
            "--election=a",
            "--id=me",
            "--etcd-endpoints=http://user:secret@h:2379",
        ])
        .unwrap_err();
        assert!(
            e.contains("--etcd-endpoints") && e.contains("--etcd-username"),
            "{e}"
        );
        assert!(
            e.contains("--etcd-password-file") && !e.contains("secret"),
            "{e}"
        );
        let e = cli(&[
            "--election=a",
            "--id=me",
            "--redis-url=redis+unix:///run/r.sock?pass=secret",
        ])
        .unwrap_err();
        assert!(e.contains("--redis-url") && !e.contains("secret"), "{e}");
    }

    #[test]
    fn an_empty_or_non_pem_ca_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        for (file, want) in [(&empty, "is empty"), (&junk, "holds no PEM CERTIFICATE")] {
            let ca = format!("--etcd-ca-file={}", file.display());
            let e = cli(&[
                "--election=a",
                "--id=me",
                "--etcd-endpoints=https://h:2379",
                &ca,
            ])
            .unwrap_err();
            assert!(e.contains("--etcd-ca-file") && e.contains(want), "{e}");
        }
    }

    #[test]
    fn listener_limits_default_and_parse() {
        let c = cli(&["--election=a", "--id=me", EP]).unwrap();
        assert_eq!(c.limits, crate::serve::Limits::default());
        let c = cli(&[
            "--election=a",
            "--id=me",
            EP,
            "--max-connections=10",
            "--header-read-timeout=2s",
            "--request-body-timeout=3s",
        ])
        .unwrap();
        assert_eq!(c.limits.max_connections, 10);
        assert_eq!(c.limits.header_read_timeout, Duration::from_secs(2));
        assert_eq!(c.limits.body_timeout, Duration::from_secs(3));
    }

    #[test]
    fn coord_max_waiters_defaults_parses_and_is_refused_outside_its_range() {
        let c = cli(&["--election=a", "--id=me", EP]).unwrap();
        assert_eq!(c.coord_max_waiters, crate::coord::DEFAULT_MAX_WAITERS);
        let c = cli(&["--election=a", "--id=me", EP, "--coord-max-waiters=1"]).unwrap();
        assert_eq!(c.coord_max_waiters, 1);
        let c = cli(&["--election=a", "--id=me", EP, "--coord-max-waiters=65536"]).unwrap();
        assert_eq!(c.coord_max_waiters, 65536);
        for bad in ["0", "65537", "-1", "lots"] {
            let flag = format!("--coord-max-waiters={bad}");
            let e = cli(&["--election=a", "--id=me", EP, &flag]).unwrap_err();
            assert!(e.contains("--coord-max-waiters"), "{bad}: {e}");
        }
    }
}
