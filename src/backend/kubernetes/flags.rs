//! The Kubernetes Lease backend's flags (the old `leader-elector` image's
//! names), their checks, and the settings they resolve to: the Lease named
//! after the election, in the election namespace.

// The flags' doc comments are clap's `--help` text, not Markdown.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{KubeLeaseBackend, KubeOptions};
use crate::backend::registry::{Auto, BackendArgs, Common, Connected, Row, Settings};
use crate::flags::{ConfigError, config_error, parse_duration};

/// The Kubernetes Lease backend's registry row.
pub const ROW: Row = Row {
    name: "kubernetes",
    help: "a coordination.k8s.io/v1 Lease through the Kubernetes API (in-cluster config or KUBECONFIG)",
    auto: Auto::Fallback {
        present: || kube_config_present(false),
        hint: "run in a Kubernetes Pod (or set KUBECONFIG, or give --backend kubernetes to use ~/.kube/config) to elect through a Lease",
    },
    resolve,
    coordination: Some("locks, fair locks, semaphores, job claims"),
    failsafe: true,
    shards: false,
};

#[cfg(test)]
thread_local! {
    /// Tests: what [`kube_config_present`] answers on this thread, whatever
    /// the environment says.
    pub(crate) static KUBE_PRESENT: std::cell::Cell<Option<bool>> =
        const { std::cell::Cell::new(None) };
}

/// The Kubernetes Lease backend flags (the old `leader-elector` image's names).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Kubernetes")]
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

    /// The most any two candidates' wall clocks (and the API server's) may differ (--backend kubernetes): a Lease whose renewTime + duration + this has already passed when this process first reads it is taken at once, not after a lease duration of silence. A clock off by more can make two leaders [default: off; at most --lease-duration].
    #[arg(
        long,
        env = "LEADER_ELECTOR_MAX_CLOCK_SKEW",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub max_clock_skew: Option<Duration>,

    /// Also hold the old leader-elector image's lock (--backend kubernetes): the Endpoints object named after the election, with its control-plane.alpha.kubernetes.io/leader annotation, and lead only while holding both it and the Lease. Turn it on for the one rollout that replaces the old image, off in the next; needs get, create, update on endpoints [default: off].
    #[arg(long, env = "LEADER_ELECTOR_MIGRATE_FROM_ENDPOINTS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub migrate_from_endpoints: Option<bool>,
}

/// The Kubernetes Lease backend's checked settings.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// The Lease name (the election name).
    pub name: String,
    /// Namespace and connection settings.
    pub options: KubeOptions,
    /// `--migrate-from-endpoints`: also hold the old image's Endpoints lock.
    pub migrate_from_endpoints: bool,
}

impl Settings for KubeSettings {
    fn name(&self) -> &'static str {
        ROW.name
    }

    fn connect(&self) -> Result<Connected, String> {
        let lease = KubeLeaseBackend::new(self.name.clone(), self.options.clone());
        let coord = super::coord::LeaseCoord::new(lease.clone());
        if self.migrate_from_endpoints {
            let old = super::endpoints_lock::EndpointsLock::new(&self.name, self.options.clone());
            let both = crate::backend::both::Both::new(lease, old);
            return Ok(Connected {
                registry: Some(both.clone()),
                controls: Some(both.clone()),
                election: both,
                coordination: Some(Box::new(coord)),
                roster: None,
                shards: None,
            });
        }
        Ok(Connected {
            registry: Some(lease.clone()),
            controls: Some(lease.clone()),
            roster: Some(lease.clone()),
            shards: None,
            election: lease,
            coordination: Some(Box::new(coord)),
        })
    }
}

