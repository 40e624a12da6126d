//! The failsafe flags (`--failsafe`, `--peer-addr`,
//! `--failsafe-secret-file`, `--failsafe-accepted-secret-file`,
//! `--failsafe-max-outage`), checked into [`FailsafeSettings`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::failsafe::peer::Secret;
use crate::failsafe::sign::Keys;
use crate::flags::{ConfigError, config_error, format_duration, parse_duration};

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

    /// File holding a second secret the peer channel accepts but never signs with: the old one (or the next one) while the Secret is rotated (see the book's Failsafe page).
    #[arg(
        long,
        env = "LEADER_ELECTOR_FAILSAFE_ACCEPTED_SECRET_FILE",
        value_name = "PATH"
    )]
    pub failsafe_accepted_secret_file: Option<PathBuf>,

    /// The most a member promises one leader's term without seeing it live in the backend: the longest outage failsafe bridges, and the longest a forged heartbeat holds an election leaderless (at least --lease-duration) [default: 5m].
    #[arg(long, env = "LEADER_ELECTOR_FAILSAFE_MAX_OUTAGE", value_parser = parse_duration, value_name = "DURATION")]
    pub failsafe_max_outage: Option<Duration>,
}

/// The default of `--failsafe-max-outage`.
pub const DEFAULT_MAX_OUTAGE: Duration = Duration::from_secs(300);

/// The default peer port.
pub const DEFAULT_PEER_PORT: u16 = 4042;

/// Failsafe as configured.
#[derive(Clone, Debug)]
pub struct FailsafeSettings {
    /// Where the peer listener binds, and the address published in the roster.
    pub peer_addr: std::net::SocketAddr,
    /// The peer channel's keys (the shared secret, and the accepted one).
    pub keys: Keys,
    /// `--failsafe-max-outage`.
    pub max_outage: Duration,
}

/// Check the failsafe flags: `None` when failsafe is off (its other flags
/// are then refused), `pod_ip` is `$POD_IP`, `lease` is `--lease-duration`.
///
/// # Errors
/// A [`ConfigError`] naming the flag: no peer address, an address that is
/// not `HOST:PORT` with an IP, a missing, unreadable or short secret file,
/// a maximum outage shorter than the lease duration.
pub fn resolve(
    args: &FailsafeArgs,
    pod_ip: Option<&str>,
    lease: Duration,
) -> Result<Option<FailsafeSettings>, ConfigError> {
    if !args.failsafe {
        return refuse_without_failsafe(args).map(|()| None);
    }
    let max_outage = args.failsafe_max_outage.unwrap_or(DEFAULT_MAX_OUTAGE);
    if max_outage < lease {
        return Err(config_error(format!(
            "--failsafe-max-outage ({}) is shorter than --lease-duration ({})\nhint: failsafe bridges at least one lease duration; the default is 5m",
            format_duration(max_outage),
            format_duration(lease)
        )));
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
    let secret = Secret::from_file(path)
        .map_err(|e| config_error(format!("--failsafe-secret-file: {e}")))?;
    let accepted = match &args.failsafe_accepted_secret_file {
        Some(path) => Some(
            Secret::from_file(path)
                .map_err(|e| config_error(format!("--failsafe-accepted-secret-file: {e}")))?,
        ),
        None => None,
    };
    Ok(Some(FailsafeSettings {
        peer_addr,
        keys: Keys::new(secret, accepted),
        max_outage,
    }))
}

/// Failsafe is off: refuse each of its other flags, named.
fn refuse_without_failsafe(args: &FailsafeArgs) -> Result<(), ConfigError> {
    let set: Vec<&str> = [
        ("--peer-addr", args.peer_addr.is_some()),
        (
            "--failsafe-secret-file",
            args.failsafe_secret_file.is_some(),
        ),
        (
            "--failsafe-accepted-secret-file",
            args.failsafe_accepted_secret_file.is_some(),
        ),
        ("--failsafe-max-outage", args.failsafe_max_outage.is_some()),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    if set.is_empty() {
        return Ok(());
    }
    Err(config_error(format!(
        "{} set without --failsafe: it has no effect\nhint: add --failsafe, or leave it out",
        set.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(peer: Option<&str>, file: Option<PathBuf>) -> FailsafeArgs {
        FailsafeArgs {
            failsafe: true,
            peer_addr: peer.map(str::to_owned),
            failsafe_secret_file: file,
            ..FailsafeArgs::default()
        }
    }

    const L: Duration = Duration::from_secs(15);

    #[test]
    fn each_bad_failsafe_flag_is_named() {
        let dir = std::env::temp_dir().join(format!("le-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (short, good) = (dir.join("short"), dir.join("good"));
        std::fs::write(&short, "too short\n").unwrap();
        std::fs::write(&good, "0123456789abcdef\n").unwrap();
        let msg = |r: Result<Option<FailsafeSettings>, ConfigError>| r.unwrap_err().to_string();
        assert!(msg(resolve(&args(None, Some(good.clone())), None, L)).contains("--peer-addr"));
        assert!(
            msg(resolve(&args(Some("x"), Some(good.clone())), None, L)).contains("--peer-addr")
        );
        assert!(
            msg(resolve(&args(Some("127.0.0.1:1"), None), None, L))
                .contains("--failsafe-secret-file")
        );
        let m = msg(resolve(&args(Some("127.0.0.1:1"), Some(short)), None, L));
        assert!(
            m.contains("--failsafe-secret-file") && m.contains("16"),
            "{m}"
        );
        let short_outage = FailsafeArgs {
            failsafe_max_outage: Some(Duration::from_secs(10)),
            ..args(None, Some(good.clone()))
        };
        let m = msg(resolve(&short_outage, Some("10.1.2.3"), L));
        assert!(
            m.contains("--failsafe-max-outage (10s)") && m.contains("--lease-duration (15s)"),
            "{m}"
        );
        let bad_accepted = FailsafeArgs {
            failsafe_accepted_secret_file: Some(dir.join("absent")),
            ..args(None, Some(good.clone()))
        };
        let m = msg(resolve(&bad_accepted, Some("10.1.2.3"), L));
        assert!(m.contains("--failsafe-accepted-secret-file"), "{m}");
        let ok = resolve(&args(None, Some(good)), Some("10.1.2.3"), L)
            .unwrap()
            .unwrap();
        assert_eq!(ok.peer_addr.to_string(), "10.1.2.3:4042");
        assert!(
            resolve(&FailsafeArgs::default(), None, L)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn each_failsafe_flag_without_failsafe_is_refused_by_name() {
        let msg = |a: &FailsafeArgs| resolve(a, None, L).unwrap_err().to_string();
        let cases = [
            (
                "--peer-addr",
                FailsafeArgs {
                    peer_addr: Some("1.2.3.4:5".into()),
                    ..FailsafeArgs::default()
                },
            ),
            (
                "--failsafe-max-outage",
                FailsafeArgs {
                    failsafe_max_outage: Some(Duration::from_secs(60)),
                    ..FailsafeArgs::default()
                },
            ),
            (
                "--failsafe-accepted-secret-file",
                FailsafeArgs {
                    failsafe_accepted_secret_file: Some(PathBuf::from("/absent")),
                    ..FailsafeArgs::default()
                },
            ),
        ];
        for (flag, off) in cases {
            let m = msg(&off);
            assert!(m.contains(&format!("{flag} set without --failsafe")), "{m}");
        }
    }
}
