//! Unit tests of flag parsing and validation.
use super::*;
use clap::Parser;

use crate::backend::etcd::flags::EtcdSettings;
use crate::backend::kubernetes::flags::KubeSettings;
use crate::backend::redis::flags::RedisSettings;

fn cli(args: &[&str]) -> Result<Config, String> {
    let mut full = vec!["leader-elector"];
    full.extend_from_slice(args);
    let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
    Config::from_cli(cli).map_err(|e| e.to_string())
}

const EP: &str = "--etcd-endpoints=http://127.0.0.1:2379";

fn settings<T: 'static>(c: &Config) -> &T {
    let any: &dyn std::any::Any = c.backend.as_ref();
    any.downcast_ref()
        .unwrap_or_else(|| panic!("another backend: {:?}", c.backend))
}

fn etcd(c: &Config) -> &EtcdSettings {
    settings(c)
}

fn redis(c: &Config) -> &RedisSettings {
    settings(c)
}

fn kube(c: &Config) -> &KubeSettings {
    settings(c)
}

#[test]
fn defaults_follow_the_design() {
    let c = cli(&["--election", "a", "--identity", "me", EP]).unwrap();
    assert_eq!(c.elector.lease_duration, Duration::from_secs(15));
    assert_eq!(c.elector.renew_interval, Duration::from_secs(5));
    assert_eq!(c.elector.retry_period, Duration::from_secs(2));
    assert_eq!(c.http_addr, "0.0.0.0:4040".parse().unwrap());
    assert_eq!(etcd(&c).key, "/leader-elector/a");
}

#[test]
fn old_sidecar_aliases_are_accepted() {
    let c = cli(&["--election=a", "--id=me", "--ttl=10s", "--http=:4041", EP]).unwrap();
    assert_eq!(c.elector.identity, "me");
    assert_eq!(c.elector.lease_duration, Duration::from_secs(10));
    assert_eq!(c.http_addr, "0.0.0.0:4041".parse().unwrap());
}

#[test]
fn renew_interval_must_be_shorter_than_the_ttl() {
    let e = cli(&[
        "--election=a",
        "--id=me",
        "--lease-duration=15s",
        "--renew-interval=20s",
        EP,
    ])
    .unwrap_err();
    assert!(
        e.contains("--renew-interval (20s) must be shorter than --lease-duration (15s)"),
        "{e}"
    );
}

#[test]
fn bad_values_name_the_flag() {
    let e = cli(&["--election=a", "--id=me", "--lease-duration=fast", EP]).unwrap_err();
    assert!(e.contains("--lease-duration"), "{e}");
    let e = cli(&["--election=", "--id=me", EP]).unwrap_err();
    assert!(e.contains("--election"), "{e}");
    let e = cli(&["--election=a", "--id=me", "--etcd-endpoints=127.0.0.1:2379"]).unwrap_err();
    assert!(e.contains("--etcd-endpoints"), "{e}");
    let e = cli(&[
        "--election=a",
        "--id=me",
        "--etcd-endpoints=http://h:1/path",
    ])
    .unwrap_err();
    assert!(e.contains("--etcd-endpoints"), "{e}");
    let e = cli(&["--election=a", "--id=me", "--backend=etcd"]).unwrap_err();
    assert!(e.contains("--etcd-endpoints is required"), "{e}");
    let e = cli(&["--election=a b", "--id=me", EP]).unwrap_err();
    assert!(e.contains("--election (a b)"), "{e}");
}

#[test]
fn tls_flags_are_checked_together() {
    let e = cli(&["--election=a", "--id=me", "--etcd-endpoints=https://h:2379"]).unwrap_err();
    assert!(e.contains("--etcd-ca-file"), "{e}");
    let e = cli(&["--election=a", "--id=me", EP, "--etcd-username=u"]).unwrap_err();
    assert!(e.contains("--etcd-password-file"), "{e}");
    let e = cli(&[
        "--election=a",
        "--id=me",
        "--etcd-endpoints=https://h:2379",
        "--etcd-ca-file=/nonexistent",
    ])
    .unwrap_err();
    assert!(
        e.contains("--etcd-ca-file (/nonexistent) cannot be read"),
        "{e}"
    );
}

#[test]
fn several_endpoints_split_on_commas() {
    let c = cli(&[
        "--election=a",
        "--id=me",
        "--etcd-endpoints=http://a:1,http://b:2",
    ])
    .unwrap();
    assert_eq!(etcd(&c).options.endpoints, vec!["http://a:1", "http://b:2"]);
}

