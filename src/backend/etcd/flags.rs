//! The etcd backend's flags (`--etcd-*`), their checks, and the settings
//! they resolve to: the election key `<prefix><election>`, the coordination
//! keys under `<prefix>_coord/`, and how to reach etcd.

// The flags' doc comments are clap's `--help` text, not Markdown.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::EtcdBackend;
use super::EtcdOptions;
use super::coord::{DEFAULT_DEADLINE, EtcdCoord};
use crate::backend::registry::{Auto, BackendArgs, Common, Connected, Row, Settings};
use crate::flags::{ConfigError, config_error, read_pem, read_secret, redact};

/// The etcd backend's registry row.
pub const ROW: Row = Row {
    name: "etcd",
    help: "a key bound to an etcd lease (--etcd-endpoints)",
    auto: Auto::Flag {
        flag: "--etcd-endpoints",
        example: "--etcd-endpoints (e.g. http://127.0.0.1:2379)",
        given: |a| !a.etcd.etcd_endpoints.is_empty(),
    },
    resolve,
    coordination: Some("locks, fair locks, semaphores, job claims"),
    failsafe: true,
    shards: true,
};

/// The etcd flags.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "etcd")]
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

/// HTTP/2 keep-alive ping interval towards etcd. etcd closes connections that
/// ping more often than `--grpc-keepalive-min-time` (default 5 s) with
/// GOAWAY `too_many_pings`, which would break every watch; 10 s stays clear.
pub const ETCD_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

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

/// The etcd backend's checked settings.
#[derive(Debug, Clone)]
pub struct EtcdSettings {
    /// The election key, `<prefix><election>`.
    pub key: String,
    /// The key prefix (coordination keys live under `<prefix>_coord/`).
    pub prefix: String,
    /// How to reach etcd.
    pub options: EtcdOptions,
}

impl Settings for EtcdSettings {
    fn name(&self) -> &'static str {
        ROW.name
    }

    fn connect(&self) -> Result<Connected, String> {
        let backend = EtcdBackend::new(self.key.clone(), self.options.clone());
        // Coordination calls are not on the election's renew path: the
        // election's call timeout, but at least the coordination default.
        let coord = EtcdCoord::new(backend.clone(), &self.prefix)
            .with_deadline(self.options.connect_timeout.max(DEFAULT_DEADLINE));
        Ok(Connected {
            registry: Some(backend.clone()),
            controls: Some(backend.clone()),
            roster: Some(backend.clone()),
            shards: Some(Arc::new(super::shards::EtcdShards::new(backend.clone()))),
            election: backend,
            coordination: Some(Box::new(coord)),
        })
    }
}

/// etcd's settings: endpoints (https exactly when a CA is given), the CA,
/// an optional client certificate and optional credentials, all read now.
fn resolve(
    args: &BackendArgs,
    common: &Common,
    _chosen_by_auto: bool,
) -> Result<Arc<dyn Settings>, ConfigError> {
    let e = &args.etcd;
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
        .map(|p| read_pem("--etcd-ca-file", p, "CERTIFICATE"))
        .transpose()?;
    Ok(Arc::new(EtcdSettings {
        key: format!("{}{}", e.etcd_prefix, common.election),
        prefix: e.etcd_prefix.clone(),
        options: EtcdOptions {
            endpoints,
            ca_pem,
            client_cert_pem: etcd_client_cert(e, tls)?,
            credentials: etcd_credentials(e)?,
            connect_timeout: common.call_timeout,
            keepalive_interval: ETCD_KEEPALIVE_INTERVAL,
        },
    }))
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
            let cert = read_pem("--etcd-cert-file", c, "CERTIFICATE")?;
            let key = read_pem("--etcd-key-file", k, "PRIVATE KEY")?;
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
        (Some(user), Some(file)) => Ok(Some((
            user.clone(),
            read_secret("--etcd-password-file", file)?,
        ))),
        (Some(_), None) => Err(config_error(
            "--etcd-username needs --etcd-password-file (a file holding the password)",
        )),
        (None, Some(_)) => Err(config_error("--etcd-password-file needs --etcd-username")),
    }
}
