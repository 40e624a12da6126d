//! The flags and environment variables (clap derive, `env =` on every flag),
//! grouped by concern: the top-level [`Cli`], the backend group it flattens
//! ([`BackendArgs`], from the backend registry), and the run-mode settings.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use crate::backend::registry::BackendArgs;

use super::{DEFAULT_MAX_CONNECTIONS, parse_addr, parse_duration, parse_http_url};

/// leader-elector: one active replica at a time for a singleton workload.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "leader-elector",
    version,
    about,
    long_about = None,
    args_override_self = true
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

    /// The backend and its connection flags.
    #[command(flatten)]
    pub store: BackendArgs,

    /// The failsafe flags.
    #[command(flatten)]
    pub failsafe: super::failsafe::FailsafeArgs,

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

    /// Address of the control API (POST /resign, /release, /locks...), loopback only; empty: off.
    ///
    /// Address of the control API (POST /resign, /release; /locks, /semaphores, /jobs), loopback only; empty turns it off.
    #[arg(
        long,
        default_value = "127.0.0.1:4041",
        env = "LEADER_ELECTOR_CONTROL_ADDR",
        value_name = "HOST:PORT"
    )]
    pub control_addr: String,

    /// Connections each listener (--http-addr, --control-addr) serves at once; beyond it new connections get 503 (GET /healthz still 200) [range: 1-65536].
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, env = "LEADER_ELECTOR_MAX_CONNECTIONS", value_parser = crate::flags::parse_usize, allow_negative_numbers = true, value_name = "N")]
    pub max_connections: usize,

    /// Acquisitions with a `wait` that may wait at once on this sidecar (locks, fair locks, semaphores); beyond it they get 429 [range: 1-65536].
    #[arg(long, default_value_t = crate::coord::DEFAULT_MAX_WAITERS, env = "LEADER_ELECTOR_COORD_MAX_WAITERS", value_parser = crate::flags::parse_usize, allow_negative_numbers = true, value_name = "N")]
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

    /// This candidate's priority: a leader hands over to a ready candidate of a higher one; 0 never leads (follows and reports only).
    #[arg(long, default_value_t = crate::backend::candidates::DEFAULT_PRIORITY, env = "LEADER_ELECTOR_PRIORITY", value_parser = crate::flags::parse_u32, allow_negative_numbers = true, value_name = "N")]
    pub priority: u32,

    /// How long a ready candidate of a higher priority must stay in the candidate registry before the leader hands over to it. Election-wide: the leader's value counts; a candidate whose value differs logs a warning naming both. Set the same on every member.
    #[arg(long, default_value = "10s", env = "LEADER_ELECTOR_PREEMPT_AFTER", value_parser = parse_duration, value_name = "DURATION")]
    pub preempt_after: Duration,

    /// Own a share of N shards of the election (1-4096; 0 = off): each live, ready member holds about N/members of them, each with its fencing token, served on GET /shards. Election-wide: every member must run with the same N (one with another N is left out of the set and said once). etcd and one Redis server.
    #[arg(long, default_value_t = 0, env = "LEADER_ELECTOR_SHARDS", value_parser = crate::flags::parse_u32, allow_negative_numbers = true, value_name = "N")]
    pub shards: u32,

    /// The revision this candidate runs (the chart passes the Pod's pod-template-hash); a leader hands over to a ready candidate of a newer one; empty = unknown.
    #[arg(
        long,
        default_value = "",
        env = "LEADER_ELECTOR_REVISION",
        value_name = "REVISION"
    )]
    pub revision: String,

    /// POST a JSON event to this URL on each transition (http:// only), in order, with retries; never blocks the election.
    #[arg(long, env = "LEADER_ELECTOR_NOTIFY_URL", value_parser = parse_http_url, value_name = "URL")]
    pub notify_url: Option<String>,

    /// Label key set on this sidecar's own Pod: "true" while leading, "false" otherwise (needs POD_NAME and POD_NAMESPACE); empty turns it off.
    #[arg(long, default_value = crate::kube_label::DEFAULT_LABEL_KEY, env = "LEADER_ELECTOR_POD_LABEL_KEY", value_name = "KEY")]
    pub pod_label_key: String,

    /// Record a Kubernetes Event on this Pod for each transition (with --pod-label-key).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LEADER_ELECTOR_POD_EVENTS", value_name = "BOOL")]
    pub pod_events: bool,

    /// Keep an EndpointSlice of this selector-less Service naming only the leader's Pod IP (needs POD_IP, POD_NAME, POD_NAMESPACE); empty turns it off.
    #[arg(
        long = "endpointslice-service",
        default_value = "",
        env = "LEADER_ELECTOR_ENDPOINTSLICE_SERVICE",
        value_name = "SERVICE"
    )]
    pub endpointslice_service: String,

    /// How long a completed job stays completed (job claims on the control API).
    #[arg(long, default_value = "24h", env = "LEADER_ELECTOR_COMPLETED_RETENTION", value_parser = parse_duration, value_name = "DURATION")]
    pub completed_retention: Duration,

    /// Run mode: time between SIGTERM and SIGKILL of the command, never past the validity deadline [default: min(5s, (TTL - renew interval) / 2)].
    #[arg(long, env = "LEADER_ELECTOR_KILL_GRACE", value_parser = parse_duration, value_name = "DURATION")]
    pub kill_grace: Option<Duration>,

    /// Run mode: run the command once per period of this length (aligned to the Unix epoch on this sidecar's clock) on whichever sidecar claims the period first, instead of while leading; needs a backend with job claims.
    #[arg(long, env = "LEADER_ELECTOR_EVERY", value_parser = parse_duration, value_name = "DURATION")]
    pub every: Option<Duration>,

    /// Run mode: what to do when the command exits on its own [default: resign].
    #[arg(long, value_enum, env = "LEADER_ELECTOR_ON_CHILD_EXIT")]
    pub on_child_exit: Option<OnChildExit>,

    /// Run mode: exit (with the command's code) after this many failed starts in a row (not found, not executable, exit 126 or 127 at once) [default: 3].
    #[arg(long, env = "LEADER_ELECTOR_START_FAILURES", value_parser = crate::flags::parse_u32, allow_negative_numbers = true, value_name = "N")]
    pub start_failures: Option<u32>,

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

/// Log output format (`--log-format`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
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
    /// Failed starts in a row (`--start-failures`) after which the run
    /// ends with the command's code.
    pub start_failures: u32,
    /// Cooldown after a resign caused by the child's exit.
    pub resign_cooldown: Duration,
    /// `--every`: run once per period of this length instead of while
    /// leading (whole seconds, at least 1 s).
    pub every: Option<Duration>,
}
