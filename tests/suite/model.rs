//! Randomized, seeded model check of the coordination API.
//!
//! Several concurrent clients drive two real sidecars on one real etcd, one
//! real Redis, a Redlock group of three real Redis servers, or the
//! Kubernetes API stand-in (the Lease backend), with random
//! operations (plain and fair locks with and without
//! `wait`, renew, release, semaphores with a random N, read-write locks in
//! either mode, job claims, their renewals, give-backs and completions). Every call is recorded with its call and return instants and
//! its answer; afterwards the history is checked against a sequential
//! reference model of what the contract promises:
//!
//! - **safety**: per lock name (fair and plain alike) no two holders at once;
//!   per semaphore at most N live permits; per job at most one claimant and
//!   one completing token; per read-write lock no writer beside anyone
//!   (readers may share); fencing tokens grow per name;
//! - **liveness**: an acquisition refused when, per the model, nothing could
//!   have been held during the whole call (or the lock stayed free for a
//!   whole second of a `wait`), a reader refused when no writer (granted, or
//!   asking: its intent lives up to a second past its answer) could have been
//!   there, readers that never shared a read-write lock in the whole run, a semaphore refused with fewer than N permits
//!   possibly live, a renew or release refused although the token was
//!   certainly held from its call to its answer, and a renew granted to a
//!   token certainly expired at its call, are all violations.
//!
//! "Certainly held" runs from the grant's answer until the earliest instant
//! the backend may have dropped it (call of the last renewal + TTL, or the
//! call of a release); "possibly held" runs from the acquisition's call until
//! the latest instant it may still exist (answer of the last renewal that may
//! have worked + TTL + the backend's expiry slack, or a release's answer).
//! Ambiguous answers (5xx, transport errors) count as "possibly" only.
//!
//! Knobs (environment):
//! - `MODEL_SEED=<u64>` replays a seed (printed by every run and failure);
//! - `MODEL_SECS=<s>` run length per backend (default 12 s);
//! - `MODEL_FAULTS=1` adds faults: clients pausing past their TTL, a
//!   blackhole between the sidecars and the backend for a few seconds, and
//!   backend restarts (Redis with `appendfsync always`, so it keeps its keys);
//!   on the stand-in, instead of restarts: broken watches with one sidecar
//!   blind for a while, 500 answers to writes, slow answers and events.
//!
//! Reports the ops checked per second and the violations found.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::backends::Backend;
use crate::support::kube_api::{Endpoint, Fault};
use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::time::{Instant, sleep};

const CLIENTS: u64 = 10;
const LOCKS: &[&str] = &["L0", "L1"];
const SEMS: &[&str] = &["S0", "S1"];
const RWS: &[&str] = &["R0", "R1"];
/// How long a writer's intent may outlive its refused request.
const INTENT_SLACK: Duration = Duration::from_secs(1);
const TTL_S: u64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum What {
    Lock,
    Sem,
    Job,
    Rw,
}

/// One recorded call.
#[derive(Clone, Debug)]
struct Op {
    client: u64,
    verb: &'static str,
    what: What,
    name: String,
    /// Acquisitions: `wait` asked; fair lock.
    wait: Duration,
    fair: bool,
    /// Read-write locks: a writer.
    write: bool,
    /// The token acted on (renew/release/complete), or granted (acquisitions).
    token: Option<String>,
    fence: u64,
    ttl: Duration,
    call: Instant,
    ret: Instant,
    /// HTTP status; 0 = transport error.
    status: u16,
    body: Value,
}

impl Op {
    fn ambiguous(&self) -> bool {
        self.status == 0 || self.status >= 500
    }
}

