//! The backends the sidecar can be started on, one row each: its name (the
//! `--backend` value), its clap flag group, how `--backend auto` recognises
//! it, the `resolve` that turns its flags into checked settings, and the
//! `connect` of those settings, which gives the election backend and the
//! coordination API (or none) over one connection.
//!
//! Adding a backend is a folder `src/backend/<name>/` (its election, its
//! coordination if any, its `flags.rs` with a group and a `resolve`), one
//! field in [`BackendArgs`] and one row in [`ROWS`]; the configuration, the
//! app, `main` and the operator commands name no backend.
//!
//! Invariant: the backend is chosen once, at start-up, from the flags alone;
//! two backends at once could elect two leaders, so `auto` refuses flags of
//! two backends instead of picking one.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser};

use super::coordination::Coordinator;
use super::{CandidateRegistry, ControlStore, LeaseBackend};
use crate::flags::{ConfigError, config_error};

/// The backend choice and every backend's connection flags: one group,
/// flattened into the sidecar's flags and the operator commands' alike.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Election")]
pub struct BackendArgs {
    /// Which backend: auto picks etcd with --etcd-endpoints, Redis with --redis-url, else a Lease.
    ///
    /// Which backend to use; auto picks etcd when --etcd-endpoints is given, Redis when --redis-url is given, else a Kubernetes Lease.
    #[arg(long, default_value = AUTO, env = "LEADER_ELECTOR_BACKEND", value_parser = backend_names(), value_name = "BACKEND")]
    pub backend: String,

    /// etcd connection.
    #[cfg(feature = "etcd")]
    #[command(flatten)]
    pub etcd: super::etcd::flags::EtcdArgs,

    /// Redis connection.
    #[cfg(feature = "redis")]
    #[command(flatten)]
    pub redis: super::redis::flags::RedisArgs,

    /// Kubernetes backend.
    #[cfg(feature = "kubernetes")]
    #[command(flatten)]
    pub kubernetes: super::kubernetes::flags::KubeArgs,
}

/// The registered backends, in the order `--backend` lists them.
pub const ROWS: &[Row] = &[
    #[cfg(feature = "etcd")]
    super::etcd::flags::ROW,
    #[cfg(feature = "redis")]
    super::redis::flags::ROW,
    #[cfg(feature = "kubernetes")]
    super::kubernetes::flags::ROW,
];

/// The `--backend` value that picks a backend from the flags given.
pub const AUTO: &str = "auto";

/// One registered backend.
pub struct Row {
    /// The `--backend` value, and the name in logs, metrics and `/leader`.
    pub name: &'static str,
    /// One line for `--backend`'s list of values.
    pub help: &'static str,
    /// How `--backend auto` recognises it.
    pub auto: Auto,
    /// Check this backend's flags against the common settings; the flags
    /// `--backend auto` recognised it by are given unless `chosen_by_auto`
    /// is false.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag at fault and the fix.
    pub resolve: Resolve,
    /// What of the coordination API it serves (e.g. "locks, semaphores, job
    /// claims"), for the answers of backends that serve none; `None` when
    /// it serves none.
    pub coordination: Option<&'static str>,
    /// Whether it keeps a failsafe roster (`--failsafe` is refused otherwise).
    pub failsafe: bool,
    /// Whether it keeps shard records (`--shards` is refused otherwise).
    pub shards: bool,
}

/// A row's `resolve`: its flags and the common settings (and whether
/// `--backend auto` chose it) to its checked settings.
pub type Resolve = fn(&BackendArgs, &Common, bool) -> Result<Arc<dyn Settings>, ConfigError>;

/// How `--backend auto` recognises a backend.
pub enum Auto {
    /// By a flag that only this backend has, when it is given.
    Flag {
        /// The flag, e.g. `--etcd-endpoints`.
        flag: &'static str,
        /// The flag with an example value, for the "no backend" message.
        example: &'static str,
        /// Whether the flag is given.
        given: fn(&BackendArgs) -> bool,
    },
    /// When no backend's flag is given, if its environment is present.
    Fallback {
        /// Whether the environment it needs is there.
        present: fn() -> bool,
        /// What to do to use it, for the "no backend" message.
        hint: &'static str,
    },
}

/// What every backend's settings may depend on besides its own flags.
#[derive(Clone, Debug)]
pub struct Common {
    /// The election name (already checked: letters, digits, `-_.`).
    pub election: String,
    /// The lease TTL (`--lease-duration`).
    pub lease_duration: Duration,
    /// `--renew-interval` as given; `None`: the default, a third of the TTL.
    pub renew_interval: Option<Duration>,
    /// The deadline of one election call (two thirds of the renew interval).
    pub call_timeout: Duration,
}