#[test]
fn backend_choice_is_explicit_when_both_are_given() {
    let e = cli(&["--election=a", "--id=me", EP, "--redis-url=redis://h:1"]).unwrap_err();
    assert!(e.contains("--backend etcd or --backend redis"), "{e}");
    let c = cli(&[
        "--election=a",
        "--id=me",
        EP,
        "--redis-url=redis://h:1",
        "--backend=redis",
    ])
    .unwrap();
    assert_eq!(c.backend.name(), "redis");
    let c = cli(&["--election=a", "--id=me", "--redis-url=redis://h:1"]).unwrap();
    assert_eq!(c.backend.name(), "redis");
    let e = cli(&["--election=a", "--id=me", "--backend=redis", EP]).unwrap_err();
    assert!(e.contains("--redis-url is required"), "{e}");
}

#[test]
fn redis_urls_repeat_or_split_on_commas_and_are_checked() {
    let c = cli(&[
        "--election=a",
        "--id=me",
        "--redis-url=redis://h:1",
        "--redis-url=redis://h:2,redis://h:3",
    ])
    .unwrap();
    let options = &redis(&c).options;
    assert_eq!(options.urls.len(), 3);
    assert_eq!(options.per_server_timeout, Duration::from_millis(500));
    // The registry and controls re-read: the lease duration, at least 5 s.
    assert_eq!(redis(&c).reread, Duration::from_secs(15));
    let short = cli(&[
        "--election=a",
        "--id=me",
        "--redis-url=redis://h:1",
        "--lease-duration=2s",
    ]);
    assert_eq!(redis(&short.unwrap()).reread, Duration::from_secs(5));
    let e = cli(&["--election=a", "--id=me", "--redis-url=http://u:secret@h:1"]).unwrap_err();
    assert!(e.contains("--redis-url") && !e.contains("secret"), "{e}");
}

use crate::backend::kubernetes::flags::KUBE_PRESENT;

#[test]
fn auto_without_any_backend_or_kubernetes_config_is_a_usage_error() {
    KUBE_PRESENT.with(|c| c.set(Some(false)));
    let e = cli(&["--election=a", "--id=me"]).unwrap_err();
    assert!(e.contains("no backend is configured"), "{e}");
    assert!(e.contains("KUBECONFIG"), "{e}");
    let e = cli(&["--election=a", "--id=me", "--backend=kubernetes"]).unwrap_err();
    assert!(e.contains("needs a Kubernetes client configuration"), "{e}");
}

#[test]
fn auto_without_etcd_or_redis_is_the_kubernetes_lease() {
    KUBE_PRESENT.with(|c| c.set(Some(true)));
    let c = cli(&[
        "--election=my-app",
        "--id=me",
        "--election-namespace=team-a",
        "--use-cluster-credentials",
    ])
    .unwrap();
    let KubeSettings { name, options, .. } = kube(&c);
    assert_eq!(name, "my-app");
    assert_eq!(options.namespace.as_deref(), Some("team-a"));
    // The old image's flag spelled with a value is accepted too.
    let c = cli(&[
        "--election=my-app",
        "--id=me",
        "--backend=kubernetes",
        "--use-cluster-credentials=false",
    ])
    .unwrap();
    assert_eq!(c.backend.name(), "kubernetes");
    // A given endpoint still picks its backend.
    let c = cli(&["--election=my-app", "--id=me", EP]).unwrap();
    assert_eq!(c.backend.name(), "etcd");
}

#[test]
fn kubernetes_names_are_checked() {
    KUBE_PRESENT.with(|c| c.set(Some(true)));
    let e = cli(&["--election=My_App", "--id=me", "--backend=kubernetes"]).unwrap_err();
    assert!(e.contains("DNS subdomain"), "{e}");
    let e = cli(&[
        "--election=a",
        "--id=me",
        "--backend=kubernetes",
        "--election-namespace=Bad_NS",
    ])
    .unwrap_err();
    assert!(e.contains("--election-namespace (Bad_NS)"), "{e}");
}

/// A range error points at the book's table of flags (it named "the
/// README's table", which lives in the book).
#[test]
fn a_range_error_points_at_the_books_flag_table() {
    let e = cli(&["--election=a", "--id=me", EP, "--lease-duration=1000y"]).unwrap_err();
    assert!(e.contains("the book's table of flags and ranges"), "{e}");
    assert!(e.contains("docs/src/configuration.md"), "{e}");
    assert!(!e.contains("README"), "{e}");
}

