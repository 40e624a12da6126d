//! The generated references of the book stay true to the code:
//!
//! - `docs/src/reference/cli.md` is the `--help` of the binary and of each
//!   of its commands (the clap definitions), verbatim;
//! - `docs/src/reference/metrics.md` lists exactly the metrics the sidecar
//!   registers: every metric a sidecar serves on etcd, on Redis and on the
//!   Kubernetes API stand-in (after one lock taken and released, so the
//!   coordination metrics are served too), and every metric name the
//!   source registers (a failure counter is served only after a failure);
//! - every metric a panel of the Grafana dashboard
//!   (`charts/leader-elector/dashboards/leader-elector.json`) queries is
//!   served by a real sidecar.
//!
//! `DOCS_WRITE=1` makes the page tests write the pages instead of comparing
//! (`scripts/gen-docs` runs them so): the CLI page whole, the metrics page
//! with a row added for a metric it lacks (type and help from the scrape or
//! the source) and the rows of metrics no longer registered removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::kubernetes::NS;
use crate::support::kube_api::KubeApi;
use crate::support::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn writing() -> bool {
    std::env::var_os("DOCS_WRITE").is_some_and(|v| v == "1")
}

/// Compare `page` with `want`, or write it under `DOCS_WRITE=1`.
fn compare_or_write(page: &Path, want: &str, what: &str) {
    if writing() {
        std::fs::write(page, want).unwrap();
        eprintln!("wrote {}", page.display());
        return;
    }
    let have = std::fs::read_to_string(page).unwrap_or_default();
    if have != want {
        let diff: Vec<String> = want
            .lines()
            .zip(have.lines().chain(std::iter::repeat("")))
            .enumerate()
            .filter(|(_, (w, h))| w != h)
            .take(5)
            .map(|(i, (w, h))| format!("line {}: page {h:?}, code {w:?}", i + 1))
            .collect();
        panic!(
            "{} differs from {what} (regenerate with scripts/gen-docs):\n{}",
            page.display(),
            diff.join("\n")
        );
    }
}

fn help_of(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The CLI page: `leader-elector --help`, then each visible command's.
fn cli_page() -> String {
    use clap::CommandFactory;
    let top = leader_elector::cli::Top::command();
    let mut page = String::from(
        "# CLI reference\n\n\
         Generated from the clap definitions (`src/cli.rs`, `src/config/`, each backend's\n\
         flag group) by `scripts/gen-docs`: the `--help` of the binary and of each command,\n\
         verbatim. `tests/suite/docs_refs.rs` fails when this page and the code differ.\n\
         Every flag also reads the environment variable shown; the details of each flag\n\
         (ranges, defaults, what it trades) are in [Flags in detail](../configuration.md).\n\n",
    );
    page += &format!(
        "## `leader-elector` (the sidecar)\n\n```text\n{}```\n",
        help_of(&[])
    );
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_name();
        page += &format!(
            "\n## `leader-elector {name}`\n\n```text\n{}```\n",
            help_of(&[name])
        );
    }
    page
}

#[test]
fn cli_page_is_the_help_of_every_command() {
    let page = repo().join("docs/src/reference/cli.md");
    compare_or_write(&page, &cli_page(), "the binary's --help");
}

/// Metric families in a Prometheus text scrape: name → type.
fn families(scrape: &str) -> BTreeMap<String, String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_owned(), t.trim().to_owned()))
        .collect()
}

/// Help texts in a scrape: name → help.
fn helps(scrape: &str) -> BTreeMap<String, String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, h)| (n.to_owned(), h.to_owned()))
        .collect()
}

const PREFIXES: [&str; 2] = ["leader_election_", "dist_lock"];

