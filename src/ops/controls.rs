//! `leader-elector pause|resume` and `leader-elector switchover`: the
//! election's operator controls (`backend::controls`), written through the
//! backend from anywhere, like `status` reads it. These commands write the
//! controls only, never the election key: the sidecars follow them (a pause
//! is kept by every campaign, a switchover request is acted on by the
//! leader), so they cannot make two leaders.
//!
//! Exit codes of `switchover`: 0 the target holds the term (or already
//! did), 3 nobody leads (nothing to hand over), 5 refused (the target is
//! unknown, lapsed, not ready or of priority 0; the election is paused; the
//! backend keeps no registry), 6 the target did not lead within `--wait`
//! (the request is withdrawn), 1 the backend could not be read or written,
//! 2 bad flags. `pause` and `resume`: 0 done, 1 the backend failed or
//! keeps no controls, 2 bad flags.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use super::{EXIT_NO_LEADER, OpsCli, Output, block_on};
use crate::backend::controls::{Controls, Request};
use crate::backend::registry::Connected;
use crate::backend::{BackendError, ControlStore, Holder, LeaseBackend};
use crate::config::parse_duration;
use crate::elector::{SwitchoverRefusal, check_target};

/// Exit code of `switchover` when it is refused (see the module docs).
pub const EXIT_REFUSED: u8 = 5;

/// Exit code of `switchover` when the target did not lead within `--wait`.
pub const EXIT_NOT_DONE: u8 = 6;

/// How often `switchover` reads the key while it waits for the target.
const POLL: Duration = Duration::from_millis(50);

/// Flags of `leader-elector switchover`.
#[derive(Parser, Debug, Clone)]
pub struct SwitchoverCli {
    /// The election and the backend, as for `status`.
    #[command(flatten)]
    pub ops: OpsCli,

    /// The candidate to hand over to: its identity as `leader-elector status` lists it.
    #[arg(long, value_name = "ID")]
    pub to: String,

    /// How long to wait for the target to hold the term before giving up (and withdrawing the request); a switchover issued while nobody leads (a handover in flight) first waits for the next leader within it.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub wait: Duration,

    /// Hand over even to a lower priority or an older revision than the best ready candidate, and pin the target as leader (no preemption or rolling-update handover moves the term from it until it leaves or a new switchover).
    #[arg(long)]
    pub force: bool,
}

/// `leader-elector pause` (`paused`) or `resume`: set the marker, print the state.
pub fn pause_main(cli: &OpsCli, paused: bool) -> ExitCode {
    block_on(cli, |backend| async move {
        pause(cli, &backend, paused, &mut std::io::stdout()).await
    })
}

/// `leader-elector switchover`: check the target, ask, wait for it to lead.
pub fn switchover_main(cli: &SwitchoverCli) -> ExitCode {
    block_on(&cli.ops, |backend| async move {
        switchover(cli, &backend, &mut std::io::stdout()).await
    })
}

/// One backend call within `limit`; the error as the line to print.
async fn call<T>(
    backend: &dyn LeaseBackend,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, BackendError>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.report_once()),
        Err(_) => Err(format!(
            "{} did not answer within {} (--timeout)",
            backend.name(),
            crate::flags::format_duration(limit)
        )),
    }
}

/// The backend's operator controls, or the line to print when it keeps none.
fn store(backend: &Connected) -> Result<&dyn ControlStore, String> {
    backend.controls.as_deref().ok_or_else(|| {
        format!(
            "the {} backend keeps no operator controls (pause, switchover)",
            backend.election.name()
        )
    })
}

/// Whether the election is paused and who is pinned by a forced
/// switchover, for `status`: `None` when the backend keeps no controls, or
/// they could not be read within `limit` (a warning on stderr: the leader
/// is still reported).
pub(super) async fn paused(
    connected: &Connected,
    limit: Duration,
) -> Option<(bool, Option<String>)> {
    let controls = connected.controls.as_deref()?;
    let backend = connected.election.as_ref();
    match call(backend, limit, controls.controls()).await {
        Ok(c) => Some((c.paused, c.pinned().map(str::to_owned))),
        Err(e) => {
            crate::say!("warning: cannot read the operator controls: {e}");
            None
        }
    }
}

