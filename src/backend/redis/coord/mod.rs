//! Coordination on Redis, one server or a Redlock group, as a client of
//! [`Group`] (the scripts are in [`crate::backend::redis::lua`]):
//! - locks: `SET NX PX` of `<token>|<fencing>|<owner>` with a fencing counter
//!   beside the key (same hash tag); renew = check-then-`PEXPIRE`; release =
//!   check-then-`DEL`;
//! - semaphores, one server: a sorted set of tokens scored by expiry (Redis
//!   `TIME`); one script drops expired holders, counts, and adds — never more
//!   than N live;
//! - semaphores, Redlock: N **slots**, each a Redlock lock
//!   (`<key>:slot:<i>`), the slot named in the permit's token. Counting
//!   permits per server and granting on a majority is not safe: with N = 2 on
//!   three servers, permits on servers {1,2}, {2,3} and {1,3} leave every
//!   server counting 2, yet 3 are live. A slot is held by one permit at a time
//!   (two majorities intersect), so at most N are;
//! - job claims: `SET NX PX` on the claim unless a `done` key exists;
//!   complete = check-then-(`SET done PX retention`, `DEL claim`); renew and
//!   give back as a lock's (`jobs`);
//! - read-write locks: see `rwlock`.
//!
//! On a Redlock group each verb follows [`Group`]'s rules: granted on a
//! quorum within the validity (the grant's `ttl_ms` is the validity left),
//! released everywhere on failure, fencing tokens raised on a quorum before a
//! grant is handed out; an acquisition that split the servers with others
//! retries twice after a random delay, as the spec advises. Renewals,
//! releases and completions answer by the group's one verdict of the servers'
//! answers ([`crate::backend::redis::verdict`]), the election's too. With
//! `--redis-min-replicas` a server's grant or renewal counts only once its
//! replicas acknowledged it; one they did not is given back, and a request
//! that no quorum acknowledged answers 503 naming the replicas.
//!
//! A missing fencing counter starts at the server's clock in milliseconds,
//! so tokens keep growing across a restart without persistence. Fair locks
//! need etcd ([`CoordError::Unsupported`], HTTP 400).

mod jobs;
pub(super) mod promoted;
mod rwlock;
mod slots;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use redis::Value;
use tokio::time::Instant;

use crate::backend::BackendError;
use crate::backend::coordination::{
    Acquire, CoordError, Coordinator, Grant, Kind, Object, Outcome, Result, Token, TokenKind, Try,
    nap,
};
use crate::backend::redis::RedisBackend;
use crate::backend::redis::group::{Acquisition, Granting, Group, Round, unexpected};
use crate::backend::redis::lua::{COUNTER_DIGITS, Lua, Stored, ms};
use crate::backend::redis::server::text_of;
use crate::backend::redis::verdict::Verdict;

pub use wait::{MAX_NAP, MAX_NAP_SUBSCRIBED};

/// Attempts of one acquisition that split a Redlock group with others.
const SPLIT_ATTEMPTS: usize = 3;

/// The Redis [`Coordinator`], over the election's servers.
pub struct RedisCoord {
    group: Arc<Group>,
    prefix: String,
    waiters: wait::Waiters,
    /// On a Redis Cluster: one promotion marker per slot, not per server.
    cluster: bool,
}

/// One acquisition to try on the group.
struct Ask<'a> {
    lua: Lua,
    /// The object key, the fencing counter, then any others.
    keys: &'a [String],
    owner: &'a str,
    /// Third script argument (TTL in ms, or permits).
    args: Vec<String>,
    name: &'a str,
    token: Token,
    ttl: Duration,
}

/// An acquisition's end: granted, or the refusals to read.
enum Got {
    Granted(Grant),
    Refused(Round),
}

impl RedisCoord {
    /// Coordination keys under the election's prefix, on its servers.
    pub fn new(backend: Arc<RedisBackend>) -> Self {
        let group = backend.group();
        RedisCoord {
            cluster: group.servers().iter().any(|s| s.is_cluster()),
            group,
            prefix: backend.prefix().to_owned(),
            waiters: wait::Waiters::default(),
        }
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{{{kind}:{name}}}", self.prefix)
    }

