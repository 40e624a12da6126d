//! The operator's commands, no sidecar needed:
//! `leader-elector status` (who leads an election, once),
//! `leader-elector observe` (one line per leadership change until
//! interrupted, as `etcdctl elect --listen` does, for every backend), and
//! `pause`, `resume` and `switchover` (the operator controls, `controls`).
//!
//! Invariant: these commands never campaign, renew or resign. `status` and
//! `observe` only read, through the same [`LeaseBackend`](crate::backend::LeaseBackend) as the sidecar
//! (`inspect`, `read`, `watch`), so running them cannot change who leads;
//! the control commands write the election's controls only, which the
//! sidecars follow.
//!
//! Exit codes of `status`: 0 someone leads, 3 nobody leads (the key is free),
//! 4 the holder's time left reads 0 (possibly expired; the warning says
//! what that means on the backend read), 1 the backend could not be read,
//! 2 bad flags. `observe` exits 0 on
//! SIGINT/SIGTERM (or when its output is closed), 2 on bad flags; backend
//! errors are reported on stderr and retried.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde::Serialize;

use crate::backend::Holder;
use crate::backend::registry::{self, BackendArgs, Common, Connected};
use crate::config::{check_election, parse_duration};

mod candidates;
mod controls;
mod observe;
pub use candidates::CandidateRow;
pub use controls::{EXIT_NOT_DONE, EXIT_REFUSED, SwitchoverCli, pause_main, switchover_main};
pub use observe::observe;
use observe::stop_signal;

/// Exit code of `status` when nobody leads the election.
pub const EXIT_NO_LEADER: u8 = 3;

/// Exit code of `status` when the holder's time left reads 0: it may be
/// dead, and nobody may lead (the warning says what that means on the
/// backend read: its `About::expiry`).
pub const EXIT_POSSIBLY_EXPIRED: u8 = 4;

/// Flags of `leader-elector status` and `leader-elector observe`.
#[derive(Parser, Debug, Clone)]
pub struct OpsCli {
    /// Name of the election to read (status, observe) or to control (pause,
    /// resume, switchover).
    #[arg(long, env = "LEADER_ELECTOR_ELECTION", value_name = "NAME")]
    pub election: String,

    /// The backend and its connection flags (the sidecar's own group).
    #[command(flatten)]
    pub store: BackendArgs,

    /// Output format: a table (status) or plain lines (observe), or JSON (one object per line).
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,

    /// Deadline of each backend call.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
}

/// Output format (`-o`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Human-readable.
    Table,
    /// JSON, one object per line.
    Json,
}

/// What `status` prints as JSON (and `observe -o json` per change).
#[derive(Serialize, Debug, PartialEq)]
pub struct Report {
    /// The election.
    pub election: String,
    /// The backend read (`etcd`, `redis`).
    pub backend: &'static str,
    /// The holder identity; `null` when nobody leads.
    pub leader: Option<String>,
    /// Fencing token of the current term.
    pub fencing_token: Option<u64>,
    /// The backend's id of the term (etcd: lease id in hex; Redis: random token).
    pub term_id: Option<String>,
    /// How long the term's lease has left without a renewal, in seconds,
    /// where the backend tells it (etcd: whole seconds).
    pub lease_remaining_seconds: Option<f64>,
    /// When the term started, as observed by `observe` (RFC 3339); `status`
    /// cannot tell: neither backend stores the acquisition time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// `status` only, where the backend keeps operator controls: whether
    /// the election is paused (`leader-elector pause`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// `status` only: the member a forced switchover pinned as leader.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    /// `status` only, where the backend keeps a candidate registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates: Option<Vec<CandidateRow>>,
    /// `status` only, once a failsafe leader wrote one: the failsafe
    /// roster, the members that confirm a leader through a backend outage
    /// (see the book's Failsafe page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failsafe_roster: Option<Vec<crate::backend::roster::Member>>,
}

impl Report {
    fn new(election: &str, backend: &'static str, holder: Option<&Holder>) -> Report {
        Report {
            election: election.to_owned(),
            backend,
            leader: holder.map(|h| h.identity.clone()),
            fencing_token: holder.map(|h| h.fencing_token),
            term_id: holder.map(|h| h.term_id.to_string()),
            lease_remaining_seconds: holder
                .and_then(|h| h.expires_in)
                .map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0),
            since: None,
            paused: None,
            pinned: None,
            candidates: None,
            failsafe_roster: None,
        }
    }
}

