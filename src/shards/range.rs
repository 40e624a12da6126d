//! The hash ranges of N shards, and their KEP-5866 selector strings.

use std::fmt;
use std::hash::Hasher;

/// The 64-bit FNV-1a hash of `bytes`: the hash KEP-5866's `shardRange`
/// applies to the field's value (`k8s.io/apimachinery/pkg/sharding`,
/// `HashField`). FNV-1a as the FNV specification defines it
/// (draft-eastlake-fnv, offset basis `0xcbf29ce484222325`, prime
/// `0x100000001b3`), computed by the `fnv` crate's hasher over the bytes
/// alone (not through `Hash`, which would append a separator).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// The size of the hash space, 2^64: the end of the last range.
pub const HASH_SPACE: u128 = 1 << 64;

/// The most shards a set may have: every range then spans at least 2^52
/// hashes, and a member's selector stays a few hundred kilobytes at most.
pub const MAX_SHARDS: usize = 4096;

/// One shard's part of the 64-bit hash space: the hashes `h` with
/// `start <= h < end` (KEP-5866's half-open `[start, end)`), both in
/// `0..=2^64` (`end` is 2^64 for the last shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardRange {
    /// The first hash of the range.
    pub start: u128,
    /// One past the last hash of the range.
    pub end: u128,
}

impl ShardRange {
    /// Whether the range holds `hash`.
    pub fn contains(&self, hash: u64) -> bool {
        self.start <= u128::from(hash) && u128::from(hash) < self.end
    }

    /// `start` as KEP-5866 writes a bound: `0x` and 16 lowercase hex digits.
    pub fn start_hex(&self) -> String {
        bound_hex(self.start)
    }

    /// `end` as KEP-5866 writes a bound: `0x` and 16 lowercase hex digits,
    /// or the 17-digit `0x10000000000000000` (2^64) for the last range.
    pub fn end_hex(&self) -> String {
        bound_hex(self.end)
    }

    /// The KEP-5866 selector for this range on `field`, such as
    /// `shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')`.
    pub fn selector(&self, field: ShardField) -> String {
        format!(
            "shardRange({}, '{}', '{}')",
            field.path(),
            self.start_hex(),
            self.end_hex()
        )
    }
}

/// A bound in KEP-5866's notation (16 hex digits, 17 for 2^64 alone).
fn bound_hex(bound: u128) -> String {
    format!("0x{bound:016x}")
}

/// The object field whose hash a selector ranges over (KEP-5866 supports
/// these two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ShardField {
    /// `object.metadata.uid`: spreads every object on its own.
    #[default]
    Uid,
    /// `object.metadata.namespace`: keeps a namespace's objects together.
    Namespace,
}

impl ShardField {
    /// The field path as KEP-5866 writes it.
    pub fn path(self) -> &'static str {
        match self {
            ShardField::Uid => "object.metadata.uid",
            ShardField::Namespace => "object.metadata.namespace",
        }
    }
}

impl fmt::Display for ShardField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

/// The range of shard `id` of `shards`: shard `i` starts at
/// `floor(i * 2^64 / shards)`, so the ranges are contiguous, in shard
/// order, and differ in size by at most one hash.
///
/// # Panics
/// When `id >= shards` (no such shard).
pub fn shard_range(id: usize, shards: usize) -> ShardRange {
    assert!(id < shards, "shard {id} of {shards}: ids run from 0 to N-1");
    let at = |i: usize| HASH_SPACE * i as u128 / shards as u128;
    ShardRange {
        start: at(id),
        end: at(id + 1),
    }
}

/// The ranges of all `shards` shards, shard 0 first; joined they are
/// exactly `[0, 2^64)`. Empty when `shards` is 0.
pub fn ranges(shards: usize) -> Vec<ShardRange> {
    (0..shards).map(|id| shard_range(id, shards)).collect()
}

/// One selector for several shards: each shard's `shardRange(...)`, in the
/// order given, joined with ` || ` (KEP-5866's OR). Empty when `ids` is;
/// a client then owns nothing and must not list with it (an empty
/// `shardSelector` selects everything).
///
/// # Panics
/// When an id is not below `shards`.
pub fn member_selector(ids: &[usize], shards: usize, field: ShardField) -> String {
    ids.iter()
        .map(|&id| shard_range(id, shards).selector(field))
        .collect::<Vec<_>>()
        .join(" || ")
}
