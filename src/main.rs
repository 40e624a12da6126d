//! CLI entry: parse and validate the configuration (exit 2 on a bad flag),
//! set up logging, run the sidecar (exit 1 on a runtime failure, 0 after a
//! clean shutdown). The commands are clap's (src/cli.rs): none runs the
//! sidecar, `run` runs a command while leading, `status` and `observe` are
//! the operator's read-only commands (src/ops.rs).

use std::io::IsTerminal;
use std::process::ExitCode;

use leader_elector::app::RunError;
use leader_elector::cli::{self, Command, Invocation};
use leader_elector::config::{Config, LogFormat};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc, measured with
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
    // Before anything opens a file or socket: a closed stdout or stderr
    // (`2>&-`) must not be taken over by one (it would receive our logs).
    leader_elector::console::reopen_closed_stdio();
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.get(1).map(String::as_str) == Some("__watchdog") {
        // Run mode's watchdog between the sidecar and the command: an
        // internal entry point (its arguments are not the user's flags).
        let code = leader_elector::supervisor::watchdog_main(&args[2..]);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let (cli, run_mode) = match cli::parse(&args) {
        Ok(Invocation::Sidecar(cli)) => (*cli, false),
        Ok(Invocation::Command(command)) => match *command {
            Command::Run(run) => (run.sidecar, true),
            other => return command_main(other),
        },
        Err(e) => e.exit(),
    };
    let config = match Config::from_cli_mode(cli, run_mode) {
        Ok(c) => c,
        Err(e) => {
            leader_elector::say!("error: {e}");
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
            leader_elector::say!("error: cannot start the async runtime: {e}");
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

/// The commands other than the sidecar and `run`.
fn command_main(command: Command) -> ExitCode {
    match command {
        Command::Run(_) => unreachable!("run is the sidecar's"),
        Command::Status(ops) => leader_elector::ops::status_main(&ops),
        Command::Observe(ops) => leader_elector::ops::observe_main(&ops),
        Command::Pause(ops) => leader_elector::ops::pause_main(&ops, true),
        Command::Resume(ops) => leader_elector::ops::pause_main(&ops, false),
        Command::Switchover(cli) => leader_elector::ops::switchover_main(&cli),
        // A closed stdout (`| head`) is not an error of these.
        Command::Completions(c) => {
            let _ = cli::completions(c.shell, &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man => {
            let _ = cli::man(&mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}

/// Report a runtime failure once: through the log when it shows errors (JSON
/// stays JSON; a hint joins its line with "; ", so a text log line shows no
/// literal `\n`), else on stderr; exit code 1.
fn report(e: RunError) -> ExitCode {
    let e = anyhow::Error::new(e);
    if tracing::enabled!(tracing::Level::ERROR) {
        let one_line = format!("{e:#}").replace('\n', "; ");
        tracing::error!(error = %one_line, "leader-elector failed");
    } else {
        leader_elector::say!("error: {e:#}");
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
            leader_elector::say!(
                "error: --log-level ({}) is not a log filter: {e}\nhint: use e.g. info or leader_elector=debug",
                config.log_level
            );
            return Err(ExitCode::from(2));
        }
    };
    // Colour codes only on a terminal, and never with NO_COLOR set.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    // A log line that cannot be written (stderr a closed pipe) is dropped:
    // tracing's own report of it would go to the same stderr and panic.
    let logs = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => logs.json().flatten_event(true).init(),
        LogFormat::Text => logs.init(),
    }
    Ok(())
}
