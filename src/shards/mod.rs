//! Shard arithmetic: the hash ranges of N shards (KEP-5866), their selector
//! strings, and which member owns which shard. Pure: no I/O, no clock.
//!
//! Sources: KEP-5866 "Server-side Sharded List and Watch" (Kubernetes
//! v1.36, alpha; `k8s.io/apimachinery/pkg/sharding`): a `shardSelector` of
//! `shardRange(<field>, '<start>', '<end>')` terms joined with `||`, a
//! 64-bit FNV-1a hash of the field, `start <= hash < end`, bounds written
//! `0x` + 16 hex digits and the whole space's end `0x10000000000000000`.
//! FNV-1a: the FNV specification (draft-eastlake-fnv).
//!
//! # The runtime this is for (a design note; not built yet)
//!
//! The handoff is the one `tests/election_model/shards.rs` checks: a shard
//! is held like a term (a validity deadline on the owner's monotonic clock
//! counted from the send of its last acknowledged renewal, a fencing token
//! per shard that only grows); it moves by release then acquire (the old
//! owner stops, and its app is told and drained, before it deletes its
//! claim); a crashed owner's shards are taken only when the store has
//! forgotten its session. Safety rests on the store's compare-and-swap
//! alone, not on members agreeing on the map: every member computes
//! [`assign`] from the membership and the shard records it reads, releases
//! what the result gives away and acquires the free shards it gives it.
//!
//! - **etcd**: a member's session is the lease its registry record is
//!   already bound to. Shard `i` is a key under the election's prefix,
//!   created by a transaction (`create_revision == 0`, or bound to our
//!   lease) with that lease; its token is the key's `create_revision`. The
//!   one keep-alive renews every shard (no request per shard), and the
//!   renewal's proof read is one range read of the shard prefix; followers
//!   watch the prefix.
//! - **Redis** (one server; Redlock, Sentinel and Cluster refused for
//!   now): the session is a key with `PX` and an entry in a sorted set
//!   scored by its expiry; shard `i` is a key naming the session, written
//!   by a script when absent, ours, or bound to a session that is no longer
//!   live, which also counts the shard's fencing counter up and gives the
//!   record the session's remaining `PTTL`. One renewal script checks the
//!   session and resets `PX` on it and on every shard key naming it: one
//!   command per renew interval, whatever N (`backend::redis::shards`).
//! - **Kubernetes Lease**: no server-side expiry, so the owner map is
//!   decided in one place: the election's leader writes it, with a per
//!   shard token counter, into its own Lease in the renewal it already
//!   makes (no write more at rest). An owner's shards are valid until the
//!   send of its last read of that Lease that names it, plus the lease
//!   duration, minus the margin; the leader moves a shard by a write that
//!   takes it away, and grants it to another only a lease duration after
//!   that write's answer (every read that still named the old owner was
//!   sent before it). A new leader waits a duration from its first sight of
//!   a shard taken away. Members owning nothing (frozen, unready, more
//!   members than shards) only watch the Lease, reopening the watch no more
//!   often than every 50 s: ≤ 0.02 requests/s each. Owners read once per
//!   renew deadline window; at rest that is the 2× budget's tight case
//!   (64 shards over 4 members, 15 s lease: the leader's PUT every 5 s and
//!   3 owners' GET every 12 s, 0.45 requests/s, beside one election's
//!   0.26 with 3 watching followers), to be measured by the bench.
//!
//! The set's N is part of each member's record (a member with another N is
//! refused from the set, as `--preempt-after` is today); pause, freeze and
//! the health gate enter as the membership passed to [`assign`] (a frozen or
//! unready member is left out of it; a paused set computes nothing).

mod assign;
pub mod http;
pub mod keeper;
mod range;
mod selector;

pub use assign::{OwnerMap, assign, moves, owned_by};
pub use range::{
    HASH_SPACE, MAX_SHARDS, ShardField, ShardRange, fnv1a64, member_selector, ranges, shard_range,
};
pub use selector::{SelectorError, parse_selector};

#[cfg(test)]
#[path = "shards_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "keeper_tests.rs"]
mod keeper_tests;