/// Metric names registered in the source: string literals of a metric
/// name, each with the next literal (its help) and the constructor named
/// just before it (its type), from every non-test file under `src/`.
fn source_metrics() -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    let mut files = vec![repo().join("src")];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".rs") || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        let lits: Vec<(usize, &str)> = text
            .match_indices('"')
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0], &text[c[0] + 1..c[1]]))
            .collect();
        for (k, (at, lit)) in lits.iter().enumerate() {
            let is_name = PREFIXES.iter().any(|p| lit.starts_with(p))
                && lit.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            if !is_name {
                continue;
            }
            let help = lits.get(k + 1).map_or("", |l| l.1).to_owned();
            let before = &text[at.saturating_sub(400)..*at];
            let kind = [
                ("Histogram", "histogram"),
                ("Gauge", "gauge"),
                ("GAUGES", "gauge"),
                ("Counter", "counter"),
                ("COUNTERS", "counter"),
                ("BY_REASON", "counter"),
            ]
            .iter()
            .filter_map(|(k, t)| before.rfind(k).map(|i| (i, *t)))
            .max()
            .map_or("gauge", |(_, t)| t);
            out.insert((*lit).to_owned(), (kind.to_owned(), help));
        }
    }
    out
}

/// The metric names in the page's tables (first column, labels cut).
fn page_metrics(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split(['`', '{']).next())
        .filter(|n| PREFIXES.iter().any(|p| n.starts_with(p)))
        .map(str::to_owned)
        .collect()
}

/// A test sidecar's flags, with the control API on (the lock).
fn flags() -> Vec<&'static str> {
    [FAST, CONTROL].concat()
}