    /// The TTL a grant or renewal can promise: the whole TTL on one server,
    /// the `validity` left on a Redlock group.
    fn promise(&self, ttl: Duration, validity: Duration) -> Duration {
        if self.group.is_redlock() {
            validity
        } else {
            ttl
        }
    }

    /// One acquisition on the group by its grant rule ([`Group::grant`]): a
    /// quorum grants within the validity and confirms the raised fencing
    /// token, or nothing is kept. A fencing counter refused by any server
    /// refuses the acquisition.
    async fn try_once(&self, ask: &Ask<'_>) -> Result<Got> {
        let token = ask.token.to_string();
        let key = ask.keys[0].as_str();
        let keys: Vec<&str> = ask.keys.iter().map(String::as_str).collect();
        let mut args = vec![token.as_str(), ask.owner];
        args.extend(ask.args.iter().map(String::as_str));
        // The promotion marker goes last ([`promoted`]).
        let marker = promoted::marker(&self.prefix, key, self.cluster);
        let mut with_marker = keys.clone();
        with_marker.push(&marker);
        let round = self.group.acquire_round(ask.lua, &with_marker, &args).await;
        let bad = round.refusals().find_map(|r| match r.as_slice() {
            [Value::Int(-2), x] => Some(corrupt_counter(x, &ask.keys[1])),
            _ => None,
        });
        let granted = if bad.is_some() {
            Vec::new()
        } else {
            round.granted()
        };
        // Give back by a check-and-delete release, of the permit in the set
        // for a one-server semaphore.
        let give_back = match ask.lua {
            Lua::SemAcquire => (Lua::SemRelease, &[token.as_str()][..]),
            Lua::RwRead => (Lua::RwUnread, &[token.as_str()][..]),
            _ => (Lua::Release, &[token.as_str(), key, ""][..]),
        };
        let rule = Acquisition {
            key,
            counter: &ask.keys[1],
            token: &token,
            owner: ask.owner,
            ttl: ask.ttl,
            give_back,
        };
        let taken = round.taken();
        match self.group.grant(&rule, &granted, &taken, round.start).await {
            Granting::Granted {
                fencing, validity, ..
            } => Ok(Got::Granted(Grant {
                name: ask.name.to_owned(),
                token,
                fencing_token: fencing,
                ttl_ms: self.promise(ask.ttl, validity).as_millis() as u64,
            })),
            Granting::Unconfirmed { confirmed } => Err(CoordError::Backend(self.group.no_quorum(
                None,
                confirmed,
                "recorded the fencing token",
            ))),
            Granting::Refused => self.refused(round, bad, keys),
        }
    }

    /// A refused acquisition: the corrupt counter, else an error when fewer
    /// than a quorum answered, else the refusals to read.
    fn refused(&self, mut round: Round, bad: Option<CoordError>, keys: Vec<&str>) -> Result<Got> {
        if let Some(bad) = bad {
            return Err(bad);
        }
        let answered = round.answered();
        if self.group.short_of_quorum(answered) {
            let e = round.first_error();
            let e = self.group.enough(answered, e, "answered").unwrap_err();
            // Named as before: the counter last.
            let mut keys = keys;
            let counter = keys.remove(1);
            keys.push(counter);
            return Err(failed(e, &keys));
        }
        if let Some(wait) = promoted::held_off(&round) {
            return Err(wait);
        }
        Ok(Got::Refused(round))
    }

