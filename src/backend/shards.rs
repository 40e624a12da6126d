//! Shard ownership as a capability beside the election: a backend that can
//! keep shard records offers a [`ShardStore`] on the same connection. The
//! runtime above it is `crate::shards::keeper`; the protocol is the one
//! `tests/election_model/shards.rs` checks.
//!
//! **The store** keeps one **session** per member process with a TTL the
//! server counts (etcd: a lease; Redis: a key with `PX`), and per shard at
//! most one **record** bound to a session, with the shard's fencing token.
//! A record lives as long as its session: when the session's TTL runs out
//! the server forgets the session and every record bound to it. Each shard
//! has its own fencing counter, counted up by every acquisition.
//!
//! Invariants every implementation keeps (the model's safety rests on them
//! and on nothing else; members need not agree on the owner map):
//! - [`ShardStore::acquire`] creates a shard's record only when the shard
//!   has none, or has one bound to the same session, in one compare-and-swap,
//!   and only while the session lives; the token it answers is greater than
//!   every token that shard was ever given;
//! - [`ShardStore::renew`] never brings back a session the server forgot;
//! - [`ShardStore::release`] deletes a record only while it is bound to the
//!   session given.

use std::time::Duration;

use async_trait::async_trait;

use super::Result;

/// A member's session: its records live as long as it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The store's id of the session (etcd: the lease id in hex; Redis: a
    /// random token), written into every record bound to it.
    pub id: String,
    /// The TTL the server granted (etcd: whole seconds).
    pub ttl: Duration,
}

/// One shard's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRecord {
    /// The owning member's identity.
    pub member: String,
    /// The session the record is bound to.
    pub session: String,
    /// The shard's fencing token of this acquisition.
    pub token: u64,
}

/// A member with a live session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMember {
    /// Its identity.
    pub identity: String,
    /// The number of shards it was started with (`--shards`).
    pub shards: u32,
}

/// What the store holds for a set of shards, read in one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardSnapshot {
    /// The members whose session lives, sorted by identity.
    pub members: Vec<ShardMember>,
    /// One entry per shard id `0..n`: its record, or `None` when free.
    pub shards: Vec<Option<ShardRecord>>,
}

/// The shard records of one election on one backend.
#[async_trait]
pub trait ShardStore: Send + Sync {
    /// Open a session of `ttl` for `member`, announcing `shards` (its
    /// `--shards`): from now on [`ShardStore::read`] lists the member until
    /// the session ends.
    ///
    /// # Errors
    /// A [`super::BackendError`] when the store cannot be reached; no
    /// session then exists, or one that nobody renews and the server ends.
    async fn open(&self, member: &str, shards: u32, ttl: Duration) -> Result<Session>;

    /// Renew the session and with it every record bound to it: one request,
    /// whatever the number of shards. `Ok(false)`: the server forgot the
    /// session (its records are gone; open a new one).
    ///
    /// # Errors
    /// A [`super::BackendError`]; the session's fate is then unknown.
    async fn renew(&self, session: &Session) -> Result<bool>;

    /// The live members and the records of shards `0..shards`.
    ///
    /// # Errors
    /// A [`super::BackendError`] when the store cannot be reached.
    async fn read(&self, shards: u32) -> Result<ShardSnapshot>;

    /// Take shard `shard` for `member` under `session` when it has no
    /// record or one bound to `session`. `Some(token)`: taken, with a token
    /// above every earlier one of that shard; `None`: bound to another
    /// session, or the session is gone.
    ///
    /// # Errors
    /// A [`super::BackendError`]; the record may then exist (a later
    /// acquisition under the same session takes it again).
    async fn acquire(&self, session: &Session, member: &str, shard: u32) -> Result<Option<u64>>;

    /// Delete shard `shard`'s record if it is bound to `session`. The caller
    /// has stopped claiming it before the call (the model's release rule).
    ///
    /// # Errors
    /// A [`super::BackendError`]; the record then lives until the session ends.
    async fn release(&self, session: &Session, shard: u32) -> Result<()>;

    /// End the session: every record bound to it goes with it.
    ///
    /// # Errors
    /// A [`super::BackendError`]; the server then ends it at its TTL.
    async fn close(&self, session: &Session) -> Result<()>;

    /// Resolve when the store's shard records or members may have changed
    /// (`true`), or after `at_most` (`false`). `seen` is the caller's count
    /// of the notices it has had (start at 0): a notice given while the
    /// caller was not waiting is answered at its next call. A notice may
    /// come without a change; a lost one is made up for by the caller's
    /// periodic read.
    async fn changed(&self, seen: &mut u64, at_most: Duration) -> bool;
}