/// A backend's checked settings: everything needed to connect, read from
/// the flags and the files they name at start-up.
pub trait Settings: Debug + Send + Sync + Any {
    /// The backend's name (its row's).
    fn name(&self) -> &'static str;
    /// Build the election backend and, when the backend serves it, the
    /// coordination API over the same connection. Connections are opened
    /// lazily, on the first call.
    ///
    /// # Errors
    /// What cannot be used, in words (e.g. a Redis URL the client library
    /// refuses).
    fn connect(&self) -> Result<Connected, String>;
}

/// A backend ready to use.
pub struct Connected {
    /// The election backend.
    pub election: Arc<dyn LeaseBackend>,
    /// The coordination API over the same connection; `None` when the
    /// backend serves none.
    pub coordination: Option<Box<dyn Coordinator>>,
    /// The candidate registry over the same connection; `None` when the
    /// backend keeps none (the Elector then names no successor).
    pub registry: Option<Arc<dyn CandidateRegistry>>,
    /// The operator controls over the same connection; `None` when the
    /// backend keeps none (never paused; `pause` and `switchover` refused).
    pub controls: Option<Arc<dyn ControlStore>>,
    /// The failsafe roster over the same connection; `None` when the
    /// backend keeps none (then `--failsafe` is refused).
    pub roster: Option<Arc<dyn super::roster::RosterStore>>,
    /// The shard records over the same connection; `None` when the
    /// backend keeps none (then `--shards` is refused).
    pub shards: Option<Arc<dyn super::shards::ShardStore>>,
}

fn backend_names() -> PossibleValuesParser {
    let auto = PossibleValue::new(AUTO)
        .help("the backend whose connection flags are given, else a Kubernetes Lease");
    PossibleValuesParser::new(
        std::iter::once(auto).chain(ROWS.iter().map(|r| PossibleValue::new(r.name).help(r.help))),
    )
}

/// The row named `name`.
pub fn row(name: &str) -> Option<&'static Row> {
    ROWS.iter().find(|r| r.name == name)
}

/// The backend `--backend` names, or for `auto` the one whose flag is given
/// (the fallback when none is), checked by its own `resolve`.
///
/// # Errors
/// A [`ConfigError`]: flags of two backends with `auto`, no backend at all,
/// or the chosen backend's own error.
pub fn resolve(args: &BackendArgs, common: &Common) -> Result<Arc<dyn Settings>, ConfigError> {
    let settings = choose(args, common)?;
    #[cfg(feature = "kubernetes")]
    super::kubernetes::flags::check_only_here(args, settings.name())?;
    Ok(settings)
}

/// Flags of a backend that `--failsafe` cannot go with (`on`: it is given).
///
/// # Errors
/// A [`ConfigError`] (exit 2) naming both flags.
pub fn check_failsafe(args: &BackendArgs, on: bool) -> Result<(), ConfigError> {
    #[cfg(feature = "kubernetes")]
    super::kubernetes::flags::check_failsafe(args, on)?;
    let _ = (args, on);
    Ok(())
}

/// `--shards` (`on`: given) on the backend `chosen`: refused when its row
/// keeps no shard records, or its own flags name a set-up that keeps none
/// (Redis: Redlock, Sentinel, Cluster).
///
/// # Errors
/// A [`ConfigError`] (exit 2) naming `--shards` and the fix.
pub fn check_shards(args: &BackendArgs, chosen: &str, on: bool) -> Result<(), ConfigError> {
    if on && !row(chosen).is_some_and(|r| r.shards) {
        return Err(config_error(format!(
            "--shards: the {chosen} backend keeps no shard records yet\nhint: shards are built on etcd and one Redis server; leave --shards at 0 here"
        )));
    }
    #[cfg(feature = "redis")]
    if chosen == super::redis::flags::ROW.name {
        super::redis::flags::check_shards(&args.redis, on)?;
    }
    let _ = args;
    Ok(())
}

/// [`resolve`] before the checks of flags another backend owns.
fn choose(args: &BackendArgs, common: &Common) -> Result<Arc<dyn Settings>, ConfigError> {
    if let Some(row) = row(&args.backend) {
        return (row.resolve)(args, common, false);
    }
    let given: Vec<&Row> = ROWS
        .iter()
        .filter(|r| matches!(r.auto, Auto::Flag { given, .. } if given(args)))
        .collect();
    match given.as_slice() {
        [row] => (row.resolve)(args, common, true),
        [] => {
            let fallback = ROWS
                .iter()
                .find(|r| matches!(r.auto, Auto::Fallback { present, .. } if present()));
            match fallback {
                Some(row) => (row.resolve)(args, common, true),
                None => Err(config_error(no_backend())),
            }
        }
        more => {
            let flags: Vec<&str> = more.iter().map(|r| flag_of(r)).collect();
            let names: Vec<String> = more
                .iter()
                .map(|r| format!("--backend {}", r.name))
                .collect();
            Err(config_error(format!(
                "both {} are given: choose one with {}\nhint: the backend is fixed at start-up; two backends at once could elect two leaders",
                flags.join(" and "),
                names.join(" or ")
            )))
        }
    }
}

