//! `leader-elector` processes. Each binds port 0 and reports the bound
//! addresses in its "starting" log line (`http_addr=… control_addr=…`), so no
//! port is probed and released.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::time::{Instant, sleep};

use super::http::http_get;
use super::waits::block;

/// How long a sidecar may take to log its bound addresses (a loaded machine).
const START_LIMIT: Duration = Duration::from_secs(30);

/// One `leader-elector` process with its HTTP API on a port the kernel chose
/// (`--http-addr 127.0.0.1:0`), read from its "starting" log line; killed on drop.
pub struct Sidecar {
    pub identity: String,
    /// The HTTP API's port (0 when the process exited before binding it).
    pub port: u16,
    /// The control API's port when the test passed `--control-addr` (port 0
    /// is the way to ask for one), else `None`.
    pub control_port: Option<u16>,
    child: Child,
    log: PathBuf,
    _dir: TempDir,
}

/// The flags every test sidecar gets: a short TTL so tests are quick.
pub const FAST: &[&str] = &[
    "--lease-duration",
    "2s",
    "--renew-interval",
    "500ms",
    "--retry-period",
    "500ms",
];

/// The flags that turn the control API on, on a port the kernel chooses
/// (read it with [`Sidecar::control`]).
pub const CONTROL: &[&str] = &["--control-addr", "127.0.0.1:0"];