/// A Lease name must be a DNS subdomain name (RFC 1123): lowercase letters,
/// digits, '-' and '.', starting and ending alphanumeric, at most 253.
pub(crate) fn check_lease_name(name: &str) -> Result<(), ConfigError> {
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
/// service host variables), or a kubeconfig named by `KUBECONFIG`; with
/// `home`, also `~/.kube/config`. `--backend auto` passes `home = false`: on
/// a workstation, someone who forgot `--etcd-endpoints` must not write a
/// Lease into whatever cluster the current context points at.
pub(crate) fn kube_config_present(home: bool) -> bool {
    #[cfg(test)]
    if let Some(v) = KUBE_PRESENT.with(|c| c.get()) {
        return v;
    }
    let env = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    (env("KUBERNETES_SERVICE_HOST") && env("KUBERNETES_SERVICE_PORT"))
        || env("KUBECONFIG")
        || (home
            && std::env::var_os("HOME")
                .is_some_and(|h| Path::new(&h).join(".kube").join("config").is_file()))
}

fn resolve(
    args: &BackendArgs,
    common: &Common,
    chosen_by_auto: bool,
) -> Result<Arc<dyn Settings>, ConfigError> {
    // `--backend auto` chose it only when `kube_config_present(false)`.
    if !chosen_by_auto && !kube_config_present(true) {
        return Err(config_error(
            "--backend kubernetes needs a Kubernetes client configuration: run in a Pod with a ServiceAccount, or set KUBECONFIG",
        ));
    }
    check_lease_name(&common.election)?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let namespace = match args.kubernetes.election_namespace.as_deref().map(str::trim) {
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
    let max_clock_skew = check_max_clock_skew(args.kubernetes.max_clock_skew, common)?;
    Ok(Arc::new(KubeSettings {
        name: common.election.clone(),
        options: KubeOptions {
            namespace,
            poll_every: common.renew_interval.or(Some(common.lease_duration / 3)),
            max_clock_skew,
        },
        migrate_from_endpoints: args.kubernetes.migrate_from_endpoints.unwrap_or(false),
    }))
}

/// The Kubernetes flags that only this backend can honour, refused on
/// `backend` (another backend's name): holding the old image's Endpoints
/// lock means nothing to etcd or Redis, and ignoring it would let a
/// migration run without its bridge.
///
/// # Errors
/// A [`ConfigError`] (exit 2) naming the flag.
pub(crate) fn check_only_here(args: &BackendArgs, backend: &str) -> Result<(), ConfigError> {
    if backend != ROW.name && args.kubernetes.migrate_from_endpoints == Some(true) {
        return Err(config_error(format!(
            "--migrate-from-endpoints works only with --backend kubernetes (the backend is {backend})\nhint: the old leader-elector image elected through the Kubernetes API; leave the flag out on {backend}"
        )));
    }
    Ok(())
}

/// `--failsafe` (`on`) with `--migrate-from-endpoints`: refused. The old
/// image holding the Endpoints lock knows no roster and no promise, so a
/// leader leading on through failsafe past its Endpoints lock would let an
/// old replica take that lock beside it.
///
/// # Errors
/// A [`ConfigError`] (exit 2) naming both flags.
pub(crate) fn check_failsafe(args: &BackendArgs, on: bool) -> Result<(), ConfigError> {
    if on && args.kubernetes.migrate_from_endpoints == Some(true) {
        return Err(config_error(
            "--failsafe cannot be used with --migrate-from-endpoints: the old leader-elector image holding the Endpoints lock keeps no failsafe promise\nhint: finish the migration first (a rollout without --migrate-from-endpoints), then turn --failsafe on",
        ));
    }
    Ok(())
}

/// `--max-clock-skew`, if given: positive and at most `--lease-duration`
/// (clocks further apart than a lease duration make the wall-clock
/// comparison of the cold-start rule meaningless).
fn check_max_clock_skew(
    skew: Option<Duration>,
    common: &Common,
) -> Result<Option<Duration>, ConfigError> {
    match skew {
        Some(d) if d.is_zero() || d > common.lease_duration => Err(config_error(format!(
            "--max-clock-skew ({}) must be more than 0s and at most --lease-duration ({})\nhint: give the most the candidates' wall clocks may differ (NTP keeps them within milliseconds), e.g. 2s, or leave it out",
            crate::flags::format_duration(d),
            crate::flags::format_duration(common.lease_duration)
        ))),
        _ => Ok(skew),
    }
}

#[cfg(test)]
#[path = "flags_tests.rs"]
mod tests;