/// Every setting that cannot work stops start-up, naming the flag.
#[test]
fn unworkable_values_are_refused_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--lease-duration=1000y"],
            "--lease-duration (365250d) must be between 1s and 1h",
        ),
        (
            &["--renew-interval=1ms"],
            "--renew-interval (1ms) must be between 100ms and 1h",
        ),
        (&["--completed-retention=1000y"], "--completed-retention"),
        (&["--health-interval=1ns"], "--health-interval (1ns)"),
        (&["--drain-timeout=100y"], "--drain-timeout"),
        (&["--resign-cooldown=100y"], "--resign-cooldown"),
        (&["--retry-period=100y"], "--retry-period"),
        (&["--health-grace=100y"], "--health-grace"),
        (&["--header-read-timeout=0s"], "--header-read-timeout"),
        (&["--request-body-timeout=1h"], "--request-body-timeout"),
        (&["--max-connections=0"], "--max-connections (0)"),
        (
            &["--coord-max-waiters=0"],
            "--coord-max-waiters (0) must be between 1 and 65536",
        ),
        (
            &["--coord-max-waiters=65537"],
            "--coord-max-waiters (65537)",
        ),
        (&["--log-level="], "--log-level must not be empty"),
        (&["--log-level=info,[bad"], "--log-level"),
        (
            &["--etcd-username=", "--etcd-password-file=/dev/null"],
            "--etcd-username must not be empty",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["--election=a", "--id=me", EP];
        args.extend_from_slice(extra);
        let e = cli(&args).expect_err(want);
        assert!(e.contains(want), "{extra:?}: {e}");
    }
}

#[test]
fn etcd_endpoints_with_port_0_or_credentials_are_refused_without_echoing_the_secret() {
    let e = cli(&["--election=a", "--id=me", "--etcd-endpoints=http://h:0"]).unwrap_err();
    assert!(
        e.contains("--etcd-endpoints") && e.contains("port 0"),
        "{e}"
    );
    let e = cli(&[
        "--election=a",
        "--id=me",
        "--etcd-endpoints=http://user:secret@h:2379",
    ])
    .unwrap_err();
    assert!(
        e.contains("--etcd-endpoints") && e.contains("--etcd-username"),
        "{e}"
    );
    assert!(
        e.contains("--etcd-password-file") && !e.contains("secret"),
        "{e}"
    );
    let e = cli(&[
        "--election=a",
        "--id=me",
        "--redis-url=redis+unix:///run/r.sock?pass=secret",
    ])
    .unwrap_err();
    assert!(e.contains("--redis-url") && !e.contains("secret"), "{e}");
}

#[test]
fn an_empty_or_non_pem_ca_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    for (file, want) in [(&empty, "is empty"), (&junk, "holds no PEM CERTIFICATE")] {
        let ca = format!("--etcd-ca-file={}", file.display());
        let e = cli(&[
            "--election=a",
            "--id=me",
            "--etcd-endpoints=https://h:2379",
            &ca,
        ])
        .unwrap_err();
        assert!(e.contains("--etcd-ca-file") && e.contains(want), "{e}");
    }
}

#[test]
fn listener_limits_default_and_parse() {
    let c = cli(&["--election=a", "--id=me", EP]).unwrap();
    assert_eq!(c.limits, crate::serve::Limits::default());
    let c = cli(&[
        "--election=a",
        "--id=me",
        EP,
        "--max-connections=10",
        "--header-read-timeout=2s",
        "--request-body-timeout=3s",
    ])
    .unwrap();
    assert_eq!(c.limits.max_connections, 10);
    assert_eq!(c.limits.header_read_timeout, Duration::from_secs(2));
    assert_eq!(c.limits.body_timeout, Duration::from_secs(3));
}

#[test]
fn coord_max_waiters_defaults_parses_and_is_refused_outside_its_range() {
    let c = cli(&["--election=a", "--id=me", EP]).unwrap();
    assert_eq!(c.coord_max_waiters, crate::coord::DEFAULT_MAX_WAITERS);
    let c = cli(&["--election=a", "--id=me", EP, "--coord-max-waiters=1"]).unwrap();
    assert_eq!(c.coord_max_waiters, 1);
    let c = cli(&["--election=a", "--id=me", EP, "--coord-max-waiters=65536"]).unwrap();
    assert_eq!(c.coord_max_waiters, 65536);
    for bad in ["0", "65537", "-1", "lots"] {
        let flag = format!("--coord-max-waiters={bad}");
        let e = cli(&["--election=a", "--id=me", EP, &flag]).unwrap_err();
        assert!(e.contains("--coord-max-waiters"), "{bad}: {e}");
    }
}

#[test]
fn redis_min_replicas_defaults_to_off_parses_and_says_what_is_allowed() {
    let url = "--redis-url=redis://h:1";
    let min = |c: Config| redis(&c).options.min_replicas;
    assert_eq!(min(cli(&["--election=a", "--id=me", url]).unwrap()), 0);
    let c = cli(&["--election=a", "--id=me", url, "--redis-min-replicas=1"]).unwrap();
    assert_eq!(min(c), 1);
    let c = cli(&[
        "--election=a",
        "--id=me",
        url,
        "--redis-min-replicas",
        "100",
    ])
    .unwrap();
    assert_eq!(min(c), 100);
    for bad in ["-1", "101", "1.5", "one", ""] {
        let e = cli(&["--election=a", "--id=me", url, "--redis-min-replicas", bad]).unwrap_err();
        assert!(e.contains("--redis-min-replicas"), "{bad}: {e}");
        assert!(e.contains("from 0 (off, the default) to 100"), "{bad}: {e}");
    }
}

