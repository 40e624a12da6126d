//! The election on Redis: a client of [`Group`].
//!
//! - **Campaign** ([`Lua::Campaign`], atomic per server): if the key is free,
//!   count the fencing counter beside it (same `{hash tag}`) up to at least
//!   the server's clock and `SET key "<token>|<fencing>|<identity>" PX ttl`;
//!   else return the current value and its `PTTL`. The token is random per
//!   term and decides ownership; the identity lets followers read who leads.
//! - **Renew**: check that the value carries our token, then `PEXPIRE`. A
//!   key that is gone or someone else's is never re-created (single server).
//! - **Resign**: check-then-`DEL`, then `PUBLISH` the released value on the
//!   election's channel, which followers subscribe to for a fast handover.
//!   A release names the registry's best other candidate as successor
//!   (`<prefix>{<election>}:successor`, set in the same script with a TTL
//!   of [`SUCCESSOR_WAIT_CAP`]: the named candidate may itself be asleep in
//!   an earlier wait when the release lands, so the marker outlives any
//!   such wait; a dead successor costs the others at most that cap); the
//!   campaign script leaves a free key to that successor while the marker
//!   lives, and refuses it while the election is paused ([`super::controls`]).
//!   The answers and the round's decision: [`super::answer`].
//! - **Redlock**: a term is granted only with a quorum, its TTL shortened by
//!   [`drift`]; the Elector counts validity from the instant the first
//!   request was sent. The fencing token is the largest counter in the
//!   quorum, raised on a quorum before the term is claimed: the group's one
//!   grant rule ([`Group::grant`]), which coordination follows too.
//! - **`--redis-min-replicas`**: a server whose replicas did not acknowledge
//!   its grant, raise or renewal does not count towards the quorum (one
//!   server: the term is not won, or the renewal fails); the campaign gives
//!   such a grant back like any other it does not keep.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use rand::Rng;
use redis::Value;
use tokio::time::Instant;
use tracing::warn;

use super::answer::{Answer, Found};
use super::answered::Answers;
use super::group::{Acquisition, Group, unexpected};
use super::holders::{parse_value, quorum_holder};
use super::lua::{Lua, Stored, ms};
use super::released::Released;
use super::server::{Server, text_of};
use super::verdict::Verdict;
use super::{BACKEND, RedisOptions, is_unreplicated};
use crate::backend::candidates::{Candidate, Listed, SUCCESSOR_WAIT_CAP};
use crate::backend::controls::Controls;
use crate::backend::{
    BackendError, Campaign, Holder, LeaseBackend, LostReason, Renewal, Result, Term,
};
use crate::backend::{CandidateRegistry, ControlStore};

/// What this candidate knows of one server's process.
#[derive(Default)]
struct RunSeen {
    /// `run_id` of the process that last answered; `None` before the first answer.
    id: Option<String>,
    /// No campaign on this server before this instant: it restarted (or was
    /// replaced) while we watched, so a term it forgot may still be running.
    hold_until: Option<Instant>,
}

/// The Redis [`LeaseBackend`] for one election, over one server or a Redlock group.
pub struct RedisBackend {
    prefix: String,
    pub(super) key: String,
    pub(super) counter_key: String,
    channel: String,
    successor_key: String,
    /// Since when the server's replication id serves the election (see
    /// [`Lua::Campaign`]).
    primary_key: String,
    /// The largest fencing token this candidate has seen: a campaign's token
    /// is above it, even on a promoted replica whose counter went back.
    seen_token: AtomicU64,
    pub(super) group: Arc<Group>,
    /// The release channel, subscribed on every server.
    released: Released,
    /// The registry's channel, subscribed on every server.
    pub(super) registry_notes: Released,
    /// The controls' channel, subscribed on every server.
    pub(super) control_notes: Released,
    /// Per server: the process last seen.
    runs: Vec<std::sync::Mutex<RunSeen>>,
    /// How long the registry and controls watches wait for a notice before
    /// they read again, in ms ([`RedisBackend::set_reread`]).
    reread_ms: AtomicU64,
    /// The controls the last renewal done on a quorum answered
    /// ([`super::controls`]); a change wakes the controls watch.
    pub(super) renewed_controls: tokio::sync::watch::Sender<Option<Controls>>,
    /// The failsafe roster to write with the term ([`super::roster`]).
    pub(super) failsafe: super::roster::FailsafeState,
}

