//! Command line and environment (DESIGN.md, "CLI contract"): clap derive with
//! `env =` on every flag, and the cross-field validation that turns a [`Cli`]
//! into a checked [`Config`].
//!
//! Invariant: every value the rest of the program sees has been validated
//! here; a bad value is reported with the flag's name, what is allowed, and a
//! hint, and `main` exits with code 2.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

mod checks;
mod cli;
pub mod failsafe;
mod labeler;
mod run;

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use crate::backend::registry::{self, Common, Settings};
use crate::elector::ElectorConfig;

use crate::flags::config_error;
pub use crate::flags::{ConfigError, parse_duration};
pub(crate) use checks::check_election;
pub use checks::{
    COORD_MAX_WAITERS_LIMIT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_BODY_TIMEOUT, DURATION_RANGES, MAX_CONNECTIONS_LIMIT, MAX_ELECTION_LEN,
    parse_addr, parse_http_url,
};
use checks::{check_ranges, default_identity};
pub use cli::*;
use labeler::{labeler_config, slice_config};
pub use run::{DEFAULT_START_FAILURES, resolve_command};

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Timing and identity of the Elector.
    pub elector: ElectorConfig,
    /// The backend to use, with its checked connection settings (from the
    /// backend registry).
    pub backend: Arc<dyn Settings>,
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
    /// The EndpointSlice writer: `None` when off (no `--endpointslice-service`).
    pub endpoint_slice: Option<crate::endpoint_slice::SliceConfig>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// Failsafe: `None` when off.
    pub failsafe: Option<failsafe::FailsafeSettings>,
    /// `--shards`: `None` when off (0).
    pub shards: Option<u32>,
}

/// The durations derived from the timing flags and their defaults.
struct Timing {
    renew_interval: Duration,
    resign_cooldown: Duration,
    health_grace: Duration,
    kill_grace: Duration,
}

impl Timing {
    /// Defaults from `--lease-duration` (renew a third of it; cool down and
    /// grace for one of it; kill grace half of what is left after a renew
    /// interval, at most 5 s), after the checks no range covers.
    fn of(cli: &Cli) -> Result<Timing, ConfigError> {
        if cli.lease_duration < Duration::from_secs(1) {
            return Err(config_error(format!(
                "--lease-duration ({}) must be at least 1s",
                crate::flags::format_duration(cli.lease_duration)
            )));
        }
        let renew_interval = cli.renew_interval.unwrap_or(cli.lease_duration / 3);
        if cli.retry_period.is_zero() {
            return Err(config_error("--retry-period must be greater than 0"));
        }
        if cli.health_interval.is_zero() {
            return Err(config_error("--health-interval must be greater than 0"));
        }
        Ok(Timing {
            renew_interval,
            resign_cooldown: cli.resign_cooldown.unwrap_or(cli.lease_duration),
            health_grace: cli.health_grace.unwrap_or(cli.lease_duration),
            kill_grace: cli.kill_grace.unwrap_or_else(|| {
                (cli.lease_duration.saturating_sub(renew_interval) / 2).min(Duration::from_secs(5))
            }),
        })
    }
}

/// `--identity`, else `$POD_NAME`, else the host name.
fn identity(cli: &Cli) -> Result<String, ConfigError> {
    match cli.identity.clone() {
        Some(id) if id.trim().is_empty() => Err(config_error(
            "--identity must not be empty\nhint: leave it out to use $POD_NAME or the host name",
        )),
        Some(id) => Ok(id),
        None => default_identity().ok_or_else(|| {
            config_error("--identity is not set and neither $POD_NAME nor the host name is available\nhint: pass --identity")
        }),
    }
}

/// Run mode's settings: a command after `--` is required in run mode and
/// refused outside it; the kill grace must fit in the lease.
fn run_options(cli: &Cli, run_mode: bool, t: &Timing) -> Result<Option<RunOptions>, ConfigError> {
    match (run_mode, cli.command.is_empty()) {
        (true, true) => Err(config_error(
            "run needs a command after --\nhint: leader-elector run --election NAME ... -- /usr/bin/my-singleton --flag",
        )),
        (false, false) => Err(config_error(format!(
            "a command after -- ({}) needs run mode\nhint: leader-elector run [flags] -- COMMAND ARGS...",
            cli.command.join(" ")
        ))),
        (false, true) => run::no_run_flags(cli).map(|_| None),
        (true, false) => {
            run::resolve_command(&cli.command[0], std::env::var("PATH").ok().as_deref())?;
            if t.kill_grace.is_zero() || t.kill_grace + t.renew_interval >= cli.lease_duration {
                return Err(config_error(format!(
                    "--kill-grace ({}) plus --renew-interval ({}) must be shorter than --lease-duration ({})\nhint: the command is stopped kill-grace before the validity deadline when renewals fail",
                    crate::flags::format_duration(t.kill_grace),
                    crate::flags::format_duration(t.renew_interval),
                    crate::flags::format_duration(cli.lease_duration)
                )));
            }
            Ok(Some(RunOptions {
                command: cli.command.clone(),
                kill_grace: t.kill_grace,
                on_child_exit: cli.on_child_exit.unwrap_or(OnChildExit::Resign),
                start_failures: run::start_failures(cli)?,
                resign_cooldown: t.resign_cooldown,
                every: cli.every.map(every).transpose()?,
            }))
        }
    }
}