fn flag_of(row: &Row) -> &'static str {
    match row.auto {
        Auto::Flag { flag, .. } => flag,
        Auto::Fallback { .. } => "",
    }
}

/// "no backend is configured: give --etcd-endpoints (e.g. …) or …, or …".
fn no_backend() -> String {
    let flags: Vec<&str> = ROWS
        .iter()
        .filter_map(|r| match r.auto {
            Auto::Flag { example, .. } => Some(example),
            Auto::Fallback { .. } => None,
        })
        .collect();
    let mut text = format!("no backend is configured: give {}", flags.join(" or "));
    for r in ROWS {
        if let Auto::Fallback { hint, .. } = r.auto {
            text.push_str(", or ");
            text.push_str(hint);
        }
    }
    text
}

/// The answer of every coordination call on `backend`, which serves none:
/// which backends do, and what each serves.
pub fn unserved_message(backend: &str) -> String {
    let serving: Vec<String> = ROWS
        .iter()
        .filter_map(|r| {
            r.coordination
                .map(|what| format!("--backend {} ({what})", r.name))
        })
        .collect();
    format!(
        "the coordination API (locks, semaphores, job claims) is not served by the {backend} backend: use {}; leadership works on all {}",
        serving.join(" or "),
        count_word(ROWS.len())
    )
}

fn count_word(n: usize) -> String {
    match n {
        2 => "two".into(),
        3 => "three".into(),
        4 => "four".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart offers exactly the registered backends (and `auto`), and
    /// its values document each: the chart's `backend` enum is a copy of
    /// the registry, checked here.
    #[test]
    fn the_charts_backend_choice_is_the_registry() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/leader-elector");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("values.schema.json")).unwrap())
                .unwrap();
        let offered: Vec<&str> = schema["properties"]["backend"]["enum"]
            .as_array()
            .expect("values.schema.json: properties.backend.enum")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let registered: Vec<&str> = std::iter::once(AUTO)
            .chain(ROWS.iter().map(|r| r.name))
            .collect();
        assert_eq!(offered, registered, "the chart's backend enum");
        let values = std::fs::read_to_string(dir.join("values.yaml")).unwrap();
        let doc = values
            .lines()
            .find(|l| l.starts_with("## @param backend "))
            .expect("values.yaml documents backend");
        for name in &registered {
            assert!(doc.contains(&format!("`{name}`")), "{doc} names {name}");
        }
    }

    #[test]
    fn auto_refuses_two_backends_and_names_the_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            b: BackendArgs,
        }
        let f = Flags::parse_from([
            "x",
            "--etcd-endpoints=http://127.0.0.1:2379",
            "--redis-url=redis://127.0.0.1:6379",
        ]);
        let common = Common {
            election: "e".into(),
            lease_duration: Duration::from_secs(15),
            renew_interval: None,
            call_timeout: Duration::from_secs(3),
        };
        let e = resolve(&f.b, &common).unwrap_err().to_string();
        assert!(
            e.starts_with("both --etcd-endpoints and --redis-url are given"),
            "{e}"
        );
        assert!(e.contains("--backend etcd or --backend redis"), "{e}");
        let f = Flags::parse_from(["x", "--etcd-endpoints=http://127.0.0.1:2379"]);
        assert_eq!(resolve(&f.b, &common).unwrap().name(), "etcd");
    }

    /// Every backend that keeps a candidate registry and operator controls
    /// delivers them beside the election, over the same connection.
    #[tokio::test]
    async fn the_registry_and_the_controls_come_with_the_election() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            b: BackendArgs,
        }
        let common = Common {
            election: "e".into(),
            lease_duration: Duration::from_secs(15),
            renew_interval: None,
            call_timeout: Duration::from_secs(3),
        };
        for flag in [
            "--etcd-endpoints=http://127.0.0.1:2379",
            "--redis-url=redis://127.0.0.1:6379",
        ] {
            let f = Flags::parse_from(["x", flag]);
            let c = resolve(&f.b, &common).unwrap().connect().unwrap();
            let name = c.election.name();
            assert!(c.registry.is_some(), "{name} keeps a registry");
            assert!(c.controls.is_some(), "{name} keeps controls");
            assert!(c.coordination.is_some(), "{name} serves coordination");
            assert!(c.roster.is_some(), "{name} keeps a failsafe roster");
        }
    }

    #[test]
    fn a_backend_without_coordination_names_those_with_it() {
        let m = unserved_message("kubernetes");
        assert!(m.contains("not served by the kubernetes backend"), "{m}");
        assert!(m.contains("--backend etcd (locks, fair locks"), "{m}");
        assert!(
            m.contains("--backend redis (one server or a Redlock group"),
            "{m}"
        );
    }
}