fn seed() -> u64 {
    std::env::var("MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random())
}

fn secs() -> u64 {
    std::env::var("MODEL_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

fn faults() -> bool {
    std::env::var("MODEL_FAULTS").is_ok_and(|v| v == "1")
}

/// The backend of a model run: Redis servers keep every write
/// (`appendfsync always`); on the stand-in, one endpoint per sidecar (`a`,
/// `b`).
async fn start_server(kind: &str) -> Backend {
    let keep = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut server = match kind {
        "kubernetes" => Backend::kubernetes("model"),
        other => Backend::start_with(other, &keep).await,
    };
    if let Backend::Kube(api, eps) = &mut server {
        eps.push(api.endpoint("a").await);
        eps.push(api.endpoint("b").await);
    }
    server
}

/// Cut (or heal) every sidecar's connection where no proxy can: the
/// stand-in's endpoints hang.
fn cut(server: &Backend, on: bool) {
    if let Backend::Kube(api, _) = server {
        api.set_fault_all(Fault {
            hang: on,
            ..Fault::default()
        });
    }
}

/// Restart the server (on a Redlock group: one of them, by `pick`; on the
/// stand-in: one fault for a while).
async fn restart(server: &mut Backend, pick: usize) {
    match server {
        Backend::Etcd(e) => e.restart().await,
        Backend::EtcdCluster(c) => {
            c.restart(pick % c.len());
            c.wait_healthy(Duration::from_secs(30)).await;
        }
        Backend::Redis(r) => r.restart().await,
        Backend::Redlock(g) => {
            let n = g.len();
            g[pick % n].restart().await
        }
        Backend::Kube(_, eps) => kube_fault(eps, pick).await,
    }
}

/// One fault of the stand-in, for a while (`pick`: which): broken watches
/// and sidecar a blind, 500 answers to writes, or slow answers and events.
async fn kube_fault(eps: &[Arc<Endpoint>], pick: usize) {
    let fault = match pick % 3 {
        0 => Fault {
            hang: true,
            ..Fault::default()
        },
        1 => Fault {
            status: Some(500),
            writes_only: true,
            ..Fault::default()
        },
        _ => Fault {
            latency: Duration::from_millis(300),
            event_latency: Duration::from_millis(200),
            ..Fault::default()
        },
    };
    eps.iter().for_each(|e| e.reset_watches());
    let hit = if pick.is_multiple_of(3) {
        &eps[..1]
    } else {
        eps
    };
    hit.iter().for_each(|e| e.set_fault(fault.clone()));
    sleep(Duration::from_millis(1500)).await;
    hit.iter().for_each(|e| e.set_fault(Fault::default()));
}

/// The two sidecars under test on `server` (through `via` where proxied)
/// and their control ports.
async fn sidecars(kind: &str, server: &Backend, via: &str, test: &str) -> Vec<(Sidecar, u16)> {
    let mut out = Vec::new();
    for (i, id) in ["a", "b"].into_iter().enumerate() {
        out.push(match server {
            Backend::Kube(_, eps) => {
                let mut args = vec!["--backend".to_owned(), "kubernetes".to_owned()];
                args.extend(FAST.iter().chain(CONTROL).map(|s| s.to_string()));
                args.extend(["--log-level".into(), "warn".into()]);
                let kubeconfig = eps[i].kubeconfig().to_string_lossy().into_owned();
                let env = [("KUBECONFIG", kubeconfig.as_str())];
                let s = Sidecar::start_env(&election(test), id, &args, &env);
                let port = s.control();
                (s, port)
            }
            _ => start_sidecar(kind, via, test, id).await,
        });
    }
    out
}

async fn start_sidecar(kind: &str, url: &str, test: &str, id: &str) -> (Sidecar, u16) {
    let mut args = vec![
        if kind == "etcd" {
            "--etcd-endpoints"
        } else {
            "--redis-url"
        }
        .to_owned(),
        url.to_owned(),
    ];
    args.extend(FAST.iter().chain(CONTROL).map(|s| s.to_string()));
    args.extend(["--log-level".into(), "warn".into()]);
    let s = Sidecar::start_raw(&election(test), id, &args);
    // Bound before the "starting" line: connections queue until it serves.
    let port = s.control();
    (s, port)
}

/// How long one call may take before it counts as a transport error.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// One call; a transport error or no answer within [`CALL_LIMIT`] is
/// status 0 (ambiguous), a body that is not JSON is `Value::Null`.
async fn send(method: &str, port: u16, path: &str) -> (u16, Value) {
    http_json(port, method, path, None, CALL_LIMIT)
        .await
        .unwrap_or((0, Value::Null))
}

/// A grant a client holds.
#[derive(Clone)]
struct Held {
    what: What,
    name: String,
    token: String,
}

/// Act on one of the grants held: renew, release (kept with a 10 % chance,
/// to try it again) or complete; maybe pause past the TTL first (faults).
async fn on_held(
    rng: &mut StdRng,
    held: &mut Vec<Held>,
    op: &mut Op,
    faults: bool,
) -> (&'static str, String) {
    let ttl = Duration::from_secs(TTL_S);
    let i = rng.random_range(0..held.len());
    let h = held[i].clone();
    if faults && rng.random_bool(0.05) {
        // Pause past the TTL while holding.
        sleep(ttl + Duration::from_millis(rng.random_range(100..1500))).await;
    } else {
        sleep(Duration::from_millis(rng.random_range(0..100))).await;
    }
    op.what = h.what;
    op.name = h.name.clone();
    op.token = Some(h.token.clone());
    let base = match h.what {
        What::Lock => format!("/locks/{}", h.name),
        What::Sem => format!("/semaphores/{}", h.name),
        What::Job => format!("/jobs/{}", h.name),
        What::Rw => format!("/rwlocks/{}", h.name),
    };
    let r: f64 = rng.random();
    if h.what == What::Job && r >= 0.5 {
        op.verb = "complete";
        held.remove(i);
        ("POST", format!("{base}/complete?token={}", h.token))
    } else if h.what == What::Job && r >= 0.25 {
        op.verb = "release";
        held.remove(i);
        ("DELETE", format!("{base}/claim?token={}", h.token))
    } else if r < 0.4 {
        op.verb = "renew";
        (
            "POST",
            format!("{base}/renew?ttl={TTL_S}s&token={}", h.token),
        )
    } else {
        op.verb = "release";
        if rng.random_bool(0.9) {
            held.remove(i);
        }
        ("DELETE", format!("{base}?token={}", h.token))
    }
}

/// Pick an acquisition: a lock (fair on etcd and Leases sometimes), a permit, or a
/// claim on a small window of jobs shared by all clients.
fn acquisition(
    rng: &mut StdRng,
    kind: &str,
    id: u64,
    sem_n: &HashMap<String, u32>,
    next_job: &mut u32,
    op: &mut Op,
) -> (&'static str, String) {
    let waits = [0u64, 0, 0, 100, 500, 1500];
    op.wait = Duration::from_millis(waits[rng.random_range(0..waits.len())]);
    op.verb = "acquire";
    let r: f64 = rng.random();
    let path = if r < 0.4 {
        op.what = What::Lock;
        op.name = LOCKS[rng.random_range(0..LOCKS.len())].to_owned();
        op.fair = matches!(kind, "etcd" | "kubernetes") && rng.random_bool(0.4);
        format!(
            "/locks/{}?ttl={TTL_S}s&wait={}ms&fair={}&owner=c{id}",
            op.name,
            op.wait.as_millis(),
            op.fair
        )
    } else if r < 0.65 {
        op.what = What::Sem;
        op.name = SEMS[rng.random_range(0..SEMS.len())].to_owned();
        format!(
            "/semaphores/{}?permits={}&ttl={TTL_S}s&wait={}ms&owner=c{id}",
            op.name,
            sem_n[&op.name],
            op.wait.as_millis()
        )
    } else if r < 0.87 {
        op.what = What::Rw;
        op.name = RWS[rng.random_range(0..RWS.len())].to_owned();
        op.write = rng.random_bool(0.35);
        format!(
            "/rwlocks/{}?mode={}&ttl={TTL_S}s&wait={}ms&owner=c{id}",
            op.name,
            if op.write { "write" } else { "read" },
            op.wait.as_millis()
        )
    } else {
        op.what = What::Job;
        op.wait = Duration::ZERO;
        *next_job += rng.random_range(0..2);
        op.name = format!("q/j{}", *next_job % 40);
        format!("/jobs/{}/claim?ttl={TTL_S}s&owner=c{id}", op.name)
    };
    ("POST", path)
}

#[allow(clippy::too_many_arguments)]
async fn client(
    id: u64,
    seed: u64,
    kind: &'static str,
    ports: Vec<u16>,
    sem_n: Arc<HashMap<String, u32>>,
    until: Instant,
    faults: bool,
    history: Arc<Mutex<Vec<Op>>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (id.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let mut held: Vec<Held> = Vec::new();
    let mut next_job = 0u32;
    while Instant::now() < until {
        let port = ports[rng.random_range(0..ports.len())];
        let ttl = Duration::from_secs(TTL_S);
        let mut op = Op {
            client: id,
            verb: "",
            what: What::Lock,
            name: String::new(),
            wait: Duration::ZERO,
            fair: false,
            write: false,
            token: None,
            fence: 0,
            ttl,
            call: Instant::now(),
            ret: Instant::now(),
            status: 0,
            body: Value::Null,
        };
        let roll: f64 = rng.random();
        let (method, path) = if !held.is_empty() && roll < 0.45 {
            on_held(&mut rng, &mut held, &mut op, faults).await
        } else {
            acquisition(&mut rng, kind, id, &sem_n, &mut next_job, &mut op)
        };
        op.call = Instant::now();
        let (st, body) = send(method, port, &path).await;
        op.ret = Instant::now();
        op.status = st;
        if op.verb == "acquire" && st == 200 {
            op.token = body["token"].as_str().map(str::to_owned);
            op.fence = body["fencing_token"].as_u64().unwrap_or(0);
            op.ttl = Duration::from_millis(body["ttl_ms"].as_u64().unwrap_or(0));
            held.push(Held {
                what: op.what,
                name: op.name.clone(),
                token: op.token.clone().unwrap_or_default(),
            });
        }
        if op.verb == "renew" && st == 200 {
            op.ttl = Duration::from_millis(body["ttl_ms"].as_u64().unwrap_or(0));
        }
        if (op.verb == "renew" || op.verb == "release") && st != 200 && st != 0 && st < 500 {
            held.retain(|h| Some(&h.token) != op.token.as_ref());
        }
        op.body = body;
        history.lock().unwrap().push(op);
        sleep(Duration::from_millis(rng.random_range(0..10))).await;
    }
}

/// One grant's life as the model sees it.
#[derive(Clone)]
struct Life<'a> {
    acq: &'a Op,
    /// Possibly held: [poss.0, poss.1).
    poss: (Instant, Instant),
    /// Certainly held: [cert.0, cert.1) (may be empty).
    cert: (Instant, Instant),
}

/// Latest outage end after `t`, so late-delivered requests are covered.
fn heal_after(outages: &[(Instant, Instant)], t: Instant) -> Instant {
    outages
        .iter()
        .filter(|(_, e)| *e >= t)
        .map(|(_, e)| *e)
        .max()
        .unwrap_or(t)
}

/// An outage (restart, partition) that begins while a grant may live can
/// extend it: etcd gives every lease its full TTL again after a restart,
/// and requests held in a partition arrive late.
fn widen(outages: &[(Instant, Instant)], slack: Duration, mut end: Instant) -> Instant {
    let ttl = Duration::from_secs(TTL_S);
    loop {
        let next = outages
            .iter()
            .filter(|(s, _)| *s < end)
            .map(|(_, e)| *e + ttl + slack)
            .fold(end, Instant::max);
        if next == end {
            return end;
        }
        end = next;
    }
}

/// The violation of refusing `a` on a token `op` granted and still held.
fn refused_while_held(
    op: &Op,
    a: &Op,
    cert_end: Instant,
    outages: &[(Instant, Instant)],
) -> String {
    let ttl = Duration::from_secs(TTL_S);
    let token = op.token.as_deref().unwrap_or("");
    let near: Vec<String> = outages
        .iter()
        .filter(|(s, e)| *e + ttl >= op.call && *s <= a.ret)
        .map(|(s, e)| {
            format!(
                "[{:+.3}s, {:+.3}s]",
                s.duration_since(op.call).as_secs_f64() - op.call.duration_since(*s).as_secs_f64(),
                e.duration_since(op.call).as_secs_f64() - op.call.duration_since(*e).as_secs_f64()
            )
        })
        .collect();
    format!(
        "{} of a token certainly held refused: {:?} {} token {token} at +{:?} (certainly held until +{:?}): {} {}; acquired by c{} in {:?}; outages nearby {near:?}",
        a.verb,
        op.what,
        op.name,
        a.call - op.call,
        cert_end - op.call,
        a.status,
        a.body,
        op.client,
        op.ret - op.call
    )
}

/// The life of the grant `op`, followed through the later `actions` on its
/// token (renewals, releases, completions), with the violations they show.
fn grant_life<'a>(
    op: &'a Op,
    actions: &[&Op],
    outages: &[(Instant, Instant)],
    slack: Duration,
    v: &mut Vec<String>,
) -> Life<'a> {
    let ttl = Duration::from_secs(TTL_S);
    let token = op.token.as_deref().unwrap_or("");
    let mut cert_end = op.call + op.ttl;
    let mut poss_end = widen(outages, slack, op.ret + op.ttl + slack);
    let mut released = false;
    for a in actions {
        poss_end = widen(outages, slack, poss_end);
        match (a.verb, a.status) {
            ("renew", 200) => {
                if a.call >= poss_end {
                    v.push(format!(
                        "expired holder renewed: {} {} token {token} renewed at +{:?} after it possibly expired at +{:?}",
                        op.verb, op.name, a.call - op.call, poss_end - op.call
                    ));
                }
                if a.call < cert_end && !released {
                    cert_end = cert_end.max(a.call + a.ttl);
                }
                poss_end = poss_end.max(a.ret + a.ttl + slack);
            }
            ("renew", s) if s == 0 || s >= 500 => {
                poss_end = poss_end.max(heal_after(outages, a.ret) + ttl + slack);
            }
            ("renew", _) | ("release", _) | ("complete", _)
                if !a.ambiguous() && a.status != 200 =>
            {
                // The call ran somewhere in [call, return]: a refusal
                // is wrong only if all of it lies in the certain interval.
                if a.ret < cert_end && !released {
                    v.push(refused_while_held(op, a, cert_end, outages));
                }
            }
            ("release", 200) | ("complete", 200) => {
                if !released {
                    cert_end = cert_end.min(a.call);
                    // A completed job stays claimed-or-done; one given back
                    // is gone.
                    if op.what != What::Job || a.verb == "release" {
                        poss_end = poss_end.min(a.ret);
                    }
                }
                released = true;
            }
            _ => {
                // Ambiguous release/complete: certainty ends at its call.
                cert_end = cert_end.min(a.call);
            }
        }
        if a.verb != "renew" {
            cert_end = cert_end.min(a.call);
        }
    }
    Life {
        acq: op,
        poss: (op.call, widen(outages, slack, poss_end)),
        cert: (op.ret, cert_end.max(op.ret)),
    }
}

/// Safety: certainly-held intervals never exceed the cap at once.
fn check_safety(what: What, name: &str, ls: &[Life], cap: usize, v: &mut Vec<String>) {
    let mut events: Vec<(Instant, i32, usize)> = Vec::new();
    for (i, l) in ls.iter().enumerate() {
        if l.cert.0 < l.cert.1 {
            events.push((l.cert.0, 1, i));
            events.push((l.cert.1, -1, i));
        }
    }
    events.sort_by_key(|(t, d, _)| (*t, *d));
    let mut live: Vec<usize> = Vec::new();
    for (_, d, i) in &events {
        if *d > 0 {
            live.push(*i);
            if live.len() > cap {
                let who: Vec<String> = live
                    .iter()
                    .map(|j| {
                        let a = ls[*j].acq;
                        format!("c{} fence {} fair={}", a.client, a.fence, a.fair)
                    })
                    .collect();
                v.push(format!(
                    "{what:?} {name}: {} certain holders of {cap}: {who:?}",
                    live.len()
                ));
            }
        } else {
            live.retain(|j| j != i);
        }
    }
}

/// Fencing tokens grow: a grant answered before another's call has a smaller token.
fn check_fencing(what: What, name: &str, ls: &[Life], v: &mut Vec<String>) {
    let mut grants: Vec<&Life> = ls.iter().filter(|l| l.acq.status == 200).collect();
    grants.sort_by_key(|l| l.acq.ret);
    let mut prefix_max: Vec<(Instant, u64)> = Vec::new();
    for l in &grants {
        let m = prefix_max.last().map_or(0, |p| p.1).max(l.acq.fence);
        prefix_max.push((l.acq.ret, m));
    }
    for l in &grants {
        let i = prefix_max.partition_point(|(t, _)| *t < l.acq.call);
        if i > 0 && prefix_max[i - 1].1 >= l.acq.fence {
            v.push(format!(
                "{what:?} {name}: fencing token {} not above an earlier grant's {}",
                l.acq.fence,
                prefix_max[i - 1].1
            ));
        }
    }
}

/// Liveness of the refusal `ls[i]` (a lock or a semaphore): some other
/// claimant could have held `cap` during the call, and a long `wait` did not
/// see it free for a whole second.
fn check_refusal(what: What, name: &str, ls: &[Life], i: usize, cap: usize, v: &mut Vec<String>) {
    let a = ls[i].acq;
    let (from, to) = (a.call, a.ret);
    // Possible claimants other than this call, overlapping [from, to].
    let mut ev: Vec<(Instant, i32)> = Vec::new();
    for (j, o) in ls.iter().enumerate() {
        if j != i && o.poss.0 < to && o.poss.1 > from {
            ev.push((o.poss.0.max(from), 1));
            ev.push((o.poss.1.min(to), -1));
        }
    }
    ev.sort_by_key(|(t, d)| (*t, -*d));
    let (mut n, mut most) = (0i32, 0i32);
    // The longest stretch with fewer than `cap` possible claimants.
    let (mut gap_from, mut longest) = (from, Duration::ZERO);
    let mut below = true;
    for (t, d) in &ev {
        n += d;
        most = most.max(n);
        let now_below = (n as usize) < cap;
        if below && !now_below {
            longest = longest.max(*t - gap_from);
        } else if !below && now_below {
            gap_from = *t;
        }
        below = now_below;
    }
    if below {
        longest = longest.max(to - gap_from);
    }
    if (most as usize) < cap {
        v.push(format!(
            "{what:?} {name} refused (c{} wait {:?} fair={}) though at most {most} of {cap} could be held during the call: {}",
            a.client, a.wait, a.fair, a.body
        ));
    } else if a.wait >= Duration::from_millis(1000) && longest >= Duration::from_millis(1000) {
        v.push(format!(
            "{what:?} {name} refused (c{} wait {:?} fair={}) though it was free for {longest:?} of the wait",
            a.client, a.wait, a.fair
        ));
    }
}

/// Read-write lock `name`: no writer's certain hold beside anyone's; fencing
/// tokens grow; a writer refused though nobody could hold or ask, or a
/// reader refused though no writer could hold or ask, is a violation.
/// Returns the pairs of readers certainly held at once (the liveness twin
/// of "no writer beside anyone": readers do share).
fn check_rw(name: &str, ls: &[Life], v: &mut Vec<String>) -> usize {
    let held: Vec<&Life> = ls.iter().filter(|l| l.cert.0 < l.cert.1).collect();
    let overlap = |a: &Life, b: &Life| a.cert.0 < b.cert.1 && b.cert.0 < a.cert.1;
    let readers: Vec<&&Life> = held.iter().filter(|l| !l.acq.write).collect();
    let shared = readers
        .iter()
        .enumerate()
        .map(|(i, a)| readers[i + 1..].iter().filter(|b| overlap(a, b)).count())
        .sum();
    for w in held.iter().filter(|l| l.acq.write) {
        for o in &held {
            if !std::ptr::eq(*o, *w) && overlap(o, w) {
                v.push(format!(
                    "Rw {name}: writer c{} (fence {}) certainly held beside {} c{} (fence {})",
                    w.acq.client,
                    w.acq.fence,
                    if o.acq.write { "writer" } else { "reader" },
                    o.acq.client,
                    o.acq.fence
                ));
            }
        }
    }
    check_fencing(What::Rw, name, ls, v);
    for (i, l) in ls.iter().enumerate() {
        if l.acq.status != 409 {
            continue;
        }
        // Who could keep this one out: anyone, for a writer; writers, for a reader.
        let mut rivals = vec![l.clone()];
        rivals.extend(
            ls.iter()
                .enumerate()
                .filter(|(j, o)| *j != i && (l.acq.write || o.acq.write))
                .map(|(_, o)| o.clone()),
        );
        check_refusal(What::Rw, name, &rivals, 0, 1, v);
    }
    shared
}

/// Jobs: at most one token completes a job; a claim that starts after a
/// completion was answered is told "completed".
fn check_jobs(history: &[Op], v: &mut Vec<String>) {
    let mut completed: HashMap<&str, (Instant, &str)> = HashMap::new();
    for op in history
        .iter()
        .filter(|o| o.verb == "complete" && o.status == 200)
    {
        let t = op.token.as_deref().unwrap_or("");
        match completed.get(op.name.as_str()) {
            Some((_, other)) if *other != t => {
                v.push(format!("job {} completed by two tokens", op.name))
            }
            Some((at, _)) if *at <= op.ret => {}
            _ => {
                completed.insert(op.name.as_str(), (op.ret, t));
            }
        }
    }
    for op in history
        .iter()
        .filter(|o| o.what == What::Job && o.verb == "acquire")
    {
        if let Some((at, _)) = completed.get(op.name.as_str())
            && *at < op.call
            && op.status == 200
        {
            v.push(format!(
                "job {} claimed again after it was completed",
                op.name
            ));
        }
    }
}

/// Check the history; returns the violations.
fn check(
    history: &[Op],
    sem_n: &HashMap<String, u32>,
    outages: &[(Instant, Instant)],
    slack: Duration,
) -> (Vec<String>, usize) {
    let mut v = Vec::new();
    let mut shared = 0;
    // Actions on each token, in call order.
    let mut by_token: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in history {
        if op.verb != "acquire"
            && let Some(t) = &op.token
        {
            by_token.entry(t.as_str()).or_default().push(op);
        }
    }
    for ops in by_token.values_mut() {
        ops.sort_by_key(|o| o.call);
    }
    // Claimants per (what, name): every acquisition call is a possible
    // claimant during its call (etcd writes a waiter's or a loser's key before
    // it knows); grants last longer.
    let mut lives: HashMap<(What, &str), Vec<Life<'_>>> = HashMap::new();
    for op in history.iter().filter(|o| o.verb == "acquire") {
        let key = (op.what, op.name.as_str());
        let ttl = Duration::from_secs(TTL_S);
        let life = if op.status == 200 {
            let token = op.token.as_deref().unwrap_or("");
            let actions = by_token.get(token).map(Vec::as_slice).unwrap_or(&[]);
            grant_life(op, actions, outages, slack, &mut v)
        } else {
            let end = if op.ambiguous() || outages.iter().any(|(s, e)| *s < op.ret && *e > op.call)
            {
                heal_after(outages, op.ret) + ttl + slack
            } else if op.what == What::Rw && op.write && !op.wait.is_zero() {
                op.ret + INTENT_SLACK
            } else {
                op.ret
            };
            Life {
                acq: op,
                poss: (op.call, end),
                cert: (op.ret, op.ret),
            }
        };
        lives.entry(key).or_default().push(life);
    }
    for ((what, name), ls) in &lives {
        if *what == What::Rw {
            shared += check_rw(name, ls, &mut v);
            continue;
        }
        let cap = match what {
            What::Lock | What::Job | What::Rw => 1usize,
            What::Sem => sem_n[*name] as usize,
        };
        check_safety(*what, name, ls, cap, &mut v);
        check_fencing(*what, name, ls, &mut v);
        // Liveness of refusals (locks and semaphores; jobs below).
        if *what == What::Job {
            continue;
        }
        for (i, l) in ls.iter().enumerate() {
            if l.acq.status == 409 {
                check_refusal(*what, name, ls, i, cap, &mut v);
            }
        }
    }
    check_jobs(history, &mut v);
    (v, shared)
}

/// Blackhole the backend (every proxy) or restart it (one Redlock server)
/// every few seconds until 8 s before `until`; returns the outages.
async fn inject_faults(
    rng: &mut StdRng,
    until: Instant,
    proxies: &[Proxy],
    server: &mut Backend,
) -> Vec<(Instant, Instant)> {
    let mut outages = Vec::new();
    while Instant::now() + Duration::from_secs(8) < until {
        sleep(Duration::from_millis(rng.random_range(2000..5000))).await;
        let from = Instant::now();
        if rng.random_bool(0.5) {
            proxies.iter().for_each(|p| p.set(Mode::Blackhole));
            cut(server, true);
            sleep(Duration::from_millis(rng.random_range(1000..4000))).await;
            proxies.iter().for_each(|p| p.set(Mode::Pass));
            cut(server, false);
        } else {
            restart(server, rng.random_range(0..3)).await;
        }
        outages.push((from, Instant::now()));
    }
    outages
}

/// Print the run's numbers (ops checked per second, answers) and a few
/// ambiguous answers.
#[allow(clippy::too_many_arguments)]
fn report(
    kind: &str,
    seed: u64,
    history: &[Op],
    elapsed: Duration,
    check_time: Duration,
    outages: usize,
    sem_n: &HashMap<String, u32>,
    violations: &[String],
) {
    let mut counts: HashMap<(String, u16), usize> = HashMap::new();
    for op in history {
        *counts.entry((op.verb.to_owned(), op.status)).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort();
    eprintln!(
        "model check on {kind}: seed {seed}: {} ops in {:.1} s ({:.0} ops/s run), checked in {:?}, {} outages, semaphores {:?}, {} violations; answers {:?}",
        history.len(),
        elapsed.as_secs_f64(),
        history.len() as f64 / elapsed.as_secs_f64(),
        check_time,
        outages,
        sem_n,
        violations.len(),
        counts
    );
    for op in history.iter().filter(|o| o.ambiguous()).take(5) {
        eprintln!(
            "ambiguous answer: {} {:?} {} after {:?}: {} {}",
            op.verb,
            op.what,
            op.name,
            op.ret - op.call,
            op.status,
            op.body
        );
    }
}

/// A proxy before every server, and the URL(s) to reach them (comma-joined).
async fn proxies_to(server: &Backend) -> (Vec<Proxy>, String) {
    let mut proxies = Vec::new();
    let mut vias = Vec::new();
    for url in server.urls() {
        let proxy = Proxy::to_url(&url).await;
        vias.push(proxy.url_for(&url));
        proxies.push(proxy);
    }
    (proxies, vias.join(","))
}

/// Enough grants to mean anything, and readers that shared a read-write
/// lock at least once (certainly held at once).
fn meaningful(history: &[Op], shared: usize, kind: &str, seed: u64) {
    let count = |f: &dyn Fn(&Op) -> bool| history.iter().filter(|o| f(o)).count();
    let rw = |write: bool, status: u16| {
        count(&|o| {
            o.what == What::Rw && o.verb == "acquire" && o.write == write && o.status == status
        })
    };
    let jobs = |verb: &str| count(&|o| o.what == What::Job && o.verb == verb && o.status == 200);
    eprintln!(
        "model check on {kind}: read-write locks: reads {} granted / {} refused, writes {} granted / {} refused, {shared} pairs of readers certainly held at once; job claims renewed {}, given back {}",
        rw(false, 200),
        rw(false, 409),
        rw(true, 200),
        rw(true, 409),
        jobs("renew"),
        jobs("release")
    );
    let grants = history
        .iter()
        .filter(|o| o.status == 200 && o.verb == "acquire")
        .count();
    assert!(grants > 20, "too few grants to mean anything (seed {seed})");
    assert!(
        shared > 0,
        "readers never shared a read-write lock (seed {seed})"
    );
}

/// How long after its TTL a grant may still live on `kind`'s backend.
fn slack(kind: &str) -> Duration {
    match kind {
        "etcd" => Duration::from_millis(1500),
        // A holder expires by each sidecar's first sight of its renewal,
        // which trails the answer by the watch's delivery.
        "kubernetes" => Duration::from_millis(500),
        _ => Duration::from_millis(300),
    }
}

async fn model_check(kind: &'static str) {
    let seed = seed();
    let faults = faults();
    let run = Duration::from_secs(secs());
    eprintln!(
        "model check on {kind}: MODEL_SEED={seed} MODEL_SECS={} MODEL_FAULTS={}",
        run.as_secs(),
        faults as u8
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut server = start_server(kind).await;
    let (proxies, via) = proxies_to(&server).await;
    let test = format!("model-{kind}");
    let sidecars = sidecars(kind, &server, &via, &test).await;
    let ports: Vec<u16> = sidecars.iter().map(|(_, p)| *p).collect();
    let sem_n: Arc<HashMap<String, u32>> = Arc::new(
        SEMS.iter()
            .map(|s| (s.to_string(), rng.random_range(1..=3)))
            .collect(),
    );
    let history = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let until = started + run;
    let mut tasks = Vec::new();
    for id in 0..CLIENTS {
        tasks.push(tokio::spawn(client(
            id,
            seed,
            kind,
            ports.clone(),
            sem_n.clone(),
            until,
            faults,
            history.clone(),
        )));
    }
    let outages = if faults {
        inject_faults(&mut rng, until, &proxies, &mut server).await
    } else {
        Vec::new()
    };
    for t in tasks {
        t.await.expect("a model client panicked");
    }
    let elapsed = started.elapsed();
    let history = history.lock().unwrap().clone();
    let slack = slack(kind);
    let t0 = Instant::now();
    let (violations, shared) = check(&history, &sem_n, &outages, slack);
    let check_time = t0.elapsed();
    report(
        kind,
        seed,
        &history,
        elapsed,
        check_time,
        outages.len(),
        &sem_n,
        &violations,
    );
    for x in violations.iter().take(20) {
        eprintln!("VIOLATION: {x}");
    }
    meaningful(&history, shared, kind, seed);
    assert!(
        violations.is_empty(),
        "{} violations on {kind}; replay with MODEL_SEED={seed}",
        violations.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_check_on_etcd() {
    model_check("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_check_on_redis() {
    model_check("redis").await;
}

/// The coordination API on a Redlock group of three servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_check_on_redlock() {
    model_check("redlock").await;
}

/// The coordination API on the Kubernetes Lease backend (the stand-in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_check_on_kubernetes() {
    model_check("kubernetes").await;
}