/// `--every`: whole seconds, at least 1 s.
fn every(every: Duration) -> Result<Duration, ConfigError> {
    crate::coord::periods::check_every("--every", every)
        .map_err(|e| config_error(format!("{e}\nhint: e.g. --every 5m")))
}

/// `run --every` claims each period as a job: the backend must serve job
/// claims.
fn check_every_backend(run: Option<&RunOptions>, backend: &str) -> Result<(), ConfigError> {
    let serves = registry::row(backend).is_some_and(|r| r.coordination.is_some());
    match run {
        Some(r) if r.every.is_some() && !serves => Err(config_error(format!(
            "--every claims each period as a job, but {}",
            registry::unserved_message(backend)
        ))),
        _ => Ok(()),
    }
}

/// The Elector's timing and identity. Run mode keeps the lease until the
/// child is gone (a drain of at least the kill grace); otherwise a drain
/// needs the control API, where the app says it is done.
fn elector_config(
    cli: &Cli,
    timing: &Timing,
    run: Option<&RunOptions>,
    control_api: bool,
) -> Result<ElectorConfig, ConfigError> {
    let drain_timeout = match (run, cli.drain_timeout) {
        (Some(r), d) => Some(
            d.unwrap_or_default()
                .max(r.kill_grace + Duration::from_secs(1)),
        ),
        (None, d) => d.filter(|d| !d.is_zero()),
    };
    if drain_timeout.is_some() && run.is_none() && !control_api {
        return Err(config_error(
            "--drain-timeout needs the control API (--control-addr) so the app can POST /release",
        ));
    }
    let elector = ElectorConfig {
        election: cli.election.clone(),
        identity: identity(cli)?,
        lease_duration: cli.lease_duration,
        renew_interval: timing.renew_interval,
        retry_period: cli.retry_period,
        drift_margin: cli.drift_margin,
        drain_timeout,
        health_grace: timing.health_grace,
        release_wait: run.map(|r| r.kill_grace + Duration::from_millis(100)),
        standing: crate::elector::Standing {
            priority: cli.priority,
            revision: cli.revision.trim().to_owned(),
            preempt_after: cli.preempt_after,
        },
    };
    elector.validate().map_err(config_error)?;
    Ok(elector)
}

/// `--control-addr`: `None` when empty; a loopback address otherwise.
fn control_addr(cli: &Cli) -> Result<Option<SocketAddr>, ConfigError> {
    match cli.control_addr.trim() {
        "" => Ok(None),
        text => {
            let addr =
                parse_addr(text).map_err(|e| config_error(format!("--control-addr: {e}")))?;
            if !addr.ip().is_loopback() {
                return Err(config_error(format!(
                    "--control-addr ({addr}) must be a loopback address: the control API changes state\nhint: use 127.0.0.1:4041, or an empty value to turn it off"
                )));
            }
            Ok(Some(addr))
        }
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
        let timing = Timing::of(&cli)?;
        let run = run_options(&cli, run_mode, &timing)?;
        let control_addr = control_addr(&cli)?;
        // `run --every` does not run its command while leading: the election
        // keeps no drain for it.
        let leading_run = run.as_ref().filter(|r| r.every.is_none());
        let elector = elector_config(&cli, &timing, leading_run, control_addr.is_some())?;
        // Flags that cannot go together, before anything about the machine
        // (a missing kubeconfig): the user fixes the command line first.
        registry::check_failsafe(&cli.store, cli.failsafe.failsafe)?;
        let backend = registry::resolve(
            &cli.store,
            &Common {
                election: cli.election.clone(),
                lease_duration: cli.lease_duration,
                renew_interval: cli.renew_interval,
                call_timeout: elector.call_timeout(),
            },
        )?;
        check_every_backend(run.as_ref(), backend.name())?;
        let pod_ip = std::env::var("POD_IP").ok();
        let failsafe = failsafe::resolve(&cli.failsafe, pod_ip.as_deref(), cli.lease_duration)?;
        if failsafe.is_some() && !registry::row(backend.name()).is_some_and(|r| r.failsafe) {
            return Err(config_error(format!(
                "--failsafe: the {} backend keeps no failsafe roster yet\nhint: leave --failsafe off; it is built on etcd, Redis and Kubernetes Leases",
                backend.name()
            )));
        }
        let shards = (cli.shards > 0).then_some(cli.shards);
        registry::check_shards(&cli.store, backend.name(), shards.is_some())?;
        Ok(Config {
            shards,
            failsafe,
            elector,
            backend,
            http_addr: cli.http_addr,
            control_addr,
            limits: crate::serve::Limits {
                max_connections: cli.max_connections,
                header_read_timeout: cli.header_read_timeout,
                body_timeout: cli.request_body_timeout,
            },
            resign_cooldown: timing.resign_cooldown,
            candidate_health: cli
                .candidate_health_url
                .clone()
                .map(|u| (u, cli.health_interval)),
            notify_url: cli.notify_url.clone(),
            labeler: labeler_config(&cli)?,
            endpoint_slice: slice_config(&cli)?,
            completed_retention: cli.completed_retention,
            coord_max_waiters: cli.coord_max_waiters,
            run,
            log_format: cli.log_format,
            log_level: cli.log_level,
        })
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
