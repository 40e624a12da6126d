//! What the configuration and every backend's flag group share: the error
//! that names a flag and its fix ([`ConfigError`]), and the checks of single
//! values (durations, files, PEM blocks, URLs shown in messages).
//!
//! A leaf module: it names no backend and no other module of the crate, so
//! each backend's flags (`crate::backend::<name>::flags`) and the
//! configuration can both use it.

use std::path::Path;
use std::time::Duration;

/// A configuration error: the flag at fault and what to do. `main` prints it
/// and exits with code 2.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// The whole message, naming the flag and the fix.
    pub message: String,
}

/// A [`ConfigError`] with `message`.
pub(crate) fn config_error(message: impl Into<String>) -> ConfigError {
    ConfigError {
        message: message.into(),
    }
}

/// Parse a humantime duration (`15s`, `500ms`, `1m30s`).
///
/// # Errors
/// A message with the value and an example.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}; use a duration such as 15s, 500ms or 1m30s"))
}

/// The bytes of the file a flag names.
///
/// # Errors
/// A [`ConfigError`] naming `flag`, the path and the cause.
pub(crate) fn read_file(flag: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| {
        config_error(format!(
            "{flag} ({}) cannot be read: {e}\nhint: give the path of a readable file",
            path.display()
        ))
    })
}

/// The first line of the file a flag names (a password, kept out of the
/// process list).
///
/// # Errors
/// A [`ConfigError`] naming `flag` when the file cannot be read, is not
/// UTF-8 or its first line is empty.
pub(crate) fn read_secret(flag: &str, path: &Path) -> Result<String, ConfigError> {
    let raw = read_file(flag, path)?;
    let text =
        String::from_utf8(raw).map_err(|_| config_error(format!("{flag} must hold UTF-8 text")))?;
    let secret = text.lines().next().unwrap_or("").to_owned();
    if secret.is_empty() {
        return Err(config_error(format!(
            "{flag} ({}) is empty",
            path.display()
        )));
    }
    Ok(secret)
}

/// Check that `pem` holds a PEM block with `label` in its `BEGIN` line
/// (`CERTIFICATE`, `PRIVATE KEY`).
/// The PEM file a flag names, checked to hold a `label` block
/// (`CERTIFICATE`, `PRIVATE KEY`).
///
/// # Errors
/// A [`ConfigError`] naming `flag` when the file cannot be read or holds no
/// such block.
pub(crate) fn read_pem(flag: &str, path: &Path, label: &str) -> Result<Vec<u8>, ConfigError> {
    let pem = read_file(flag, path)?;
    check_pem(flag, path, &pem, label)?;
    Ok(pem)
}

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

/// `url` with any password replaced by `***`, for logs and errors: the
/// userinfo's password (or a lone userinfo) and the values of `pass=` and
/// `password=` query parameters (`redis+unix:///run/redis.sock?pass=...`).
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match (base.find("://"), base.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let creds = &base[scheme_end + 3..at];
            let user = creds.split_once(':').map_or(creds, |(u, _)| u);
            let user = if creds.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            format!("{}{}{}", &base[..scheme_end + 3], user, &base[at..])
        }
        _ => base.to_owned(),
    };
    if let Some(q) = query {
        out.push('?');
        let parts: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _))
                    if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") =>
                {
                    format!("{k}=***")
                }
                _ => kv.to_owned(),
            })
            .collect();
        out.push_str(&parts.join("&"));
    }
    out
}