#[test]
fn shards_on_redis_need_one_server() {
    let base = ["--election=a", "--id=me", "--shards=16"];
    let with = |more: &[&str]| cli(&[&base[..], more].concat());
    let c = with(&["--redis-url=redis://h:1"]).unwrap();
    assert_eq!(c.shards, Some(16));
    assert!(c.backend.connect().unwrap().shards.is_some());
    let refused: [&[&str]; 3] = [
        &["--redis-url=redis://h:1,redis://h:2,redis://h:3"],
        &["--redis-cluster", "--redis-url=redis://h:1"],
        &["--redis-sentinel=h:26379", "--redis-sentinel-master=m"],
    ];
    for more in refused {
        let e = with(more)
            .err()
            .unwrap_or_else(|| panic!("{more:?} accepted"));
        assert!(e.contains("--shards cannot go with"), "{more:?}: {e}");
        assert!(e.contains("give one --redis-url"), "{more:?}: {e}");
    }
    let c = cli(&[
        "--election=a",
        "--id=me",
        "--redis-url=redis://h:1,redis://h:2,redis://h:3",
    ]);
    assert_eq!(c.unwrap().shards, None, "no --shards, no check");
}

fn run_cli(args: &[&str]) -> Result<Config, String> {
    let mut full = vec!["leader-elector"];
    full.extend_from_slice(args);
    let cli = Cli::try_parse_from(full).map_err(|e| e.to_string())?;
    Config::from_cli_mode(cli, true).map_err(|e| e.to_string())
}

#[test]
fn every_needs_run_mode_whole_seconds_and_job_claims() {
    let base = ["--election", "a", "--identity", "me", EP];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        a
    };
    let c = run_cli(&with(&["--every", "5m", "--", "true"])).unwrap();
    assert_eq!(c.run.unwrap().every, Some(Duration::from_secs(300)));
    for bad in ["0s", "1500ms"] {
        let e = run_cli(&with(&["--every", bad, "--", "true"])).unwrap_err();
        assert!(e.contains("--every") && e.contains("whole seconds"), "{e}");
    }
    let e = run_cli(&with(&["--every", "soon", "--", "true"])).unwrap_err();
    assert!(e.contains("--every"), "{e}");
    let e = cli(&with(&["--every", "5m"])).unwrap_err();
    assert!(e.contains("--every needs run mode"), "{e}");
    let run = run_cli(&with(&["--every", "5m", "--", "true"]))
        .unwrap()
        .run;
    assert!(check_every_backend(run.as_ref(), "no-such-backend").is_err());
    assert!(check_every_backend(run.as_ref(), "etcd").is_ok());
}

#[test]
fn every_keeps_no_drain_for_its_command() {
    let args = ["--election", "a", "--identity", "me", EP, "--every", "1s"];
    let c = run_cli(&[&args[..], &["--", "true"]].concat()).unwrap();
    assert_eq!(c.elector.drain_timeout, None);
    assert_eq!(c.elector.release_wait, None);
}

#[test]
fn priority_preemption_and_revision_fill_the_standing() {
    let base = ["--election", "a", "--identity", "me", EP];
    let c = cli(&base).unwrap();
    assert_eq!(c.elector.standing, crate::elector::Standing::default());
    assert_eq!(c.elector.standing.priority, 1);
    assert_eq!(c.elector.standing.preempt_after, Duration::from_secs(10));
    let given = [
        "--priority",
        "0",
        "--preempt-after",
        "3s",
        "--revision",
        " 5d9f ",
    ];
    let c = cli(&[&base[..], &given[..]].concat()).unwrap();
    let s = &c.elector.standing;
    assert_eq!((s.priority, s.preempt_after), (0, Duration::from_secs(3)));
    assert_eq!(s.revision, "5d9f");
    let e = cli(&[&base[..], &["--preempt-after", "2d"]].concat()).unwrap_err();
    assert!(
        e.contains("--preempt-after (2d) must be between 0s and 1d"),
        "{e}"
    );
    for given in [&["--priority=-1"][..], &["--priority", "-1"][..]] {
        let e = cli(&[&base[..], given].concat()).unwrap_err();
        assert!(
            e.contains("--priority") && e.contains("must not be negative"),
            "{e}"
        );
    }
    let e = cli(&[&base[..], &["--priority", "high"]].concat()).unwrap_err();
    assert!(
        e.contains("--priority") && e.contains("not a whole number"),
        "{e}"
    );
}