/// `leader-elector status`: read once, print, exit with the status code.
pub fn status_main(cli: &OpsCli) -> ExitCode {
    block_on(cli, |backend| async move {
        status(cli, &backend, &mut std::io::stdout()).await
    })
}

/// `leader-elector observe`: one line per change until SIGINT/SIGTERM, or
/// until its stdout or stderr is closed.
pub fn observe_main(cli: &OpsCli) -> ExitCode {
    block_on(cli, |backend| async move {
        let out = &mut std::io::stdout();
        observe(cli, backend.election.as_ref(), out, stop_signal()).await
    })
}

/// Connect (exit 2 on bad flags), then run `command` on a one-thread
/// runtime (exit 1 when the runtime cannot start).
fn block_on<F, Fut>(cli: &OpsCli, command: F) -> ExitCode
where
    F: FnOnce(Connected) -> Fut,
    Fut: std::future::Future<Output = u8>,
{
    let backend = match connect(cli) {
        Ok(b) => b,
        Err(e) => {
            crate::say!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            crate::say!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    ExitCode::from(runtime.block_on(command(backend)))
}

/// The lease TTL the read-only commands assume for the backend settings
/// that depend on it (the sidecar's default).
const ASSUMED_LEASE_DURATION: Duration = Duration::from_secs(15);

/// Build the read-only backend from the flags, through the backend
/// registry, with the sidecar's own checks (so the messages are the same).
///
/// # Errors
/// The configuration error's message, naming the flag.
pub fn connect(cli: &OpsCli) -> Result<Connected, String> {
    check_election(&cli.election).map_err(|e| e.to_string())?;
    let common = Common {
        election: cli.election.clone(),
        lease_duration: ASSUMED_LEASE_DURATION,
        renew_interval: None,
        call_timeout: cli.timeout,
    };
    let settings = registry::resolve(&cli.store, &common).map_err(|e| e.to_string())?;
    settings.connect()
}

/// `status`: read once, print, and return the exit code.
pub async fn status(cli: &OpsCli, connected: &Connected, out: &mut dyn Write) -> u8 {
    let backend = connected.election.as_ref();
    let holder = match tokio::time::timeout(cli.timeout, backend.inspect()).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            crate::say!("error: {}{}", e.report_once(), failsafe_hint(connected));
            return 1;
        }
        Err(_) => {
            crate::say!(
                "error: {} did not answer within {} (--timeout){}",
                backend.name(),
                crate::flags::format_duration(cli.timeout),
                failsafe_hint(connected)
            );
            return 1;
        }
    };
    let mut report = Report::new(&cli.election, backend.name(), holder.as_ref());
    let controls = controls::paused(connected, cli.timeout).await;
    report.paused = controls.as_ref().map(|c| c.0);
    report.pinned = controls.and_then(|c| c.1);
    report.candidates = candidates::read(connected.registry.as_deref(), cli.timeout).await;
    report.failsafe_roster = failsafe_roster(connected, cli.timeout).await;
    let text = match cli.output {
        Output::Json => serde_json::to_string(&report).unwrap_or_default(),
        Output::Table => {
            table(&report)
                + &controls::paused_line(report.paused, report.pinned.as_deref())
                + &candidates::table(report.candidates.as_deref())
                + &roster_line(report.failsafe_roster.as_deref())
        }
    };
    // A closed output (`| head -c 1`) is not a failure of the command.
    crate::console::Lines::new(out).put(&text);
    match &holder {
        None => EXIT_NO_LEADER,
        // A backend that reports the time left reports 0 for a holder whose
        // term may be over; what that means is the backend's to say.
        Some(h) if h.expires_in == Some(Duration::ZERO) => {
            crate::say!(
                "warning: holder {} is possibly expired (it may be dead and nobody may lead): {}",
                h.identity,
                backend.about().expiry
            );
            EXIT_POSSIBLY_EXPIRED
        }
        Some(_) => 0,
    }
}

/// When the backend cannot be read and keeps a failsafe roster: where to
/// look instead, as a tail for the one error line (scripts read one line).
fn failsafe_hint(connected: &Connected) -> &'static str {
    if connected.roster.is_some() {
        " (with --failsafe a leader may lead on through a backend outage: a sidecar's /leader says so in its \"failsafe\" field)"
    } else {
        ""
    }
}