/// The pause and the pin as lines below the status table (empty unless
/// paused or pinned).
pub(super) fn paused_line(paused: Option<bool>, pinned: Option<&str>) -> String {
    let mut out = String::new();
    if paused == Some(true) {
        out.push_str("\n\nPAUSED: no candidate takes a released or expired term until `leader-elector resume`");
    }
    if let Some(p) = pinned {
        out.push_str(&format!("\n\nPINNED: {p} (a forced switchover): no preemption or rolling-update handover moves the term from it until it leaves or a new switchover"));
    }
    out
}

/// `pause`/`resume`: set the marker, then print the controls and the
/// leader. Returns the exit code.
pub async fn pause(cli: &OpsCli, connected: &Connected, paused: bool, out: &mut dyn Write) -> u8 {
    let limit = cli.timeout;
    let backend = connected.election.as_ref();
    let read = async {
        let store = store(connected)?;
        call(backend, limit, store.set_paused(paused)).await?;
        let controls = call(backend, limit, store.controls()).await?;
        let holder = call(backend, limit, backend.read()).await?;
        Ok::<_, String>((controls, holder))
    };
    let (controls, holder) = match read.await {
        Ok(r) => r,
        Err(e) => {
            crate::say!("error: {e}");
            return 1;
        }
    };
    let text = match cli.output {
        Output::Json => state_json(cli, backend, &controls, holder.as_ref()).to_string(),
        Output::Table => state_line(cli, &controls, holder.as_ref()),
    };
    // A closed output (`| head -c 1`) is not a failure of the command.
    crate::console::Lines::new(out).put(&text);
    0
}

fn state_json(
    cli: &OpsCli,
    backend: &dyn LeaseBackend,
    c: &Controls,
    holder: Option<&Holder>,
) -> serde_json::Value {
    json!({
        "election": cli.election,
        "backend": backend.name(),
        "paused": c.paused,
        "switchover": c.switchover,
        "leader": holder.map(|h| &h.identity),
        "fencing_token": holder.map(|h| h.fencing_token),
    })
}

fn state_line(cli: &OpsCli, c: &Controls, holder: Option<&Holder>) -> String {
    let leader = match holder {
        Some(h) => format!("{} leads (fencing token {})", h.identity, h.fencing_token),
        None => "nobody leads".to_owned(),
    };
    let what = if c.paused {
        "paused: no candidate takes a released or expired term until `leader-elector resume`; a leader keeps its term"
    } else {
        "not paused: failover works"
    };
    format!("election {}: {what}; {leader}", cli.election)
}

/// `switchover`: check the target against the registry, write the
/// request, and wait up to `--wait` for the target to hold the term.
/// Returns the exit code (see the module docs).
pub async fn switchover(cli: &SwitchoverCli, connected: &Connected, out: &mut dyn Write) -> u8 {
    let (limit, to) = (cli.ops.timeout, cli.to.as_str());
    let backend = connected.election.as_ref();
    let store = match store(connected) {
        Ok(s) => s,
        Err(e) => {
            crate::say!("error: {e}");
            return 1;
        }
    };
    let from = match check(cli, connected, store).await {
        Ok(Some(from)) => from,
        Ok(None) => return print(cli, out, to, None, true),
        Err(code) => return code,
    };
    let force = cli.force;
    let request = Request::Switchover { to, force }.encode();
    if let Err(e) = call(backend, limit, store.request_switchover(Some(&request))).await {
        crate::say!("error: {e}");
        return 1;
    }
    let deadline = tokio::time::Instant::now() + cli.wait;
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        match call(backend, limit, backend.read()).await {
            Ok(Some(h)) if h.identity == to => return print(cli, out, &from, Some(&h), true),
            Ok(h) => last = Some(h),
            Err(e) => crate::say!("warning: {e}"),
        }
        tokio::time::sleep(POLL).await;
    }
    not_done(cli, (backend, store), last.flatten().as_ref()).await
}

