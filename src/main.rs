//! CLI entry: parse and validate the configuration (exit 2 on a bad flag),
//! set up logging, run the sidecar (exit 1 on a runtime failure, 0 after a
//! clean shutdown). `status` and `observe` are the operator's read-only
//! commands (src/ops.rs); `help [COMMAND]` prints a command's help.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use leader_elector::app::RunError;
use leader_elector::config::{Cli, Config, LogFormat};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc (issue 13), measured with
/// `benches/longpoll_memory.rs` (5,000 long-polls, three rounds): under glibc
/// the memory of closed connections stayed in the process and RSS rose with
/// every round (the heap is trimmed only from its top, and a few allocations
/// that outlive the load pin it). mimalloc keeps it bounded by the peak, and
/// with `MIMALLOC_PURGE_DELAY=0` (set in the image) gives emptied pages back
/// at once: RSS is back within 2 MiB of idle a second after the load ends;
/// committing the first arena on demand rather than whole at start (the
/// build's default, `.cargo/config.toml`; `MIMALLOC_ARENA_EAGER_COMMIT=0` in
/// the image too) keeps idle RSS at 11 instead of 16-19 MiB.
/// The binary only: a program embedding the library keeps its own allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.get(1).map(String::as_str) == Some("__watchdog") {
        // Run mode's watchdog between the sidecar and the command.
        let code = leader_elector::supervisor::watchdog_main(&args[2..]);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    match args.get(1).map(String::as_str) {
        Some("status" | "observe") => return leader_elector::ops::main(&args),
        Some("help") => {
            // `leader-elector help [COMMAND]` is `leader-elector [COMMAND] --help`.
            let mut help = vec![args[0].clone()];
            help.extend(args.get(2).cloned());
            help.push("--help".into());
            args = help;
            if matches!(args[1].as_str(), "status" | "observe") {
                return leader_elector::ops::main(&args);
            }
        }
        _ => {}
    }
    let run_mode = args.get(1).map(String::as_str) == Some("run");
    if run_mode {
        args.remove(1);
    }
    let cmd = if run_mode {
        Cli::command()
            .name("leader-elector run")
            .bin_name("leader-elector run")
            .about("Run COMMAND only while this candidate leads: start it on election, stop it (SIGTERM, then SIGKILL after --kill-grace) before leadership can end, then release.")
            .override_usage("leader-elector run [OPTIONS] --election <NAME> (--etcd-endpoints <URL> | --redis-url <URL>...) -- COMMAND [ARGS]...")
    } else {
        Cli::command().after_help(
            "Commands:\n  (none)   run the sidecar (these options)\n  run      run a command only while leading: leader-elector run --help\n  status   print who leads an election, read-only: leader-elector status --help\n  observe  print one line per leadership change until interrupted: leader-elector observe --help\n  help     print this help, or a command's: leader-elector help status",
        )
    };
    let cli = match Cli::from_arg_matches(&cmd.get_matches_from(args)) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let config = match Config::from_cli_mode(cli, run_mode) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(code) = init_logs(&config) {
        return code;
    }
    // One thread: the sidecar's work is small, and a second worker time-sliced
    // on a throttled or pinned core only adds tail latency (measured: /leader
    // p99 0.7-1.6 ms with one thread vs 2.6-2.9 ms with two on one core).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(leader_elector::app::run(config, CancellationToken::new()));
    match result {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(code)) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(RunError::SecondSignal { .. }) => {
            // Logged already ("second signal: exiting at once"); do not wait
            // for tasks still running on the blocking pool.
            runtime.shutdown_background();
            ExitCode::from(1)
        }
        Err(e) => report(e),
    }
}

/// Report a runtime failure once: through the log when it shows errors (JSON
/// stays JSON), else on stderr; exit code 1.
fn report(e: RunError) -> ExitCode {
    let e = anyhow::Error::new(e);
    if tracing::enabled!(tracing::Level::ERROR) {
        tracing::error!(error = format!("{e:#}"), "leader-elector failed");
    } else {
        eprintln!("error: {e:#}");
    }
    ExitCode::from(1)
}

/// Set up logging from `--log-level` and `--log-format`.
///
/// # Errors
/// Exit code 2 when `--log-level` is not a log filter (said on stderr).
fn init_logs(config: &Config) -> Result<(), ExitCode> {
    let filter = match EnvFilter::try_new(&config.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "error: --log-level ({}) is not a log filter: {e}\nhint: use e.g. info or leader_elector=debug",
                config.log_level
            );
            return Err(ExitCode::from(2));
        }
    };
    // Colour codes only on a terminal, and never with NO_COLOR set.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => logs.json().flatten_event(true).init(),
        LogFormat::Text => logs.init(),
    }
    Ok(())
}