/// A sidecar's scrape once it leads, taken while it holds a lock through its
/// control API (`dist_locks_active` counts live grants only), then released.
async fn scrape(s: &Sidecar) -> String {
    wait_for(Duration::from_secs(20), "the sidecar to lead", || {
        s.is_leader()
    })
    .await;
    let (st, body) = http_json(
        s.control(),
        "POST",
        "/locks/docs-refs?ttl=5s",
        None,
        HTTP_LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(st, 200, "lock: {body}");
    let token = body["token"].as_str().unwrap().to_owned();
    let (st, text) = http_get(s.port, "/metrics").await.unwrap();
    assert_eq!(st, 200);
    let release = serde_json::json!({ "token": token }).to_string();
    let (st, body) = http_json(
        s.control(),
        "DELETE",
        "/locks/docs-refs",
        Some(&release),
        HTTP_LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(st, 200, "release: {body}");
    text
}

/// The check (or, under `DOCS_WRITE=1`, the update) of the metrics page
/// against one backend's scrape and the source.
fn check_metrics_page(backend: &str, scrape: &str) {
    let path = repo().join("docs/src/reference/metrics.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let listed = page_metrics(&page);
    let served = families(scrape);
    let source = source_metrics();
    let known: BTreeSet<&String> = served.keys().chain(source.keys()).collect();
    let missing: Vec<&String> = known
        .iter()
        .copied()
        .filter(|n| !listed.contains(*n))
        .collect();
    let extra: Vec<&String> = listed.iter().filter(|n| !known.contains(n)).collect();
    if writing() {
        let helps = helps(scrape);
        let rows = missing.iter().map(|n| {
            let (kind, help) = source.get(*n).cloned().unwrap_or_default();
            let kind = served.get(*n).cloned().unwrap_or(kind);
            let help = helps.get(*n).cloned().unwrap_or(help);
            let help = help.trim_end_matches('.').to_lowercase();
            format!("| `{n}` | {kind} | {help} |")
        });
        std::fs::write(&path, update_page(&page, rows.collect(), &extra)).unwrap();
        return;
    }
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/src/reference/metrics.md and the sidecar on {backend} differ \
         (regenerate with scripts/gen-docs, then describe the new rows):\n\
         served or registered but not on the page: {missing:?}\n\
         on the page but neither served nor registered: {extra:?}"
    );
}

/// The page with `rows` added to the end of its first table whose metrics
/// share their prefix, and the rows of `gone` removed.
fn update_page(page: &str, rows: Vec<String>, gone: &[&String]) -> String {
    let mut lines: Vec<String> = page
        .lines()
        .filter(|l| !gone.iter().any(|g| l.starts_with(&format!("| `{g}"))))
        .map(str::to_owned)
        .collect();
    for row in rows {
        let prefix = PREFIXES.iter().find(|p| row[3..].starts_with(*p)).unwrap();
        let last = lines
            .iter()
            .rposition(|l| l.starts_with(&format!("| `{prefix}")))
            .unwrap_or(lines.len() - 1);
        lines.insert(last + 1, row);
    }
    lines.join("\n") + "\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_lists_what_a_sidecar_on_etcd_serves() {
    let etcd = Etcd::start().await;
    let s = Sidecar::start(&etcd.url, &election("docs-metrics"), "solo", &flags());
    check_metrics_page("etcd", &scrape(&s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_lists_what_a_sidecar_on_redis_serves() {
    let redis = RedisServer::start().await;
    // A fresh Redis server is refused for one lease duration + 1 s.
    let s = redis_sidecar(&[&redis.url], &election("docs-metrics"), "solo", &flags());
    check_metrics_page("Redis", &scrape(&s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_lists_what_a_sidecar_on_kubernetes_serves() {
    let api = KubeApi::start(NS);
    let ep = api.endpoint("solo").await;
    let kubeconfig = ep.kubeconfig().to_string_lossy().into_owned();
    let mut args = vec!["--backend".to_owned(), "kubernetes".to_owned()];
    args.extend(flags().iter().map(|a| a.to_string()));
    let s = Sidecar::start_env(
        &election("docs-metrics"),
        "solo",
        &args,
        &[("KUBECONFIG", &kubeconfig)],
    );
    check_metrics_page("Kubernetes", &scrape(&s).await);
}

/// The metric names a PromQL expression names (a histogram's `_bucket`,
/// `_sum` and `_count` series are its family's).
fn promql_metrics(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut rest = expr;
    while let Some(i) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let tail = &rest[i..];
        let end = tail.find(|c| !ident(c)).unwrap_or(tail.len());
        let word = &tail[..end];
        let quoted = rest[..i].ends_with('"');
        if !quoted && PREFIXES.iter().any(|p| word.starts_with(p)) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(word);
            out.insert(family.to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// Every `expr` in the dashboard, with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = repo().join("charts/leader-elector/dashboards/leader-elector.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap_or("?").to_owned();
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push((title.clone(), t["expr"].as_str().unwrap().to_owned()));
        }
    }
    let vars = dash["templating"]["list"].as_array().into_iter().flatten();
    for v in vars.filter(|v| v["type"] == "query") {
        if let Some(q) = v["query"]["query"].as_str().or(v["query"].as_str()) {
            out.push((
                "variable ".to_owned() + v["name"].as_str().unwrap_or("?"),
                q.to_owned(),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_names_served_metrics() {
    let queries = dashboard_queries();
    assert!(
        queries.len() >= 7,
        "the dashboard has {} queries",
        queries.len()
    );
    let etcd = Etcd::start().await;
    let s = Sidecar::start(&etcd.url, &election("docs-dashboard"), "solo", &flags());
    let served = families(&scrape(&s).await);
    let mut unknown = Vec::new();
    for (title, expr) in &queries {
        let names = promql_metrics(expr);
        assert!(
            !names.is_empty(),
            "panel {title:?} queries no metric: {expr}"
        );
        unknown.extend(
            names
                .into_iter()
                .filter(|n| !served.contains_key(n))
                .map(|n| format!("{n} (panel {title:?})")),
        );
    }
    assert!(unknown.is_empty(), "not served by a sidecar: {unknown:?}");
}

#[test]
fn promql_names_are_found_and_label_values_skipped() {
    let names = promql_metrics(
        r#"histogram_quantile(0.99, sum by (le) (rate(leader_election_renew_duration_seconds_bucket{name=~"$election"}[5m]))) + on() dist_locks_active{lock_name="leader_election_x"}"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "dist_locks_active",
            "leader_election_renew_duration_seconds"
        ]
    );
}

/// The coordination page states the `ttl` a request without one gets, as
/// the code has it (the defaults were nowhere in the docs).
#[test]
fn coordination_page_states_the_ttl_used_when_none_is_given() {
    use leader_elector::coord::http::{DEFAULT_JOB_TTL, DEFAULT_TTL};
    let page = std::fs::read_to_string(repo().join("docs/src/coordination.md")).unwrap();
    assert_eq!(
        (DEFAULT_TTL, DEFAULT_JOB_TTL),
        (Duration::from_secs(30), Duration::from_secs(300))
    );
    assert!(
        page.contains("**when `ttl` is omitted**: 30 s for a lock, a semaphore permit or a read-write lock (and their renewals), 5 min for a job claim"),
        "docs/src/coordination.md does not state the default ttls"
    );
}