/// Whether the switchover may be asked for: `Ok(Some(leader))` yes,
/// `Ok(None)` the target leads already, `Err(exit code)` no (printed).
async fn check(
    cli: &SwitchoverCli,
    connected: &Connected,
    store: &dyn ControlStore,
) -> Result<Option<String>, u8> {
    let (limit, to) = (cli.ops.timeout, cli.to.as_str());
    let backend = connected.election.as_ref();
    let read = async {
        let holder = call(backend, limit, backend.read()).await?;
        let controls = call(backend, limit, store.controls()).await?;
        let listed = match connected.registry.as_deref() {
            Some(r) => Some(call(backend, limit, r.candidates()).await?),
            None => None,
        };
        Ok::<_, String>((holder, controls, listed))
    };
    let (mut holder, controls, listed) = read.await.map_err(|e| {
        crate::say!("error: {e}");
        1
    })?;
    // A handover in flight (nobody holds the key for a moment): wait for
    // the next leader within --wait, then act.
    let deadline = tokio::time::Instant::now() + cli.wait;
    while holder.is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        holder = call(backend, limit, backend.read()).await.unwrap_or(None);
    }
    let Some(leader) = holder.map(|h| h.identity) else {
        crate::say!(
            "error: nobody leads election {}: nothing to hand over",
            cli.ops.election
        );
        return Err(EXIT_NO_LEADER);
    };
    if leader == to {
        return Ok(None);
    }
    let now = std::time::SystemTime::now();
    let refusal = match listed {
        _ if controls.paused => Some(SwitchoverRefusal::Paused),
        None => Some(SwitchoverRefusal::NoRegistry),
        Some(listed) => check_target(&listed, (&leader, None, false), to, (cli.force, now)).err(),
    };
    match refusal {
        Some(why) => {
            crate::say!("error: switchover refused: {why}");
            Err(EXIT_REFUSED)
        }
        None => Ok(Some(leader)),
    }
}

/// Print the outcome: `holder` (the target, or `None` when it led before).
fn print(
    cli: &SwitchoverCli,
    out: &mut dyn Write,
    from: &str,
    holder: Option<&Holder>,
    done: bool,
) -> u8 {
    let to = &cli.to;
    let text = match cli.ops.output {
        Output::Json => json!({
            "election": cli.ops.election,
            "switched_over": done && holder.is_some(),
            "from": holder.map(|_| from),
            "to": to,
            "leader": to,
            "fencing_token": holder.map(|h| h.fencing_token),
        })
        .to_string(),
        Output::Table => match holder {
            Some(h) => format!(
                "{to} leads election {} (fencing token {}), handed over by {from}",
                cli.ops.election, h.fencing_token
            ),
            None => format!(
                "{to} already leads election {}: nothing to do",
                cli.ops.election
            ),
        },
    };
    // A closed output (`| head -c 1`) is not a failure of the command.
    crate::console::Lines::new(out).put(&text);
    0
}