impl Sidecar {
    /// Start a sidecar for `election` on `etcd_url` with `extra` flags.
    pub fn start(etcd_url: &str, election: &str, identity: &str, extra: &[&str]) -> Sidecar {
        let mut args = vec!["--etcd-endpoints".to_owned(), etcd_url.to_owned()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::start_raw(election, identity, &args)
    }

    /// Start a sidecar for `election` with exactly `args` after the defaults.
    pub fn start_raw(election: &str, identity: &str, args: &[String]) -> Sidecar {
        Self::spawn_with(None, election, identity, args)
    }

    /// Start `leader-elector run` for `election`; `args` end with `-- COMMAND…`.
    pub fn start_run(election: &str, identity: &str, args: &[String]) -> Sidecar {
        Self::spawn_with(Some("run"), election, identity, args)
    }

    fn spawn_with(sub: Option<&str>, election: &str, identity: &str, args: &[String]) -> Sidecar {
        Self::spawn_env(sub, election, identity, args, &[])
    }

    /// Start a sidecar with extra environment variables (KUBECONFIG, POD_NAME…).
    pub fn start_env(
        election: &str,
        identity: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Sidecar {
        Self::spawn_env(None, election, identity, args, env)
    }

    /// Start a sidecar as the last arguments of `wrapper` (e.g. `unshare
    /// --mount sh -c '…; exec "$0" "$@"'`), with extra environment variables.
    pub fn start_wrapped(
        wrapper: &[&str],
        election: &str,
        identity: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Sidecar {
        Self::spawn_inner(wrapper, None, election, identity, args, env)
    }

    fn spawn_env(
        sub: Option<&str>,
        election: &str,
        identity: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Sidecar {
        Self::spawn_inner(&[], sub, election, identity, args, env)
    }

    fn spawn_inner(
        wrapper: &[&str],
        sub: Option<&str>,
        election: &str,
        identity: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Sidecar {
        let dir = TempDir::new().unwrap();
        let log = dir.path().join("sidecar.log");
        let (flags, command) = match args.iter().position(|a| a == "--") {
            Some(i) => (&args[..i], &args[i..]),
            None => (args, &[][..]),
        };
        let bin = env!("CARGO_BIN_EXE_leader-elector");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = cmd
            .args(sub)
            .args(["--election", election, "--identity", identity])
            .args(["--http-addr", "127.0.0.1:0"])
            .args(["--log-level", "leader_elector=debug"])
            // Many sidecars share this machine: no control API unless a test
            // asks (with `--control-addr 127.0.0.1:0`, read as `control_port`).
            .arg("--control-addr=")
            .args(keep_starting_line(flags))
            .args(command)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start leader-elector");
        let (port, control_port) = block(|| bound_ports(&log, &mut child));
        Sidecar {
            identity: identity.to_owned(),
            port,
            control_port,
            child,
            log,
            _dir: dir,
        }
    }

    /// The control API's bound port. Panics, with the log, when the sidecar
    /// was started without [`CONTROL`] or exited before binding it.
    pub fn control(&self) -> u16 {
        self.control_port.unwrap_or_else(|| {
            panic!(
                "{}: no control API bound (started without `--control-addr 127.0.0.1:0`, or it exited first):\n{}",
                self.identity,
                self.log()
            )
        })
    }

    /// `GET /leader`: status and parsed body (`None` when it does not answer).
    pub async fn leader(&self) -> Option<(u16, serde_json::Value)> {
        let (status, body) = http_get(self.port, "/leader").await.ok()?;
        Some((status, serde_json::from_str(&body).ok()?))
    }

    /// Whether `/leader` answers 200 right now.
    pub async fn is_leader(&self) -> bool {
        matches!(self.leader().await, Some((200, _)))
    }

    /// Send `sig` to the process.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).expect("signal the sidecar");
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Wait up to `limit` for the process to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            sleep(Duration::from_millis(5)).await;
        }
        None
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.identity, self.log());
        }
    }
}

/// Indexes of the sidecars that lead right now, as far as polling can tell
/// (all at once; a claimant counts only if it confirms, see below).
pub async fn leaders(sidecars: &[Sidecar]) -> Vec<usize> {
    // One 200 says a sidecar led at some instant of its request, so two 200s
    // of one round prove no overlap (a handover can fall between them). A
    // claimant asked again once the whole round answered, still leading the
    // same term (same fencing token), led throughout from its first answer
    // to its second; two such claimants both led at the instant the first
    // round ended: that is an overlap. Claimants that do not confirm are left out.
    let first = futures_util::future::join_all(sidecars.iter().map(claim)).await;
    let claimants: Vec<(usize, u64)> = first
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .collect();
    if claimants.len() <= 1 {
        return claimants.into_iter().map(|(i, _)| i).collect();
    }
    let again =
        futures_util::future::join_all(claimants.iter().map(|(i, _)| claim(&sidecars[*i]))).await;
    claimants
        .iter()
        .zip(again)
        .filter(|((_, token), now)| *now == Some(*token))
        .map(|((i, _), _)| *i)
        .collect()
}

/// Ask every sidecar's `/leader` every 5 ms until `limit` passes; panics as
/// soon as [`leaders`] finds two leading at once.
pub async fn watch_no_overlap(sidecars: &[Sidecar], limit: Duration) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let l = leaders(sidecars).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// The fencing token of a sidecar whose `/leader` answers 200 (0 when the
/// answer carries none); `None` when it does not lead or does not answer.
async fn claim(s: &Sidecar) -> Option<u64> {
    match s.leader().await {
        Some((200, body)) => Some(body["fencing_token"].as_u64().unwrap_or(0)),
        _ => None,
    }
}

/// Wait until exactly one sidecar leads and every live one names it; return its index.
pub async fn one_leader(sidecars: &[Sidecar], limit: Duration) -> usize {
    let end = Instant::now() + limit;
    loop {
        let l = leaders(sidecars).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        if l.len() == 1 {
            let name = &sidecars[l[0]].identity;
            let mut agree = true;
            for s in sidecars {
                if let Some((_, body)) = s.leader().await
                    && body["leader"] != serde_json::json!(name)
                {
                    agree = false;
                }
            }
            if agree {
                return l[0];
            }
        }
        if Instant::now() > end {
            panic!("no single agreed leader within {limit:?} (leaders now: {l:?})");
        }
        sleep(Duration::from_millis(5)).await;
    }
}

/// A unique election name per test.
pub fn election(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// The fencing token a sidecar reports.
pub async fn token_of(s: &Sidecar) -> u64 {
    s.leader().await.expect("sidecar answers").1["fencing_token"]
        .as_u64()
        .expect("a fencing token")
}

/// Start a sidecar on the Redis servers `urls` (extra flags after the defaults).
pub fn redis_sidecar(urls: &[&str], election: &str, identity: &str, extra: &[&str]) -> Sidecar {
    let mut args: Vec<String> = Vec::new();
    for u in urls {
        args.push("--redis-url".into());
        args.push((*u).to_owned());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Sidecar::start_raw(election, identity, &args)
}

/// `flags` with every `--log-level` widened so the "starting" line (target
/// `leader_elector::app`, level info) is still logged.
fn keep_starting_line(flags: &[String]) -> Vec<String> {
    let widen = |level: &str| format!("{level},leader_elector::app=info");
    let mut out = Vec::with_capacity(flags.len());
    let mut next_is_level = false;
    for f in flags {
        if next_is_level {
            out.push(widen(f));
            next_is_level = false;
        } else if let Some(level) = f.strip_prefix("--log-level=") {
            out.push(format!("--log-level={}", widen(level)));
        } else {
            next_is_level = f == "--log-level";
            out.push(f.clone());
        }
    }
    out
}

/// The HTTP and control ports from the "starting" line in `log` (text or
/// JSON format); `(0, None)` when the process exits first. Panics with the log
/// when neither happens within [`START_LIMIT`].
///
/// Blocking on purpose: `Sidecar::start` is synchronous (callers read `port`
/// at once). It runs under [`block`], and uses the wall clock, which a test
/// with a paused tokio clock would otherwise stop.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn bound_ports(log: &Path, child: &mut Child) -> (u16, Option<u16>) {
    let end = std::time::Instant::now() + START_LIMIT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let starting = text.lines().find(|l| l.contains("starting"));
        if let Some((line, port)) = starting.and_then(|l| Some((l, field_port(l, "http_addr")?))) {
            return (port, field_port(line, "control_addr"));
        }
        if child.try_wait().ok().flatten().is_some() {
            return (0, None);
        }
        assert!(
            std::time::Instant::now() < end,
            "the sidecar logged no bound address within {START_LIMIT:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The port of `name=host:port` (text) or `"name":"host:port"` (JSON) in `line`.
fn field_port(line: &str, name: &str) -> Option<u16> {
    let text = format!("{name}=");
    let json = format!("\"{name}\":\"");
    let rest = line.split_once(&text).or_else(|| line.split_once(&json))?.1;
    let addr = rest.split([' ', '"', ',']).next()?;
    addr.rsplit_once(':')?.1.parse().ok()
}
