//! The coordination seam: the [`Coordinator`] trait every backend that serves
//! named locks, fair locks, semaphores and job claims implements, and the
//! values it exchanges ([`Acquire`], [`Object`], [`Grant`], [`Try`],
//! [`Outcome`], [`Token`], [`CoordError`], [`RwMode`], [`WriteIntent`]). The service, its
//! HTTP handlers and metrics are in `crate::coord`.
//!
//! Safety rules kept by every backend implementation (the bugs hand-rolled
//! Redis code has):
//! - a token is random per acquisition, and renew/release act only when the
//!   stored value carries it: never release someone else's lock;
//! - a renew never re-creates an expired lock, permit or claim (410 Gone);
//! - a semaphore counts only permits that have not expired, and its size
//!   belongs to its name: while permits are live, a request of another size
//!   is refused ([`CoordError::PermitsMismatch`]);
//! - fencing tokens grow per name (etcd: the key's `create_revision`, a
//!   global revision; Redis: a counter beside the key);
//! - a read-write lock has any number of readers or one writer, never both;
//!   readers take a fencing token too, so a writer's is greater than every
//!   earlier grant's of that name. A writer that waits leaves a
//!   [`WriteIntent`] that keeps new readers out until it is granted, gives
//!   up, or the intent's TTL ends (no writer starvation).

mod token;

pub use token::{MAX_NAME, Token, TokenKind, check_name, check_owner, random_token};

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use tokio::time::Instant;

use crate::backend::BackendError;

/// What a granted lock, permit or claim looks like to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Grant {
    /// Lock, semaphore or `queue/job` name.
    pub name: String,
    /// Random per acquisition; needed to renew, release or complete.
    pub token: String,
    /// Grows per name with every acquisition; pass it to the guarded resource.
    pub fencing_token: u64,
    /// TTL granted, in milliseconds (etcd grants whole seconds, at least its minimum).
    pub ttl_ms: u64,
}

/// The answer to one acquisition attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Try {
    /// Granted (for jobs: claimed).
    Acquired(Grant),
    /// Held by someone else: the holder's owner label (locks, read-write
    /// locks, job claims).
    Held(String),
    /// A semaphore with all its permits live: how many are live.
    Full(u64),
    /// The job was completed (and is remembered for the retention time).
    Completed,
}

/// The answer to renew, release or complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done; for renewals, the TTL granted.
    Ok(Option<Duration>),
    /// The lock/permit/claim expired or was never there (HTTP 410).
    Gone,
    /// It belongs to someone else now (HTTP 409).
    NotYours,
    /// Released through this sidecar already (a repeated DELETE).
    AlreadyReleased,
}

/// Which primitive an object is: a new primitive is a new kind, not a
/// family of trait methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A named lock (fair or not).
    Lock,
    /// A semaphore permit.
    Semaphore,
    /// A read-write lock (a reader's or the writer's hold).
    RwLock,
    /// A job claim.
    Job,
}

