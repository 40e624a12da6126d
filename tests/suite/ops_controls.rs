//! The operator controls end to end, on each backend (etcd, Redis and the
//! Kubernetes stand-in): `POST /switchover?to=ID`, `leader-elector
//! switchover`, `pause`/`resume` and `POST /resign?freeze=`, with sidecar
//! processes polled by the overlap checker (0 overlaps). Each scenario is
//! a function of a backend [`Fixture`]; each safety scenario has its
//! liveness twin (nobody leads while paused, then a leader after resume;
//! frozen, then leading). Times are printed, never asserted.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::time::{Instant, sleep};

use crate::support::backends::Backend;
use crate::support::recorder::Recorder;
use crate::support::*;

/// The lease duration of [`FAST`].
const TTL: Duration = Duration::from_secs(2);

/// A generous bound for waits that only keep a broken test from hanging.
const LIMIT: Duration = Duration::from_secs(20);

/// One backend the sidecars and the operator commands reach.
pub(crate) struct Fixture {
    /// The backend's flags, for the sidecar and for the commands alike.
    flags: Vec<String>,
    /// The environment both need (a kubeconfig).
    env: Vec<(String, String)>,
    /// Held for its Drop (the servers stop with it).
    _server: Backend,
}

impl Fixture {
    /// A fixture on a fresh `kind` (a [`Backend`] kind), its flags those of
    /// one sidecar (`ops`), shared by the sidecars and the commands.
    async fn on(kind: &str) -> Fixture {
        let mut server = Backend::start(kind).await;
        let (flags, env) = server.sidecar_flags("ops").await;
        Fixture {
            flags,
            env,
            _server: server,
        }
    }

    pub(crate) async fn etcd() -> Fixture {
        Self::on("etcd").await
    }

    pub(crate) async fn redis() -> Fixture {
        Self::on("redis").await
    }

    /// Three Redis servers: a Redlock group (every flag names all three).
    pub(crate) async fn redlock() -> Fixture {
        Self::on("redlock").await
    }

    pub(crate) async fn kubernetes() -> Fixture {
        Self::on("kubernetes").await
    }

    fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// A sidecar of `election` with the control API on and `extra` flags.
    pub(crate) fn sidecar(&self, election: &str, id: &str, extra: &[&str]) -> Sidecar {
        let mut args = self.flags.clone();
        let flags = FAST.iter().chain(CONTROL).chain(extra);
        args.extend(flags.map(|s| s.to_string()));
        Sidecar::start_env(election, id, &args, &self.env())
    }

    /// `n` sidecars `m0`, `m1`, … polled by a new overlap recorder.
    fn group(&self, election: &str, n: usize) -> (Vec<Sidecar>, Recorder) {
        let rec = Recorder::new(TTL);
        let cs: Vec<Sidecar> = (0..n)
            .map(|i| self.sidecar(election, &format!("m{i}"), &[]))
            .collect();
        for c in &cs {
            rec.add(&c.identity, c.port);
        }
        (cs, rec)
    }

    /// Run `leader-elector SUB --election E` with the backend's flags and
    /// `extra`: its exit code, stdout and stderr.
    pub(crate) fn command(
        &self,
        sub: &str,
        election: &str,
        extra: &[&str],
    ) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
            .arg(sub)
            .args(["--election", election])
            .args(&self.flags)
            .args(extra)
            .envs(self.env())
            .env_remove("LEADER_ELECTOR_ELECTION")
            .output()
            .expect("run leader-elector");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    }
}

/// POST `path` on the control API of `s`: status and JSON body.
async fn post(s: &Sidecar, path: &str) -> (u16, Value) {
    http_json(s.control(), "POST", path, None, LIMIT)
        .await
        .expect("the control API answers")
}

/// `/leader` of `s` (`Null` when it does not answer).
async fn leader_body(s: &Sidecar) -> Value {
    s.leader().await.map(|(_, v)| v).unwrap_or(Value::Null)
}

