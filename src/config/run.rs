//! Run mode's start checks: the command resolves to an executable file
//! (on `PATH`, or as a path), and the run-only flags are given to `run`
//! only. Both are usage errors (exit 2) naming the command or the flag.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::Cli;
use crate::flags::{ConfigError, config_error};

/// Default of `--start-failures`.
pub const DEFAULT_START_FAILURES: u32 = 3;

/// Largest `--start-failures`.
pub const MAX_START_FAILURES: u32 = 1000;

/// The run-only flags given outside `run` (their names), if any.
///
/// # Errors
/// A [`ConfigError`] naming the first run-only flag given without `run`.
pub(super) fn no_run_flags(cli: &Cli) -> Result<(), ConfigError> {
    let given = [
        ("--kill-grace", cli.kill_grace.is_some()),
        ("--every", cli.every.is_some()),
        ("--on-child-exit", cli.on_child_exit.is_some()),
        ("--start-failures", cli.start_failures.is_some()),
    ];
    match given.iter().find(|(_, g)| *g) {
        Some((flag, _)) => Err(config_error(format!(
            "{flag} needs run mode (it is a run-mode flag)\nhint: leader-elector run {flag} ... [flags] -- COMMAND ARGS..., or leave {flag} (and its LEADER_ELECTOR_ variable) out"
        ))),
        None => Ok(()),
    }
}

/// `--start-failures`, checked.
///
/// # Errors
/// A [`ConfigError`] when it is 0 or above [`MAX_START_FAILURES`].
pub(super) fn start_failures(cli: &Cli) -> Result<u32, ConfigError> {
    let n = cli.start_failures.unwrap_or(DEFAULT_START_FAILURES);
    if n == 0 || n > MAX_START_FAILURES {
        return Err(config_error(format!(
            "--start-failures ({n}) must be between 1 and {MAX_START_FAILURES}\nhint: the sidecar exits after this many failed starts in a row; the default is {DEFAULT_START_FAILURES}"
        )));
    }
    Ok(n)
}

/// The executable `program` names: itself when it holds a `/`, else the
/// first match in the directories of `path` (`$PATH`).
///
/// # Errors
/// A [`ConfigError`] naming the command: not found, not a file, or not
/// executable.
pub fn resolve_command(program: &str, path: Option<&str>) -> Result<PathBuf, ConfigError> {
    if program.contains('/') {
        let path = Path::new(program);
        return executable(path).map(|_| path.to_owned()).map_err(|why| {
            config_error(format!(
                "run: the command {program} {why}\nhint: give the path of an executable file after --"
            ))
        });
    }
    let dirs = path.unwrap_or("");
    std::env::split_paths(dirs)
        .map(|dir| dir.join(program))
        .find(|p| executable(p).is_ok())
        .ok_or_else(|| {
            config_error(format!(
                "run: the command {program} is not found on PATH ({dirs})\nhint: install it, give its full path, or fix PATH"
            ))
        })
}

/// Whether `path` is an executable file, and if not why (in words).
fn executable(path: &Path) -> Result<(), &'static str> {
    let meta = std::fs::metadata(path).map_err(|_| "does not exist")?;
    if !meta.is_file() {
        return Err("is not a file");
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("is not executable (chmod +x)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_resolve_on_path_or_as_executable_paths() {
        let path = std::env::var("PATH").ok();
        assert!(resolve_command("sh", path.as_deref()).is_ok());
        assert!(resolve_command("/bin/sh", None).is_ok());
        let e = resolve_command("no-such-command-xyz", Some("/usr/bin:/bin")).unwrap_err();
        assert!(
            e.message
                .contains("no-such-command-xyz is not found on PATH (/usr/bin:/bin)"),
            "{e}"
        );
        let e = resolve_command("/nonexistent/cmd", None).unwrap_err();
        assert!(e.message.contains("/nonexistent/cmd does not exist"), "{e}");
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("script");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        let e = resolve_command(file.to_str().unwrap(), None).unwrap_err();
        assert!(e.message.contains("is not executable"), "{e}");
        let e = resolve_command(dir.path().to_str().unwrap(), None).unwrap_err();
        assert!(e.message.contains("is not a file"), "{e}");
    }
}