    /// [`RedisCoord::try_once`], again after a random delay while it split
    /// a Redlock group (some servers granted, too few).
    async fn attempt(&self, ask: Ask<'_>) -> Result<Got> {
        let mut attempt = 1;
        loop {
            let got = self.try_once(&ask).await?;
            let split = matches!(&got, Got::Refused(r) if !r.granted().is_empty());
            if !split || attempt >= SPLIT_ATTEMPTS {
                return Ok(got);
            }
            attempt += 1;
            let pause = rand::rng().random_range(5..40);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// The key of a semaphore's permit: the set on one server, the token's
    /// slot on a Redlock group.
    fn permit_key(&self, name: &str, token: &Token) -> String {
        let key = self.key("sem", name);
        if self.group.is_redlock() {
            format!("{key}:slot:{}", token.lease)
        } else {
            key
        }
    }

    /// Whether `token` is a version-1 Redis token that may act on `kind`
    /// (permits on a Redlock group carry their slot where etcd has its lease).
    fn usable(&self, kind: Kind, token: &str) -> Option<Token> {
        let t = Token::parse(token)?;
        let slot_ok = t.lease == 0 || (kind == Kind::Semaphore && self.group.is_redlock());
        (t.kind.serves(kind) && slot_ok).then_some(t)
    }
}

/// A backend error, naming the coordination keys for `WRONGTYPE`.
fn failed(err: BackendError, keys: &[&str]) -> CoordError {
    if let BackendError::Rejected {
        code: "wrongtype", ..
    } = err
    {
        return CoordError::Corrupt {
            key: keys.join(" or "),
            found: "a value of another Redis type (WRONGTYPE)".into(),
        };
    }
    CoordError::Backend(err)
}

/// The coordination answer to the renew, release or completion verdict `v`
/// (see [`crate::backend::redis::verdict`]) on `keys`; `ttl` is what a
/// renewal promises.
///
/// # Errors
/// The verdict's error when a quorum may still hold the key, as
/// [`CoordError::Corrupt`] for a key of another type.
pub(crate) fn outcome(v: Verdict, ttl: Option<Duration>, keys: &[&str]) -> Result<Outcome> {
    match v {
        Verdict::Done { .. } => Ok(Outcome::Ok(ttl)),
        Verdict::Gone => Ok(Outcome::Gone),
        Verdict::Taken => Ok(Outcome::NotYours),
        Verdict::Failed(e) => Err(failed(e, keys)),
    }
}

/// The owner label of a held value.
fn owner_of(v: &Value) -> Option<String> {
    text_of(v).map(|t| Stored::parse(&t).owner)
}

/// The refusal of a script that found the fencing counter at `key` unusable
/// (see [`COUNTER_DIGITS`]).
fn corrupt_counter(found: &Value, key: &str) -> CoordError {
    let found = text_of(found).unwrap_or_else(|| format!("{found:?}"));
    CoordError::Corrupt {
        key: key.to_owned(),
        found: format!(
            "a fencing counter of {found:?}, not a non-negative integer of at most {COUNTER_DIGITS} digits (nothing was written)"
        ),
    }
}

/// The holder's owner most servers refused with (`{0, value}` answers).
fn held_by(round: &Round) -> Option<String> {
    let owners: Vec<String> = round
        .refusals()
        .filter_map(|r| match r.as_slice() {
            [Value::Int(0), v] => owner_of(v),
            _ => None,
        })
        .collect();
    owners
        .iter()
        .max_by_key(|o| owners.iter().filter(|x| x == o).count())
        .cloned()
}

#[async_trait]
impl Coordinator for RedisCoord {
    fn backend(&self) -> &'static str {
        "redis"
    }

    /// Each server's request deadline: every call of a request is cut to
    /// what is left of its budget (`crate::budget`).
    fn deadline(&self) -> Option<Duration> {
        self.group.servers().iter().map(|s| s.timeout()).max()
    }

    async fn acquire(&self, what: Acquire<'_>, owner: &str, ttl: Duration) -> Result<Try> {
        match what {
            Acquire::Lock(name) => self.lock(name, owner, ttl).await,
            Acquire::FairLock { .. } => Err(CoordError::Unsupported(
                "fair locks need the etcd or the Kubernetes Lease backend (their waiters queue in arrival order); on Redis use fair=false".into(),
            )),
            Acquire::Semaphore { name, permits } => {
                self.semaphore(name, owner, permits, ttl).await
            }
            Acquire::RwLock { name, mode, intent } => {
                self.rw_acquire(name, owner, mode, ttl, intent).await
            }
            Acquire::Job { queue, job } => self.claim_job(queue, job, owner, ttl).await,
        }
    }

    async fn renew(&self, object: Object<'_>, token: &str, ttl: Duration) -> Result<Outcome> {
        let name = match object {
            Object::Lock(name) | Object::Semaphore(name) => name,
            Object::RwLock(name) => return self.rw_extend(name, token, ttl).await,
            Object::Job { queue, job } => return self.renew_job(queue, job, token, ttl).await,
        };
        let kind = object.kind();
        let Some(t) = self.usable(kind, token) else {
            return Ok(Outcome::Gone);
        };
        let start = Instant::now();
        let (lua, key) = match kind {
            Kind::Semaphore if self.group.is_redlock() => (Lua::Renew, self.permit_key(name, &t)),
            Kind::Semaphore => (Lua::SemRenew, self.key("sem", name)),
            _ => (Lua::Renew, self.key("lock", name)),
        };
        let verdict = self.group.renew(lua, &[&key], &[token, &ms(ttl)]).await;
        let promise = self.promise(ttl, self.group.validity(ttl, start));
        outcome(verdict, Some(promise), &[&key])
    }

    async fn release(&self, object: Object<'_>, token: &str) -> Result<Outcome> {
        let name = match object {
            Object::Lock(name) | Object::Semaphore(name) => name,
            Object::RwLock(name) => return self.rw_drop(name, token).await,
            Object::Job { queue, job } => return self.release_job(queue, job, token).await,
        };
        let kind = object.kind();
        let Some(t) = self.usable(kind, token) else {
            return Ok(Outcome::Gone);
        };
        let key = match kind {
            Kind::Semaphore => self.permit_key(name, &t),
            _ => self.key("lock", name),
        };
        let verdict = if kind == Kind::Semaphore && !self.group.is_redlock() {
            // A permit that is gone cannot be told from one never held.
            self.group.release(Lua::SemRelease, &[&key], &[token]).await
        } else {
            let args = [token, key.as_str(), "released"];
            self.group.release(Lua::Release, &[&key], &args).await
        };
        outcome(verdict, None, &[&key])
    }

    async fn complete(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome> {
        self.complete_job(queue, job, token, retention).await
    }

    async fn give_up(&self, name: &str, id: &str) -> Result<()> {
        self.rw_drop_intent(name, id).await;
        Ok(())
    }

    async fn changed(&self, object: Object<'_>, seen: u64, until: Instant) -> Result<()> {
        let key = match object {
            Object::Lock(name) => Some(self.key("lock", name)),
            Object::Semaphore(name) => Some(self.key("sem", name)),
            Object::RwLock(name) => Some(self.rw_base(name)),
            // Nobody waits on a job claim.
            Object::Job { .. } => None,
        };
        let Some(key) = key.filter(|_| !self.group.is_redlock()) else {
            // No single channel to trust on a group: look again soon.
            nap(until).await;
            return Ok(());
        };
        let server = &self.group.servers()[0];
        let kind = object.kind();
        self.waiters
            .changed(server, &self.prefix, kind, &key, seen, until)
            .await
    }
}

impl RedisCoord {
    /// One attempt at plain lock `name` ([`Acquire::Lock`]).
    async fn lock(&self, name: &str, owner: &str, ttl: Duration) -> Result<Try> {
        let key = self.key("lock", name);
        let keys = [key.clone(), format!("{key}:fencing")];
        let ask = Ask {
            lua: Lua::Lock,
            keys: &keys,
            owner,
            args: vec![ms(ttl)],
            name,
            token: Token::new(TokenKind::Lock, 0),
            ttl,
        };
        match self.attempt(ask).await? {
            Got::Granted(g) => Ok(Try::Acquired(g)),
            Got::Refused(round) => Ok(Try::Held(held_by(&round).unwrap_or_default())),
        }
    }

    /// One attempt at one of `permits` permits of semaphore `name`
    /// ([`Acquire::Semaphore`]).
    async fn semaphore(&self, name: &str, owner: &str, permits: u32, ttl: Duration) -> Result<Try> {
        if self.group.is_redlock() {
            return self.slot_semaphore(name, owner, permits, ttl).await;
        }
        let key = self.key("sem", name);
        let keys = [key.clone(), format!("{key}:fencing"), format!("{key}:size")];
        // The set's script takes (token, permits, ttl): `owner` is unused.
        let ask = Ask {
            lua: Lua::SemAcquire,
            keys: &keys,
            owner: &permits.to_string(),
            args: vec![ms(ttl)],
            name,
            token: Token::new(TokenKind::Permit, 0),
            ttl,
        };
        match self.attempt(ask).await? {
            Got::Granted(g) => Ok(Try::Acquired(g)),
            Got::Refused(round) => {
                if let Some(established) = slots::other_size(&round) {
                    return Err(slots::mismatch(name, established, permits));
                }
                let live = round.refusals().find_map(|r| match r.as_slice() {
                    [Value::Int(0), Value::Int(live)] => Some((*live).max(0) as u64),
                    _ => None,
                });
                live.map(Try::Full)
                    .ok_or_else(|| CoordError::Backend(unexpected(&Value::Nil)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::verdict::{every_tally, group_of, tally_of};
    use crate::backend::redis::{renewal, resigned};
    use crate::backend::{Holder, LostReason, Renewal, Term};

    fn term() -> Term {
        Term {
            holder: Holder {
                identity: "a".into(),
                fencing_token: 1,
                term_id: crate::backend::TermId::new("t"),
                revision: None,
                expires_in: None,
            },
            ttl: Duration::from_secs(1),
            granted: Duration::from_secs(1),
            servers: None,
        }
    }

    fn election_kind(r: crate::backend::Result<Renewal>) -> &'static str {
        match r {
            Ok(Renewal::Renewed { .. }) => "done",
            Ok(Renewal::Lost(LostReason::KeyDeleted)) => "gone",
            Ok(Renewal::Lost(LostReason::KeyOverwritten)) => "taken",
            Ok(Renewal::Lost(LostReason::LeaseExpired)) => "expired",
            Err(_) => "error",
        }
    }

    fn coord_kind(r: Result<Outcome>) -> &'static str {
        match r {
            Ok(Outcome::Ok(_)) => "done",
            Ok(Outcome::Gone) => "gone",
            Ok(Outcome::NotYours) => "taken",
            Ok(Outcome::AlreadyReleased) => "released before",
            Err(_) => "error",
        }
    }

    /// One rule, two users: every tally of answers on 1, 3 and 5 servers
    /// gives the election and the coordination API the same verdict, for a
    /// renewal (and a completion) and for a release.
    #[test]
    fn the_same_tally_gives_both_users_the_same_verdict() {
        for n in [1, 3, 5] {
            let group = group_of(n);
            for counts in every_tally(n) {
                let renew = |what| group.renew_verdict(tally_of(counts), what);
                let election = election_kind(renewal(renew("renewed"), &term(), n));
                let ttl = Some(Duration::from_secs(1));
                let coord = coord_kind(outcome(renew("renewed"), ttl, &["k"]));
                let complete = coord_kind(outcome(renew("completed"), None, &["k"]));
                assert_eq!(election, coord, "renew, {n} servers, tally {counts:?}");
                assert_eq!(complete, coord, "complete, {n} servers, tally {counts:?}");
                let resign = resigned(group.release_verdict(tally_of(counts)));
                let release = outcome(group.release_verdict(tally_of(counts)), None, &["k"]);
                assert_eq!(
                    resign.is_err(),
                    release.is_err(),
                    "release, {n} servers, tally {counts:?}"
                );
            }
        }
    }
}