/// A random token of 16 bytes in hex (a term's, a grant's, a shard session's id).
pub(super) fn new_token() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl RedisBackend {
    /// A backend for election keys under `prefix` (`<prefix>{<election>}`).
    /// Does not connect: the first call does.
    ///
    /// # Errors
    /// A message naming the (redacted) URL that cannot be used.
    pub fn new(
        prefix: &str,
        election: &str,
        options: RedisOptions,
    ) -> std::result::Result<Arc<Self>, String> {
        let servers = match &options.sentinel {
            Some(sentinel) => vec![Server::sentinel(sentinel, &options)?],
            None if options.cluster => vec![Server::cluster(&options.urls, &options)?],
            None => options
                .urls
                .iter()
                .map(|url| Server::open(url, &options))
                .collect::<std::result::Result<Vec<_>, _>>()?,
        };
        if servers.is_empty() {
            return Err("no Redis URL given".into());
        }
        let n = servers.len();
        let base = format!("{prefix}{{{election}}}");
        Ok(Arc::new(RedisBackend {
            prefix: prefix.to_owned(),
            counter_key: format!("{base}:fencing"),
            channel: format!("{base}:released"),
            successor_key: format!("{base}:successor"),
            primary_key: format!("{base}:primary"),
            seen_token: AtomicU64::new(0),
            key: base,
            group: Arc::new(Group::new(servers)),
            released: Released::new(n),
            registry_notes: Released::new(n),
            control_notes: Released::new(n),
            runs: (0..n).map(|_| Default::default()).collect(),
            reread_ms: AtomicU64::new(super::FALLBACK.as_millis() as u64),
            renewed_controls: tokio::sync::watch::Sender::new(None),
            failsafe: Default::default(),
        }))
    }

    /// How long the registry and controls watches wait for a pub/sub notice
    /// before they read again (default [`FALLBACK`](super::FALLBACK); the sidecar sets
    /// the lease duration, at least that). A notice is lost only with its
    /// subscription, which the watch sees and reports; the re-read finds
    /// what no notice announces (a hand edit of a control key).
    pub fn set_reread(&self, every: Duration) {
        self.reread_ms
            .store(every.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// See [`RedisBackend::set_reread`].
    pub(super) fn reread(&self) -> Duration {
        Duration::from_millis(self.reread_ms.load(Ordering::Relaxed))
    }

    /// Number of servers that must agree (N/2 + 1).
    pub fn quorum(&self) -> usize {
        self.group.quorum()
    }

    /// Number of servers (1 = single instance, more = Redlock).
    pub fn servers(&self) -> usize {
        self.group.servers().len()
    }

    /// The key prefix in force, e.g. `leader-elector:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The servers as a (Redlock) group, shared with the coordination API.
    pub fn group(&self) -> Arc<Group> {
        self.group.clone()
    }

    /// Run the campaign script on server `i` and read its answer, keeping
    /// track of the server's process (`run_id`).
    async fn acquire_on(
        &self,
        i: usize,
        token: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Answer> {
        let server = &self.group.servers()[i];
        let (known, holding) = {
            let seen = self.runs[i].lock().expect("run lock");
            let holding = seen.hold_until.is_some_and(|t| Instant::now() < t);
            (seen.id.clone().unwrap_or_default(), holding)
        };
        let hold = if holding { "1" } else { "0" };
        let paused = self.paused_key();
        let (roster, roster_key) = self.campaign_roster();
        let keys = [
            &self.key,
            &self.counter_key,
            &paused,
            &self.successor_key,
            &self.primary_key,
            &roster_key,
        ];
        let want = server.min_replicas().to_string();
        let cap = ms(SUCCESSOR_WAIT_CAP);
        let seen = self.seen_token.load(Ordering::SeqCst).to_string();
        let args = [
            token,
            identity,
            &ms(ttl),
            &known,
            hold,
            &want,
            &cap,
            &seen,
            &roster,
        ];
        let v = server.eval(Lua::Campaign, &keys, &args).await?;
        let Value::Array(items) = &v else {
            return Err(unexpected(&v));
        };
        let run = items
            .last()
            .and_then(text_of)
            .ok_or_else(|| unexpected(&v))?;
        let hold_until = self.saw_run(i, server, run, ttl);
        self.answer(server, &v, hold_until)
    }

    /// Record server `i`'s `<run_id>/<master_replid>`. A new process behind
    /// the same address, or a new replication id (a replica promoted, with
    /// Sentinel the primary it names now): keep out of it for one TTL (plus
    /// the uptime clock's second) from now on our own clock, whatever its
    /// wall clock says. Returns the hold-off's end.
    fn saw_run(&self, i: usize, server: &Server, run: String, ttl: Duration) -> Option<Instant> {
        let mut seen = self.runs[i].lock().expect("run lock");
        if seen.id.as_deref().is_some_and(|k| k != run) {
            warn!(server = %server.label(), run_id = %run, "the Redis server restarted, was replaced or a replica was promoted (a new run_id or replication id): no campaign on it for one lease duration");
            seen.hold_until = Some(Instant::now() + ttl + Duration::from_secs(1));
        }
        seen.id = Some(run);
        seen.hold_until
    }

    /// Ask every server at once and sum up the answers.
    async fn ask_all(&self, token: &str, identity: &str, ttl: Duration) -> Found {
        let n = self.servers();
        let answers = join_all((0..n).map(|i| self.acquire_on(i, token, identity, ttl))).await;
        let mut found = Found::default();
        for (i, a) in answers.into_iter().enumerate() {
            match a {
                Ok(Answer::Acquired(f)) => {
                    self.saw_token(f);
                    found.acquired.push((i, f));
                }
                Ok(Answer::Held(v, pttl)) => {
                    let holder = parse_value(&v, pttl);
                    self.saw_token(holder.fencing_token);
                    found.held.push(holder);
                }
                Ok(Answer::Fresh(ms)) => {
                    let d = Duration::from_millis(ms.max(1) as u64);
                    found.fresh = Some(found.fresh.map_or(d, |f| f.min(d)));
                }
                Ok(Answer::Paused) => found.paused += 1,
                Ok(Answer::Yielding(ms)) => {
                    let d = Duration::from_millis(ms.max(1) as u64);
                    found.yielding = Some(found.yielding.map_or(d, |f| f.min(d)));
                }
                Err(e) => {
                    if is_unreplicated(&e) {
                        found.unacked.push(i);
                    }
                    found.error.get_or_insert(e);
                }
            }
        }
        found
    }

    /// Remember `token` if it is the largest seen.
    fn saw_token(&self, token: u64) {
        self.seen_token.fetch_max(token, Ordering::SeqCst);
    }

    /// End `term`, naming `successor`: the release script deletes the key
    /// and sets the successor marker for [`SUCCESSOR_WAIT_CAP`], in one
    /// step on each server.
    async fn release_to(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        let wait = ms(SUCCESSOR_WAIT_CAP);
        let to = successor.unwrap_or("");
        let args = [term.holder.term_id.as_str(), &self.channel, "", to, &wait];
        let keys = [self.key.as_str(), &self.successor_key];
        resigned(self.group.release(Lua::Release, &keys, &args).await)
    }

    async fn read_on(&self, server: &Server) -> Result<Option<Holder>> {
        let (value, pttl): (Option<String>, i64) = server
            .query(
                "read",
                redis::pipe()
                    .cmd("GET")
                    .arg(&self.key)
                    .cmd("PTTL")
                    .arg(&self.key),
            )
            .await?;
        Ok(value.map(|v| parse_value(&v, pttl)))
    }
}

#[async_trait]
impl LeaseBackend for RedisBackend {
    fn about(&self) -> &'static crate::backend::About {
        BACKEND
    }

    async fn campaign(
        &self,
        identity: &str,
        ttl: Duration,
        previous: Option<&Holder>,
    ) -> Result<Campaign> {
        if let Some(p) = previous {
            self.saw_token(p.fencing_token);
        }
        // Subscribe before reading, so a release after our read is not missed.
        self.released.subscribe(&self.group, &self.channel).await;
        let start = Instant::now();
        let token = new_token();
        let found = self.ask_all(&token, identity, ttl).await;
        let ask = Acquisition {
            key: &self.key,
            counter: &self.counter_key,
            token: &token,
            owner: identity,
            ttl,
            give_back: (Lua::Release, &[&token, &self.channel, ""]),
        };
        let granting = self
            .group
            .grant(&ask, &found.acquired, &found.taken(), start)
            .await;
        let decided = self.decide(granting, found, &ask);
        if let Ok(Campaign::Elected(_)) = &decided {
            self.failsafe_term_began();
        }
        decided
    }

    async fn read(&self) -> Result<Option<Holder>> {
        self.released.subscribe(&self.group, &self.channel).await;
        let reads = join_all(self.group.servers().iter().map(|s| self.read_on(s))).await;
        let held: Vec<Holder> = Answers::of(reads)
            .on_quorum(&self.group, "answered")?
            .into_iter()
            .flatten()
            .collect();
        Ok(quorum_holder(&held, self.quorum()))
    }

    async fn renew(&self, term: &Term) -> Result<Renewal> {
        // Redlock: the value to put back where a server lost the key.
        let recreate = if self.group.is_redlock() {
            Stored {
                token: term.holder.term_id.to_string(),
                fencing: term.holder.fencing_token,
                owner: term.holder.identity.clone(),
            }
            .encode()
        } else {
            String::new()
        };
        let (keys, args) = self.renew_call(term, recreate);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let verdict = self.renew_reading_controls(&keys, &args).await;
        let renewed = renewal(verdict, term, self.servers());
        if let Ok(Renewal::Renewed { .. }) = &renewed {
            self.failsafe_renewed();
        }
        renewed
    }

    async fn release(&self, term: &Term, successor: Option<&str>) -> Result<()> {
        self.release_to(term, successor).await
    }

    async fn watch(&self, seen: &Holder) -> Result<()> {
        self.released.subscribe(&self.group, &self.channel).await;
        if self.released.wait(seen.term_id.as_str()).await {
            return Ok(());
        }
        // Every subscription is broken: report it; the Elector backs off and
        // campaigns again (which re-subscribes).
        Err(BackendError::Unreachable {
            backend: BACKEND,
            endpoints: self.group.endpoints(),
            source: "the release-channel subscription broke on every server".into(),
        })
    }
}

#[async_trait]
impl CandidateRegistry for RedisBackend {
    async fn publish_candidate(&self, candidate: &Candidate, ttl: Duration) -> Result<()> {
        self.publish(candidate, ttl).await
    }

    async fn withdraw_candidate(&self, identity: &str) -> Result<()> {
        self.withdraw(identity).await
    }

    async fn candidates(&self) -> Result<Vec<Listed>> {
        self.list().await
    }

    async fn watch_candidates(&self) -> Result<()> {
        self.watch_registry().await
    }
}

#[async_trait]
impl ControlStore for RedisBackend {
    async fn controls(&self) -> Result<Controls> {
        self.read_controls().await
    }

    async fn watch_controls(&self, seen: &Controls) -> Result<Controls> {
        self.watch_controls_from(seen).await
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        self.pause(paused).await
    }

    async fn request_switchover(&self, to: Option<&str>) -> Result<()> {
        self.switchover(to).await
    }
}

/// The election's answer to the renewal verdict `v` of `term` on `n` servers.
///
/// # Errors
/// The verdict's error when a quorum may still hold the key.
pub(crate) fn renewal(v: Verdict, term: &Term, n: usize) -> Result<Renewal> {
    match v {
        Verdict::Done { by } => Ok(Renewal::Renewed {
            ttl: term.ttl,
            servers: (n > 1).then_some((by, n)),
        }),
        Verdict::Gone => Ok(Renewal::Lost(LostReason::KeyDeleted)),
        Verdict::Taken => Ok(Renewal::Lost(LostReason::KeyOverwritten)),
        Verdict::Failed(e) => Err(e),
    }
}

/// The election's answer to the release verdict `v`: resigned unless a
/// quorum may still hold the key.
///
/// # Errors
/// The verdict's error when a quorum may still hold the key.
pub(crate) fn resigned(v: Verdict) -> Result<()> {
    match v {
        Verdict::Failed(e) => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::drift;

    #[test]
    fn drift_follows_the_redlock_spec() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
    }
}