/// The target did not lead in time: withdraw a request still pending (so
/// no leader acts on it later, by surprise) and say what the backend shows.
async fn not_done(
    cli: &SwitchoverCli,
    (backend, store): (&dyn LeaseBackend, &dyn ControlStore),
    last: Option<&Holder>,
) -> u8 {
    let (limit, to) = (cli.ops.timeout, cli.to.as_str());
    let pending = match call(backend, limit, store.controls()).await {
        Ok(c) => c.switchover,
        Err(e) => Some(format!("unknown ({e})")),
    };
    let request = match pending.as_deref() {
        Some(p)
            if Request::Switchover {
                to,
                force: cli.force,
            }
            .encode()
                == p =>
        {
            match call(backend, limit, store.request_switchover(None)).await {
                Ok(()) => "the request was still pending (no leader acted on it) and is withdrawn"
                    .to_owned(),
                Err(e) => format!("the request is still pending and could not be withdrawn: {e}"),
            }
        }
        Some(other) => format!("the pending request now names {other}"),
        None => {
            "the leader took the request (and handed over or refused it: see its log)".to_owned()
        }
    };
    let leader = match last {
        Some(h) => format!("{} leads (fencing token {})", h.identity, h.fencing_token),
        None => "nobody leads".to_owned(),
    };
    crate::say!(
        "error: {to} does not lead election {} after {} (--wait): the backend shows {leader}; {request}",
        cli.ops.election,
        crate::flags::format_duration(cli.wait)
    );
    EXIT_NOT_DONE
}

#[cfg(test)]
mod tests {

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::elector::{Elector, ElectorConfig, LeaderState};

    fn cli(args: &[&str]) -> SwitchoverCli {
        let mut all = vec!["switchover", "--election", "e", "--wait", "2s"];
        all.extend_from_slice(args);
        SwitchoverCli::try_parse_from(all).unwrap()
    }

    fn start(b: &MemoryBackend, id: &str) -> tokio::sync::watch::Receiver<LeaderState> {
        let cfg = ElectorConfig::new("e", id, Duration::from_secs(3));
        let (elector, rx) = Elector::connected(cfg, &b.connected(), None);
        tokio::spawn(elector.run(CancellationToken::new()));
        rx
    }

    async fn run(c: &SwitchoverCli, b: &MemoryBackend) -> (u8, String) {
        let mut out = Vec::new();
        let code = switchover(c, &b.connected(), &mut out).await;
        (code, String::from_utf8(out).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn switchover_checks_the_target_then_waits_until_it_leads() {
        let b = MemoryBackend::new();
        let (ra, rb) = (start(&b, "a"), start(&b, "b"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (from, to) = if ra.borrow().is_leader_now() {
            ("a", "b")
        } else {
            ("b", "a")
        };
        assert_eq!(run(&cli(&["--to", "nobody"]), &b).await.0, EXIT_REFUSED);
        let (code, out) = run(&cli(&["--to", to]), &b).await;
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(&format!("{to} leads")) && out.contains(from),
            "{out}"
        );
        let (code, out) = run(&cli(&["--to", to, "-o", "json"]), &b).await;
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("\"switched_over\":false"),
            "already leads: {out}"
        );
        assert_eq!(b.controls().await.unwrap().switchover, None);
        drop((ra, rb));
    }

    #[tokio::test(start_paused = true)]
    async fn pause_and_resume_set_the_marker_and_print_it() {
        let b = MemoryBackend::new();
        let ops = |o: &str| OpsCli::try_parse_from(["pause", "--election", "e", "-o", o]).unwrap();
        let mut out = Vec::new();
        assert_eq!(pause(&ops("json"), &b.connected(), true, &mut out).await, 0);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (v["paused"].as_bool(), v["leader"].is_null()),
            (Some(true), true)
        );
        assert!(b.controls().await.unwrap().paused);
        let mut out = Vec::new();
        let status_cli = ops("json");
        crate::ops::status(&status_cli, &b.connected(), &mut out).await;
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["paused"], json!(true), "status shows the pause: {v}");
        // Paused: a switchover is refused, nobody can take the term.
        let _ra = start(&b, "a");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(run(&cli(&["--to", "a"]), &b).await.0, EXIT_NO_LEADER);
        let mut out = Vec::new();
        assert_eq!(
            pause(&ops("table"), &b.connected(), false, &mut out).await,
            0
        );
        let line = String::from_utf8(out).unwrap();
        assert!(line.contains("not paused"), "{line}");
        assert!(!b.controls().await.unwrap().paused);
    }
}
