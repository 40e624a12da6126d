//! The help's limits: `-h` fits a screen, no line is wider than
//! [`HELP_WIDTH`], every flag has a heading, each command's help lists only
//! the flags it reads.

use super::*;

/// Every command's (short, long) help, by name.
fn helps() -> Vec<(String, String, String)> {
    let mut top = command();
    top.build();
    let mut out = vec![(
        "leader-elector".to_owned(),
        top.render_help().to_string(),
        top.render_long_help().to_string(),
    )];
    for sub in top.get_subcommands_mut() {
        out.push((
            sub.get_name().to_owned(),
            sub.render_help().to_string(),
            sub.render_long_help().to_string(),
        ));
    }
    out
}

#[test]
fn short_help_fits_a_screen_and_no_line_is_wider_than_100() {
    for (name, short, long) in helps() {
        for line in short.lines().chain(long.lines()) {
            assert!(
                line.chars().count() <= HELP_WIDTH,
                "{name}: {} chars: {line}",
                line.chars().count()
            );
        }
        assert!(
            short.lines().count() <= 60,
            "{name} -h: {} lines\n{short}",
            short.lines().count()
        );
    }
}

#[test]
fn each_command_lists_only_the_flags_it_reads() {
    let helps = helps();
    let long = |n: &str| helps.iter().find(|h| h.0 == n).unwrap().2.clone();
    // The flags a help lists: its lines that start with one.
    let flags = |n: &str| -> Vec<String> {
        long(n)
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .map(|l| format!("--{}", l.split([' ', '=']).next().unwrap_or("")))
            .collect()
    };
    let (sidecar, status, run) = (flags("leader-elector"), flags("status"), flags("run"));
    let has = |v: &Vec<String>, f: &str| v.iter().any(|x| x == f);
    for flag in [
        "--kill-grace",
        "--on-child-exit",
        "--start-failures",
        "--every",
    ] {
        assert!(!has(&sidecar, flag), "the sidecar's help lists {flag}");
        assert!(has(&run, flag), "run's help lacks {flag}");
    }
    for flag in [
        "--migrate-from-endpoints",
        "--use-cluster-credentials",
        "--redis-min-replicas",
    ] {
        assert!(!has(&status, flag), "status --help lists {flag}");
        assert!(has(&sidecar, flag), "the sidecar's help lacks {flag}");
    }
    for heading in [
        "Election:",
        "etcd:",
        "Redis:",
        "Kubernetes:",
        "Timing:",
        "HTTP:",
        "Operations:",
        "Logging:",
    ] {
        assert!(long("leader-elector").contains(heading), "no {heading}");
    }
    assert!(long("run").contains("Run mode:"));
}

#[test]
fn every_flag_has_a_heading_and_its_environment_variable_follows_the_rule() {
    let mut top = command();
    top.build();
    let mut cmds = vec![top.clone()];
    cmds.extend(top.get_subcommands().cloned());
    for cmd in &cmds {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if a.is_positional() || ["help", "version"].contains(&id) {
                continue;
            }
            assert!(
                a.get_help_heading().is_some(),
                "{} --{id} has no help heading: add it to cli::HEADINGS",
                cmd.get_name()
            );
            if let (Some(env), Some(long)) = (a.get_env(), a.get_long()) {
                let want = format!("LEADER_ELECTOR_{}", long.to_uppercase().replace('-', "_"));
                assert_eq!(env.to_string_lossy(), want, "--{long}");
            }
        }
    }
}

#[test]
fn the_help_is_the_same_whatever_the_terminal() {
    let a = command().render_long_help().to_string();
    let b = command().render_long_help().to_string();
    assert_eq!(a, b);
}
