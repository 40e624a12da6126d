//! `--max-clock-skew` and `--migrate-from-endpoints` as parsed and checked
//! from the command line.

use std::time::Duration;

use clap::Parser;

use super::{KUBE_PRESENT, KubeSettings};
use crate::config::{Cli, Config};

fn skew(args: &[&str]) -> Result<Option<Duration>, String> {
    KUBE_PRESENT.with(|c| c.set(Some(true)));
    let mut full = vec!["leader-elector", "--election=a", "--id=me"];
    full.extend_from_slice(args);
    let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
    let c = Config::from_cli(cli).map_err(|e| e.to_string())?;
    let any: &dyn std::any::Any = c.backend.as_ref();
    let kube: &KubeSettings = any.downcast_ref().expect("the Kubernetes backend");
    Ok(kube.options.max_clock_skew)
}

#[test]
fn max_clock_skew_is_off_by_default_and_parsed_when_given() {
    assert_eq!(skew(&[]).unwrap(), None);
    assert_eq!(
        skew(&["--max-clock-skew=2s"]).unwrap(),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        skew(&["--max-clock-skew=15s"]).unwrap(),
        Some(Duration::from_secs(15))
    );
}

#[test]
fn max_clock_skew_must_be_positive_and_at_most_the_lease_duration() {
    for bad in ["--max-clock-skew=0s", "--max-clock-skew=16s"] {
        let e = skew(&[bad]).unwrap_err();
        assert!(e.contains("--max-clock-skew ("), "{e}");
        assert!(e.contains("at most --lease-duration (15s)"), "{e}");
    }
    let e = skew(&["--max-clock-skew=10s", "--lease-duration=5s"]).unwrap_err();
    assert!(e.contains("--max-clock-skew (10s)"), "{e}");
    let e = skew(&["--max-clock-skew=soon"]).unwrap_err();
    assert!(e.contains("--max-clock-skew"), "{e}");
}

fn settings(args: &[&str]) -> Result<Config, String> {
    KUBE_PRESENT.with(|c| c.set(Some(true)));
    let mut full = vec!["leader-elector", "--election=a", "--id=me"];
    full.extend_from_slice(args);
    let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
    Config::from_cli(cli).map_err(|e| e.to_string())
}

#[test]
fn migrate_from_endpoints_is_off_by_default_and_only_for_kubernetes() {
    let bridged = |args: &[&str]| {
        let c = settings(args).unwrap();
        let any: &dyn std::any::Any = c.backend.as_ref();
        let kube: &KubeSettings = any.downcast_ref().expect("the Kubernetes backend");
        kube.migrate_from_endpoints
    };
    assert!(!bridged(&[]));
    assert!(bridged(&["--migrate-from-endpoints"]));
    assert!(bridged(&["--migrate-from-endpoints=true"]));
    assert!(!bridged(&["--migrate-from-endpoints=false"]));
    for other in [
        &["--etcd-endpoints=http://127.0.0.1:2379"][..],
        &["--backend=redis", "--redis-url=redis://127.0.0.1:6379"][..],
    ] {
        let mut args = other.to_vec();
        args.push("--migrate-from-endpoints");
        let e = settings(&args).unwrap_err();
        assert!(
            e.contains("--migrate-from-endpoints works only with --backend kubernetes"),
            "{e}"
        );
    }
}

#[test]
fn failsafe_is_accepted_on_leases_and_refused_with_the_endpoints_bridge() {
    KUBE_PRESENT.with(|c| c.set(Some(true)));
    let dir = std::env::temp_dir().join(format!("le-fsk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "0123456789abcdef\n").unwrap();
    let secret = format!("--failsafe-secret-file={}", secret.display());
    let parse = |extra: &[&str]| {
        let mut full = vec![
            "leader-elector",
            "--election=a",
            "--id=me",
            "--failsafe",
            "--peer-addr=127.0.0.1:0",
            &secret,
        ];
        full.extend_from_slice(extra);
        let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
        Config::from_cli(cli).map(|_| ()).map_err(|e| e.to_string())
    };
    parse(&[]).expect("--failsafe on the Lease backend");
    let e = parse(&["--migrate-from-endpoints"]).unwrap_err();
    assert!(
        e.contains("--failsafe") && e.contains("--migrate-from-endpoints"),
        "{e}"
    );
    // The conflict of two flags is named before anything about the
    // machine: with no Kubernetes client configuration either, the user
    // learns first that the flags cannot go together.
    KUBE_PRESENT.with(|c| c.set(Some(false)));
    let e = parse(&["--backend=kubernetes", "--migrate-from-endpoints"]).unwrap_err();
    assert!(
        e.contains("--failsafe cannot be used with --migrate-from-endpoints"),
        "{e}"
    );
}