/// One object of the coordination API: what a token renews, releases or
/// waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Object<'a> {
    /// Lock `name`.
    Lock(&'a str),
    /// Semaphore `name`.
    Semaphore(&'a str),
    /// Read-write lock `name`.
    RwLock(&'a str),
    /// Job `job` of `queue`.
    Job {
        /// The queue.
        queue: &'a str,
        /// The job within it.
        job: &'a str,
    },
}

impl<'a> Object<'a> {
    /// Its kind.
    pub fn kind(self) -> Kind {
        match self {
            Object::Lock(_) => Kind::Lock,
            Object::Semaphore(_) => Kind::Semaphore,
            Object::RwLock(_) => Kind::RwLock,
            Object::Job { .. } => Kind::Job,
        }
    }

    /// Its name (a job's queue): what metrics count it under.
    pub fn name(self) -> &'a str {
        match self {
            Object::Lock(n) | Object::Semaphore(n) | Object::RwLock(n) => n,
            Object::Job { queue, .. } => queue,
        }
    }
}

/// One acquisition, parsed once from the request: what to take and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire<'a> {
    /// Lock `name`, one attempt.
    Lock(&'a str),
    /// Lock `name` in arrival order, waiting up to `wait` in the backend's
    /// queue (backends whose [`Coordinator::queues`] is true).
    FairLock {
        /// The lock.
        name: &'a str,
        /// How long to wait in the queue.
        wait: Duration,
    },
    /// One of `permits` permits of semaphore `name`.
    Semaphore {
        /// The semaphore.
        name: &'a str,
        /// Its size.
        permits: u32,
    },
    /// Read-write lock `name` in `mode`. A writer refused while it waits
    /// passes `intent`, which the backend records when no other writer's is
    /// live ([`WriteIntent`]); granted, its intent goes.
    RwLock {
        /// The lock.
        name: &'a str,
        /// Reader or writer.
        mode: RwMode,
        /// A waiting writer's intent.
        intent: Option<&'a WriteIntent>,
    },
    /// A claim on job `job` of `queue`, unless claimed or completed.
    Job {
        /// The queue.
        queue: &'a str,
        /// The job within it.
        job: &'a str,
    },
}

impl<'a> Acquire<'a> {
    /// The object it takes.
    pub fn object(&self) -> Object<'a> {
        match *self {
            Acquire::Lock(name) | Acquire::FairLock { name, .. } => Object::Lock(name),
            Acquire::Semaphore { name, .. } => Object::Semaphore(name),
            Acquire::RwLock { name, .. } => Object::RwLock(name),
            Acquire::Job { queue, job } => Object::Job { queue, job },
        }
    }
}

/// The mode of a read-write lock request (`mode=read|write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared with other readers; excluded by a writer or a writer's intent.
    Read,
    /// Exclusive: no reader and no other writer.
    Write,
}

/// A waiting writer's claim on the next turn of a read-write lock: while it
/// lives, new readers are refused (as if the lock were held) and other
/// writers may not take the lock first. One per lock at a time; the first
/// refused writer that waits sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteIntent {
    /// Random per writer request (32 hex digits).
    pub id: String,
    /// How long the intent lives unless the writer removes it: what is left
    /// of the writer's `wait` plus one second (it outlives no request by
    /// more, even when the sidecar dies).
    pub ttl: Duration,
}

/// Errors of the coordination API.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// The backend failed (unreachable, timeout, refused).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The operation is not available on this backend.
    #[error("{0}")]
    Unsupported(String),
    /// A coordination key holds a value of another type or shape than ours
    /// (Redis `WRONGTYPE`, or a fencing counter that is not a non-negative
    /// integer). Nothing was written.
    #[error(
        "the coordination key {key} holds {found}; delete it, or use another name or another key prefix"
    )]
    Corrupt {
        /// The backend key.
        key: String,
        /// What was found there.
        found: String,
    },
    /// A semaphore request whose `permits` differs from the size its live
    /// permits were taken with (one name is one semaphore).
    #[error(
        "semaphore {name} has {established} permits (the size its live permits were taken with), not {asked}; ask with permits={established}, or use another name"
    )]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The size of the live permits.
        established: u64,
        /// The size this request asked for.
        asked: u32,
    },
    /// A waiter of a lock's queue lost its place while it waited: its key
    /// went (its lease expired or was revoked, or the key was deleted). It
    /// holds nothing.
    #[error(
        "lost its place in the queue of lock {name} while waiting: its lease ended (expired or revoked) or its key was deleted; nothing is held: acquire again"
    )]
    QueueLost {
        /// The lock's name.
        name: String,
    },
    /// The Redis primary of this object was promoted from a replica less
    /// than the longest coordination TTL + 1 s ago: it may lack a grant its
    /// old primary made, so it grants nothing until then (the promotion
    /// hold-off). Nothing was granted.
    #[error(
        "waiting: the Redis primary of this object was promoted from a replica less than the longest coordination TTL + 1 s ago and may lack a grant its old primary made (the promotion hold-off); nothing granted, retry after {} ms",
        retry_after.as_millis()
    )]
    HoldOff {
        /// When the hold-off ends, from now.
        retry_after: Duration,
    },
    /// Too many requests are already waiting on this sidecar.
    #[error(
        "{waiting} requests already wait on this sidecar (the cap is {cap}); retry later or with a shorter wait"
    )]
    TooManyWaiters {
        /// Requests waiting now.
        waiting: usize,
        /// The cap.
        cap: usize,
    },
}