fn no_overlaps(rec: &Recorder, scenario: &str) {
    let report = rec.check(scenario);
    assert!(report.overlaps.is_empty(), "{}", report.summary());
}

/// Wait until `cs[to]` leads (never two at once); prints how long it took.
async fn until_leads(cs: &[Sidecar], to: usize, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let l = leaders(cs).await;
        assert!(l.len() <= 1, "two sidecars claim to lead at once: {l:?}");
        if l == [to] {
            let took = start.elapsed();
            println!("{what}: {} leads after {took:?}", cs[to].identity);
            return took;
        }
        assert!(
            start.elapsed() < LIMIT,
            "{what}: {} never led",
            cs[to].identity
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// Wait until every member's `/leader` names `cs[l]` (a follower that was
/// leaving a named successor its wait when the term changed names nobody
/// until its next read).
async fn all_know(cs: &[Sidecar], l: usize) {
    let start = Instant::now();
    let want = Value::from(cs[l].identity.as_str());
    loop {
        let mut known = true;
        for s in cs {
            known &= leader_body(s).await["leader"] == want;
        }
        if known {
            return;
        }
        assert!(start.elapsed() < LIMIT, "not every member names {want}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Switchover to each of the two followers in turn by `POST /switchover`:
/// the target leads (printed; the goal is within 1 s); then the refusals
/// (unknown target, the leader itself, a follower asked) change nothing.
async fn switchover_in_turn(fx: &Fixture, name: &str) {
    let election = election(name);
    let (cs, rec) = fx.group(&election, 3);
    let mut l = one_leader(&cs, LIMIT).await;
    for _ in 0..2 {
        all_know(&cs, l).await;
        let to = (l + 1) % 3;
        let path = format!("/switchover?to={}", cs[to].identity);
        let (status, body) = post(&cs[l], &path).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["to"], Value::from(cs[to].identity.as_str()), "{body}");
        until_leads(&cs, to, "switchover").await;
        l = to;
    }
    all_know(&cs, l).await;
    refusals_change_nothing(&cs, l).await;
    never_to_priority_zero(fx, &election, &cs, l).await;
    no_overlaps(&rec, name);
}

/// A member of priority 0 joins: a switchover to it is refused with 409
/// naming priority 0 (once its record is listed), and the leader stays.
async fn never_to_priority_zero(fx: &Fixture, election: &str, cs: &[Sidecar], l: usize) {
    let zero = fx.sidecar(election, "p0", &["--priority", "0"]);
    let token = token_of(&cs[l]).await;
    let start = Instant::now();
    loop {
        let (got, body) = post(&cs[l], "/switchover?to=p0").await;
        assert_eq!(got, 409, "a switchover to priority 0 is refused: {body}");
        if body["error"].as_str().unwrap_or("").contains("priority 0") {
            break;
        }
        assert!(start.elapsed() < LIMIT, "p0 never listed: {body}");
        sleep(Duration::from_millis(20)).await;
    }
    let (code, body) = zero.leader().await.expect("p0 answers");
    assert_eq!(code, 503, "priority 0 never leads: {body}");
    assert_eq!(leaders(cs).await, [l], "nothing changed");
    assert_eq!(token_of(&cs[l]).await, token, "the same term");
}

/// 409 with the reason for an unknown target and for the leader itself,
/// 409 naming the leader from a follower, 400 without a target; the
/// leader and its term stay.
async fn refusals_change_nothing(cs: &[Sidecar], l: usize) {
    let token = token_of(&cs[l]).await;
    let f = (l + 1) % cs.len();
    for (at, path, status, says) in [
        (l, "/switchover?to=nobody", 409, "not a candidate"),
        (
            l,
            &format!("/switchover?to={}", cs[l].identity),
            409,
            "already leads",
        ),
        (f, "/switchover?to=nobody", 409, "does not lead"),
        (l, "/switchover", 400, "to"),
    ] {
        let (got, body) = post(&cs[at], path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(
            body["error"].as_str().unwrap_or("").contains(says),
            "{path}: {body}"
        );
    }
    let (_, body) = post(&cs[f], "/switchover?to=nobody").await;
    assert_eq!(
        body["leader"],
        Value::from(cs[l].identity.as_str()),
        "{body}"
    );
    watch_no_overlap(cs, Duration::from_secs(1)).await;
    assert_eq!(leaders(cs).await, [l], "nothing changed");
    assert_eq!(token_of(&cs[l]).await, token, "the same term");
}

/// `leader-elector switchover` from outside: refused for an unknown
/// target (exit 5), done for a follower (exit 0, it leads).
async fn switchover_by_command(fx: &Fixture, name: &str) {
    let election = election(name);
    let (cs, rec) = fx.group(&election, 2);
    let l = one_leader(&cs, LIMIT).await;
    all_know(&cs, l).await;
    let (code, _, err) = fx.command("switchover", &election, &["--to", "nobody"]);
    assert_eq!(code, 5, "{err}");
    assert_eq!(leaders(&cs).await, [l]);
    let to = 1 - l;
    // The leader checks the target against the registry it follows: wait
    // until the target's record is listed as ready, as an operator reading
    // `status` would, so the switchover is not refused for an unseen record.
    let seen = Instant::now();
    while seen.elapsed() < LIMIT {
        let (_, out, _) = fx.command("status", &election, &[]);
        let listed = out.lines().any(|line| {
            let mut cols = line.split_whitespace();
            cols.next() == Some(cs[to].identity.as_str()) && line.contains("true")
        });
        if listed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    let (code, out, err) = fx.command("switchover", &election, &["--to", &cs[to].identity]);
    assert_eq!(code, 0, "{out}{err}");
    println!(
        "leader-elector switchover: {out:?} after {:?}",
        start.elapsed()
    );
    until_leads(&cs, to, "switchover by command").await;
    no_overlaps(&rec, name);
}

/// Pause, then kill the leader: nobody leads (every `/leader` says
/// paused) until resume; then a leader within about one lease duration.
async fn pause_then_kill_the_leader(fx: &Fixture, name: &str) {
    let election = election(name);
    let (mut cs, rec) = fx.group(&election, 3);
    let l = one_leader(&cs, LIMIT).await;
    let (code, out, err) = fx.command("pause", &election, &[]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for(LIMIT, "every member shows the pause", || async {
        let mut all = true;
        for c in &cs {
            all &= leader_body(c).await["paused"] == Value::Bool(true);
        }
        all
    })
    .await;
    cs[l].signal(Signal::SIGKILL);
    rec.stop_polling(l);
    let _ = cs[l].wait_exit(LIMIT).await;
    let rest: Vec<Sidecar> = cs
        .drain(..)
        .enumerate()
        .filter(|(i, _)| *i != l)
        .map(|(_, c)| c)
        .collect();
    watch_no_overlap(&rest, TTL * 3).await;
    assert!(
        leaders(&rest).await.is_empty(),
        "nobody takes the term while paused"
    );
    let body = leader_body(&rest[0]).await;
    assert!(
        body["waiting"]["what"]
            .as_str()
            .unwrap_or("")
            .contains("paused"),
        "{body}"
    );
    // Liveness twin: resume, then a leader.
    let (code, _, err) = fx.command("resume", &election, &[]);
    assert_eq!(code, 0, "{err}");
    let start = Instant::now();
    one_leader(&rest, LIMIT).await;
    println!(
        "{name}: a leader {:?} after resume (lease {TTL:?})",
        start.elapsed()
    );
    no_overlaps(&rec, name);
}

/// A sole candidate frozen for 4 s does not lead for that long, shows the
/// freeze on `/leader`, then leads again.
async fn freeze_a_sole_candidate(fx: &Fixture, name: &str) {
    let election = election(name);
    let (cs, rec) = fx.group(&election, 1);
    one_leader(&cs, LIMIT).await;
    let freeze = Duration::from_secs(4);
    let (status, body) = post(&cs[0], "/resign?freeze=4s").await;
    assert_eq!(
        (status, &body["resigned"]),
        (200, &Value::Bool(true)),
        "{body}"
    );
    let start = Instant::now();
    sleep(Duration::from_millis(300)).await;
    let body = leader_body(&cs[0]).await;
    assert!(
        body["waiting"]["what"]
            .as_str()
            .unwrap_or("")
            .contains("frozen"),
        "{body}"
    );
    assert!(body["waiting"]["until"].is_string(), "{body}");
    while start.elapsed() < freeze - Duration::from_millis(300) {
        assert!(leaders(&cs).await.is_empty(), "led while frozen");
        sleep(Duration::from_millis(20)).await;
    }
    // Liveness twin: it leads once the freeze is over.
    one_leader(&cs, LIMIT).await;
    println!(
        "{name}: leads again {:?} after the freeze of {freeze:?}",
        start.elapsed()
    );
    no_overlaps(&rec, name);
}

/// On the Kubernetes stand-in (a registry already, no controls yet): the
/// refusals, and a switchover releases the term to another member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_switchover_refusals_and_a_handover() {
    let fx = Fixture::kubernetes().await;
    let election = election("k-ctl-refuse");
    let (cs, rec) = fx.group(&election, 3);
    let l = one_leader(&cs, LIMIT).await;
    wait_for(LIMIT, "every candidate's record", || async {
        let (code, out, _) = fx.command("status", &election, &["-o", "json"]);
        let v: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
        code == 0 && v["candidates"].as_array().is_some_and(|c| c.len() == 3)
    })
    .await;
    refusals_change_nothing(&cs, l).await;
    let to = (l + 1) % 3;
    let (status, body) = post(&cs[l], &format!("/switchover?to={}", cs[to].identity)).await;
    assert_eq!(status, 200, "{body}");
    let start = Instant::now();
    let now = one_leader(&cs, LIMIT).await;
    assert_ne!(now, l, "the leader handed over");
    println!(
        "kubernetes switchover: {} leads after {:?}",
        cs[now].identity,
        start.elapsed()
    );
    no_overlaps(&rec, "k-ctl-refuse");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_switchover_to_each_follower_in_turn() {
    switchover_in_turn(&Fixture::kubernetes().await, "k-ctl-turn").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_switchover_to_each_follower_in_turn() {
    switchover_in_turn(&Fixture::etcd().await, "e-ctl-turn").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_switchover_to_each_follower_in_turn() {
    switchover_in_turn(&Fixture::redis().await, "r-ctl-turn").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_switchover_by_command() {
    switchover_by_command(&Fixture::kubernetes().await, "k-ctl-cmd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_switchover_by_command() {
    switchover_by_command(&Fixture::etcd().await, "e-ctl-cmd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_switchover_by_command() {
    switchover_by_command(&Fixture::redis().await, "r-ctl-cmd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_pause_then_kill_the_leader() {
    pause_then_kill_the_leader(&Fixture::kubernetes().await, "k-ctl-pause").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_pause_then_kill_the_leader() {
    pause_then_kill_the_leader(&Fixture::etcd().await, "e-ctl-pause").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pause_then_kill_the_leader() {
    pause_then_kill_the_leader(&Fixture::redis().await, "r-ctl-pause").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_freeze_a_sole_candidate() {
    freeze_a_sole_candidate(&Fixture::kubernetes().await, "k-ctl-freeze").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_freeze_a_sole_candidate() {
    freeze_a_sole_candidate(&Fixture::etcd().await, "e-ctl-freeze").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_freeze_a_sole_candidate() {
    freeze_a_sole_candidate(&Fixture::redis().await, "r-ctl-freeze").await;
}