/// The failsafe roster the election record holds, where the backend keeps
/// one and a failsafe leader wrote it; `None` otherwise (or when it cannot
/// be read within `limit`: the table above already says the backend
/// answered).
async fn failsafe_roster(
    connected: &Connected,
    limit: Duration,
) -> Option<Vec<crate::backend::roster::Member>> {
    let store = connected.roster.as_ref()?;
    match tokio::time::timeout(limit, store.roster()).await {
        Ok(Ok(Some(r))) => Some(r.members),
        _ => None,
    }
}

/// The table's failsafe line: the roster members and their peer addresses.
fn roster_line(members: Option<&[crate::backend::roster::Member]>) -> String {
    let Some(members) = members else {
        return String::new();
    };
    let list: Vec<String> = members
        .iter()
        .map(|m| format!("{} ({})", m.identity, m.peer_addr))
        .collect();
    format!("\n\nFAILSAFE ROSTER: {}", list.join(", "))
}

fn table(r: &Report) -> String {
    let dash = || "-".to_owned();
    let rows = [
        ("ELECTION", r.election.clone()),
        ("BACKEND", r.backend.to_owned()),
        (
            "LEADER",
            r.leader.clone().unwrap_or_else(|| "(none)".into()),
        ),
        (
            "FENCING TOKEN",
            r.fencing_token.map_or_else(dash, |t| t.to_string()),
        ),
        (
            "LEASE LEFT",
            r.lease_remaining_seconds
                .map_or_else(dash, |s| format!("{s:.1}s")),
        ),
        ("TERM", r.term_id.clone().unwrap_or_else(dash)),
    ];
    let head: Vec<String> = rows
        .iter()
        .map(|(h, v)| format!("{h:<w$}", w = h.len().max(v.len())))
        .collect();
    let vals: Vec<String> = rows
        .iter()
        .map(|(h, v)| format!("{v:<w$}", w = h.len().max(v.len())))
        .collect();
    format!(
        "{}\n{}",
        head.join("  ").trim_end(),
        vals.join("  ").trim_end()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::backend::{Campaign, LeaseBackend};

    fn cli(output: &str) -> OpsCli {
        OpsCli::try_parse_from(["status", "--election", "billing", "-o", output]).unwrap()
    }

    #[test]
    fn table_lines_up_headers_and_values() {
        let h = Holder {
            identity: "pod-a".into(),
            fencing_token: 42,
            term_id: crate::backend::TermId::new("694d"),
            revision: Some(7),
            expires_in: Some(Duration::from_millis(11_240)),
        };
        let t = table(&Report::new("billing", "etcd", Some(&h)));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(
            lines[0].starts_with("ELECTION  BACKEND  LEADER  FENCING TOKEN  LEASE LEFT  TERM"),
            "{t}"
        );
        assert!(
            lines[1].starts_with("billing   etcd     pod-a   42             11.2s       694d"),
            "{t}"
        );
        let none = table(&Report::new("billing", "redis", None));
        assert!(none.contains("(none)"), "{none}");
    }

    #[tokio::test]
    async fn status_exit_codes_and_json() {
        let backend = MemoryBackend::new();
        let mut out = Vec::new();
        assert_eq!(
            status(&cli("json"), &backend.connected(), &mut out).await,
            EXIT_NO_LEADER
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["leader"], serde_json::Value::Null);
        assert_eq!(v["election"], "billing");

        let c = cli("json");
        let Campaign::Elected(_) = backend
            .campaign("pod-a", Duration::from_secs(5), None)
            .await
            .unwrap()
        else {
            panic!("the free memory backend did not elect");
        };
        let mut out = Vec::new();
        assert_eq!(status(&c, &backend.connected(), &mut out).await, 0);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["leader"], "pod-a");
        assert!(v["fencing_token"].as_u64().is_some(), "{v}");
    }

    #[tokio::test(start_paused = true)]
    async fn observe_prints_one_line_per_change_and_stops() {
        let backend = MemoryBackend::new();
        let c = cli("table");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut out = Vec::new();
        let watcher = observe(&c, &backend, &mut out, async {
            let _ = stop_rx.await;
        });
        let driver = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            backend
                .campaign("pod-a", Duration::from_secs(5), None)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            backend.delete_key();
            tokio::time::sleep(Duration::from_secs(3)).await;
            stop_tx.send(()).unwrap();
        };
        let (code, ()) = tokio::join!(watcher, driver);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(code, 0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].ends_with("nobody leads billing"), "{out}");
        assert!(
            lines[1].contains("pod-a leads billing (fencing token"),
            "{out}"
        );
        assert!(lines[2].ends_with("nobody leads billing"), "{out}");
    }
}