/// Shorthand.
pub type Result<T, E = CoordError> = std::result::Result<T, E>;

/// Sleep until `until`, at most 50 ms: the look-again pause of a waiter
/// that nothing can wake (no watch, no channel to trust).
pub async fn nap(until: Instant) {
    tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(50))).await;
}

/// The coordination verbs of one backend: one verb set over every [`Kind`].
/// Each call is one attempt; waiting (`wait=`) is done by the service
/// (`crate::coord::Service`) except for fair locks, which queue.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// Backend name.
    fn backend(&self) -> &'static str;
    /// Whether [`Acquire::FairLock`] queues waiters (then plain requests
    /// that may wait queue too). Default: no.
    fn queues(&self) -> bool {
        false
    }
    /// Try once to take `what` for `ttl`, labelled with `owner` (a fair lock
    /// waits in its queue). Answers [`Try::Held`] with the holder's owner (a
    /// read-write lock's: the writer, a reader, or the waiting writer).
    async fn acquire(&self, what: Acquire<'_>, owner: &str, ttl: Duration) -> Result<Try>;
    /// Extend the hold `token` has on `object`; never re-creates an expired
    /// one, never touches a completed job.
    async fn renew(&self, object: Object<'_>, token: &str, ttl: Duration) -> Result<Outcome>;
    /// Give `object` back if `token` still holds it (a job can be claimed
    /// again at once).
    async fn release(&self, object: Object<'_>, token: &str) -> Result<Outcome>;
    /// Mark job `job` of `queue`, claimed by `token`, completed, remembered
    /// for `retention`.
    async fn complete(
        &self,
        queue: &str,
        job: &str,
        token: &str,
        retention: Duration,
    ) -> Result<Outcome>;
    /// Remove the writer intent `id` of read-write lock `name` when it is
    /// still there (the writer gave up). Default: nothing to remove.
    async fn give_up(&self, _name: &str, _id: &str) -> Result<()> {
        Ok(())
    }
    /// Wait until `object` may have changed (a holder, reader, writer or
    /// writer intent left or expired), or until `until`. `seen` is what the
    /// last attempt saw: 1 holder (locks) or the live permits (semaphores).
    /// Backends that can tell (etcd: a watch; Redis: pub/sub and the
    /// holder's expiry) override it; the default sleeps 50 ms.
    async fn changed(&self, _object: Object<'_>, _seen: u64, until: Instant) -> Result<()> {
        nap(until).await;
        Ok(())
    }
    /// The error of a verb this backend does not serve.
    fn unserved(&self, what: &str) -> CoordError {
        CoordError::Unsupported(format!(
            "the {} backend does not serve {what}",
            self.backend()
        ))
    }
    /// The deadline of one backend call, when this coordinator keeps each
    /// request within its `wait` plus one such deadline (it cuts its calls
    /// to the request's budget). Default: `None` (calls keep their own
    /// limits).
    fn deadline(&self) -> Option<Duration> {
        None
    }
    /// Wait for the work this coordinator runs off the answer path (etcd:
    /// the lease revokes after releases), at most one call deadline. For the
    /// app's shutdown. Default: nothing to wait for.
    async fn close(&self) {}
}
