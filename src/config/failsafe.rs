//! The failsafe flags (`--failsafe`, `--peer-addr`,
//! `--failsafe-secret-file`), checked into [`FailsafeSettings`].

use std::path::PathBuf;

use clap::Args;

use crate::failsafe::peer::{Secret, SecretError};
use crate::flags::{ConfigError, config_error};

/// The failsafe flags.
#[derive(Args, Debug, Clone, Default)]
pub struct FailsafeArgs {
    /// Lead on through a backend outage (opt-in).
    ///
    /// Keep a running leader through a backend outage while every roster member confirms it over the peer port (opt-in; see the book's Failsafe page).
    #[arg(long, env = "LEADER_ELECTOR_FAILSAFE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL", hide_possible_values = true)]
    pub failsafe: bool,

    /// Address of the peer listener (the heartbeat only), published in the roster [default with --failsafe: $POD_IP:4042].
    #[arg(long, env = "LEADER_ELECTOR_PEER_ADDR", value_name = "HOST:PORT")]
    pub peer_addr: Option<String>,

    /// File holding the shared secret of the peer channel (at least 16 bytes; a Secret mounted into every member). Required with --failsafe.
    #[arg(long, env = "LEADER_ELECTOR_FAILSAFE_SECRET_FILE", value_name = "PATH")]
    pub failsafe_secret_file: Option<PathBuf>,
}

/// The default peer port.
pub const DEFAULT_PEER_PORT: u16 = 4042;

/// Failsafe as configured.
#[derive(Clone, Debug)]
pub struct FailsafeSettings {
    /// Where the peer listener binds, and the address published in the roster.
    pub peer_addr: std::net::SocketAddr,
    /// The shared secret.
    pub secret: Secret,
}

/// Check the failsafe flags: `None` when failsafe is off (its other flags
/// are then refused), `pod_ip` is `$POD_IP`.
///
/// # Errors
/// A [`ConfigError`] naming the flag: no peer address, an address that is
/// not `HOST:PORT` with an IP, a missing, unreadable or short secret file.
pub fn resolve(
    args: &FailsafeArgs,
    pod_ip: Option<&str>,
) -> Result<Option<FailsafeSettings>, ConfigError> {
    if !args.failsafe {
        if args.peer_addr.is_some() || args.failsafe_secret_file.is_some() {
            return Err(config_error(
                "--peer-addr and --failsafe-secret-file need --failsafe\nhint: add --failsafe, or leave them out",
            ));
        }
        return Ok(None);
    }
    let text = match (&args.peer_addr, pod_ip.filter(|ip| !ip.is_empty())) {
        (Some(a), _) => a.clone(),
        (None, Some(ip)) => format!("{ip}:{DEFAULT_PEER_PORT}"),
        (None, None) => {
            return Err(config_error(
                "--peer-addr is not set and $POD_IP is empty: failsafe needs an address the other members reach\nhint: pass --peer-addr 10.0.0.5:4042, or set POD_IP from the Downward API",
            ));
        }
    };
    let peer_addr = text.parse().map_err(|_| {
        config_error(format!(
            "--peer-addr ({text}) is not an IP:PORT\nhint: e.g. --peer-addr 10.0.0.5:4042 (the Pod IP)"
        ))
    })?;
    let Some(path) = &args.failsafe_secret_file else {
        return Err(config_error(
            "--failsafe-secret-file is required with --failsafe\nhint: mount a Secret holding at least 16 random bytes into every member and name the file",
        ));
    };
    let secret = Secret::from_file(path).map_err(|e| match e {
        SecretError::Read { .. } | SecretError::TooShort { .. } => {
            config_error(format!("--failsafe-secret-file: {e}"))
        }
    })?;
    Ok(Some(FailsafeSettings { peer_addr, secret }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(peer: Option<&str>, file: Option<PathBuf>) -> FailsafeArgs {
        FailsafeArgs {
            failsafe: true,
            peer_addr: peer.map(str::to_owned),
            failsafe_secret_file: file,
        }
    }

    #[test]
    fn each_bad_failsafe_flag_is_named() {
        let dir = std::env::temp_dir().join(format!("le-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (short, good) = (dir.join("short"), dir.join("good"));
        std::fs::write(&short, "too short\n").unwrap();
        std::fs::write(&good, "0123456789abcdef\n").unwrap();
        let msg = |r: Result<Option<FailsafeSettings>, ConfigError>| r.unwrap_err().to_string();
        assert!(msg(resolve(&args(None, Some(good.clone())), None)).contains("--peer-addr"));
        assert!(msg(resolve(&args(Some("x"), Some(good.clone())), None)).contains("--peer-addr"));
        assert!(
            msg(resolve(&args(Some("127.0.0.1:1"), None), None)).contains("--failsafe-secret-file")
        );
        let m = msg(resolve(&args(Some("127.0.0.1:1"), Some(short)), None));
        assert!(
            m.contains("--failsafe-secret-file") && m.contains("16"),
            "{m}"
        );
        let ok = resolve(&args(None, Some(good)), Some("10.1.2.3"))
            .unwrap()
            .unwrap();
        assert_eq!(ok.peer_addr.to_string(), "10.1.2.3:4042");
        let off = FailsafeArgs {
            peer_addr: Some("1.2.3.4:5".into()),
            ..FailsafeArgs::default()
        };
        assert!(msg(resolve(&off, None)).contains("--failsafe"));
        assert!(resolve(&FailsafeArgs::default(), None).unwrap().is_none());
    }
}
