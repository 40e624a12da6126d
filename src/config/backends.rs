//! From flags to one backend's connection settings: etcd, Redis (one
//! server or a Redlock group), the Kubernetes Lease; and the Pod labeler.

use std::path::Path;
use std::time::Duration;

use super::checks::{ETCD_KEEPALIVE_INTERVAL, check_pem, read_file};
use super::{BackendConfig, Cli, ConfigError, EtcdArgs, config_error, parse_endpoint};
use crate::backend::etcd::EtcdOptions;
use crate::backend::redis::{RedisOptions, check_url, redact};
use crate::elector::ElectorConfig;

/// Per-server timeout of a Redlock group: short against the TTL (the spec's
/// example is 5–50 ms for a 10 s TTL), but not so short that a busy loopback
/// server misses it.
pub fn redlock_server_timeout(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

pub(crate) fn redis_backend(
    cli: &Cli,
    elector: &ElectorConfig,
) -> Result<BackendConfig, ConfigError> {
    let r = &cli.store.redis;
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
            min_replicas: r.redis_min_replicas,
        },
    })
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
    if let Some(v) = super::tests::KUBE_PRESENT.with(|c| c.get()) {
        return v;
    }
    let env = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    (env("KUBERNETES_SERVICE_HOST") && env("KUBERNETES_SERVICE_PORT"))
        || env("KUBECONFIG")
        || (home
            && std::env::var_os("HOME")
                .is_some_and(|h| Path::new(&h).join(".kube").join("config").is_file()))
}

pub(crate) fn kube_backend(cli: &Cli, chosen_by_auto: bool) -> Result<BackendConfig, ConfigError> {
    if !kube_config_present(!chosen_by_auto) {
        return Err(config_error(if chosen_by_auto {
            "no backend is configured: give --etcd-endpoints (e.g. http://127.0.0.1:2379) or --redis-url (e.g. redis://127.0.0.1:6379), or run in a Kubernetes Pod (or set KUBECONFIG, or give --backend kubernetes to use ~/.kube/config) to elect through a Lease"
        } else {
            "--backend kubernetes needs a Kubernetes client configuration: run in a Pod with a ServiceAccount, or set KUBECONFIG"
        }));
    }
    check_lease_name(&cli.election)?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let namespace = match cli
        .store
        .kubernetes
        .election_namespace
        .as_deref()
        .map(str::trim)
    {
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
        options: crate::backend::kubernetes::KubeOptions {
            namespace,
            poll_every: cli.renew_interval.or(Some(cli.lease_duration / 3)),
        },
    })
}

pub(crate) fn labeler_config(
    cli: &Cli,
) -> Result<Option<crate::kube_label::LabelerConfig>, ConfigError> {
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

/// etcd's settings: endpoints (https exactly when a CA is given), the CA,
/// an optional client certificate and optional credentials, all read now.
pub(crate) fn etcd_backend(
    cli: &Cli,
    elector: &ElectorConfig,
) -> Result<BackendConfig, ConfigError> {
    let e = &cli.store.etcd;
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
    Ok(BackendConfig::Etcd {
        key: format!("{}{}", e.etcd_prefix, cli.election),
        prefix: e.etcd_prefix.clone(),
        options: EtcdOptions {
            endpoints,
            ca_pem,
            client_cert_pem: etcd_client_cert(e, tls)?,
            credentials: etcd_credentials(e)?,
            connect_timeout: elector.call_timeout(),
            keepalive_interval: ETCD_KEEPALIVE_INTERVAL,
        },
    })
}

/// A client certificate and its private key, both PEM.
type CertAndKey = (Vec<u8>, Vec<u8>);

/// `--etcd-cert-file` and `--etcd-key-file`: both or neither, over TLS only.
fn etcd_client_cert(e: &EtcdArgs, tls: bool) -> Result<Option<CertAndKey>, ConfigError> {
    match (&e.etcd_cert_file, &e.etcd_key_file) {
        (None, None) => Ok(None),
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
            Ok(Some((cert, key)))
        }
        (Some(_), None) => Err(config_error(
            "--etcd-cert-file needs --etcd-key-file (the certificate's private key)",
        )),
        (None, Some(_)) => Err(config_error(
            "--etcd-key-file needs --etcd-cert-file (the client certificate)",
        )),
    }
}

/// `--etcd-username` and `--etcd-password-file`: both or neither; the
/// password is the file's first line.
fn etcd_credentials(e: &EtcdArgs) -> Result<Option<(String, String)>, ConfigError> {
    match (&e.etcd_username, &e.etcd_password_file) {
        (None, None) => Ok(None),
        (Some(user), _) if user.trim().is_empty() => Err(config_error(
            "--etcd-username must not be empty\nhint: leave out --etcd-username and --etcd-password-file when etcd has no auth",
        )),
        (Some(user), Some(file)) => {
            let raw = read_file("--etcd-password-file", file)?;
            let text = String::from_utf8(raw)
                .map_err(|_| config_error("--etcd-password-file must hold UTF-8 text"))?;
            let password = text.lines().next().unwrap_or("").to_owned();
            if password.is_empty() {
                return Err(config_error(format!(
                    "--etcd-password-file ({}) is empty",
                    file.display()
                )));
            }
            Ok(Some((user.clone(), password)))
        }
        (Some(_), None) => Err(config_error(
            "--etcd-username needs --etcd-password-file (a file holding the password)",
        )),
        (None, Some(_)) => Err(config_error("--etcd-password-file needs --etcd-username")),
    }
}
