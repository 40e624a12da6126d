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
/// What is wrong, in our words (not the parser's), with examples.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| duration_error(&e))
}

/// A duration parser's error in our words, with examples of durations.
fn duration_error(e: &humantime::DurationError) -> String {
    use humantime::DurationError as E;
    const EXAMPLES: &str = "use e.g. 15s, 1.5s, 500ms, 1m30s or 1d";
    match e {
        E::Empty => format!("a duration is needed: {EXAMPLES}"),
        E::UnknownUnit { unit, .. } => {
            format!("unknown unit '{unit}': the units are ms, s, m, h and d; {EXAMPLES}")
        }
        E::NumberOverflow => format!("too large a duration: {EXAMPLES}"),
        _ => format!("not a duration (a number and a unit): {EXAMPLES}"),
    }
}

/// Parse a whole number of at most `u32::MAX` (`--priority`,
/// `--start-failures`).
///
/// # Errors
/// What is wrong in our words: negative, not a number, too large.
pub fn parse_u32(s: &str) -> Result<u32, String> {
    let n = parse_whole(s)?;
    u32::try_from(n).map_err(|_| format!("is too large: at most {}", u32::MAX))
}

/// Parse a whole number (`--max-connections`, `--coord-max-waiters`).
///
/// # Errors
/// What is wrong in our words: negative, not a number, too large.
pub fn parse_usize(s: &str) -> Result<usize, String> {
    let n = parse_whole(s)?;
    usize::try_from(n).map_err(|_| "is too large".to_owned())
}

fn parse_whole(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("must not be negative: give a whole number, 0 or more".into());
    }
    if t.is_empty() || !t.chars().all(|c| c.is_ascii_digit()) {
        return Err("is not a whole number: give digits only, e.g. 3".into());
    }
    t.parse::<u64>()
        .map_err(|_| format!("is too large: at most {}", u64::MAX))
}

/// `d` as our flags and errors write durations: the largest units first,
/// whole days, hours and minutes, then seconds with a decimal fraction
/// (`1d`, `1h30m`, `1.5s`, `500ms`); [`parse_duration`] reads it back.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let millis = d.subsec_millis();
    if secs == 0 {
        let nanos = d.subsec_nanos();
        return match nanos {
            n if n % 1_000_000 == 0 => format!("{millis}ms"),
            n if n % 1_000 == 0 => format!("{}us", n / 1_000),
            n => format!("{n}ns"),
        };
    }
    let mut out = String::new();
    for (n, unit) in [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
    ] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    let s = secs % 60;
    if s > 0 || millis > 0 {
        if millis == 0 {
            out.push_str(&format!("{s}s"));
        } else {
            let frac = format!("{millis:03}");
            out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
        }
    }
    out
}

#[cfg(test)]
#[test]
fn durations_print_short_and_read_back() {
    for (d, text) in [
        (Duration::from_secs(86_400), "1d"),
        (Duration::from_secs(172_800), "2d"),
        (Duration::from_millis(1_500), "1.5s"),
        (Duration::from_millis(500), "500ms"),
        (Duration::from_secs(5_400), "1h30m"),
        (Duration::from_secs(600), "10m"),
        (Duration::ZERO, "0ms"),
        (Duration::from_millis(100_250), "1m40.25s"),
        (Duration::from_nanos(1), "1ns"),
    ] {
        assert_eq!(format_duration(d), text);
        assert_eq!(parse_duration(text).unwrap(), d, "{text}");
    }
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
