//! The Lua scripts of the candidate registry (see [`super::registry`] for
//! the keys), run under their names in [`super::lua::Lua`] after its shared
//! prelude. A record is a hash `<base>:candidates:<identity>` with the
//! fields `identity`, `priority`, `revision`, `ready`, `ttl` (ms),
//! `preempt_after` (ms, empty when not said), `frozen_until` (ms since
//! the Unix epoch by the writer's clock, empty when not frozen),
//! `created` and `renewed` (the server's clock, ms), expiring with its TTL;
//! the sorted set `<base>:candidates` lists the identities scored by their
//! record's expiry, so a reader finds them without `SCAN` and prunes the
//! lapsed ones. Every write publishes the identity on the registry channel.

/// Write or renew a record. KEYS: record, members. ARGV: identity,
/// priority, revision, ready, TTL in ms, channel, `--preempt-after` in ms,
/// the end of a freeze in ms since the Unix epoch (empty: none). `created` is written
/// only when the record is new (absent, or lapsed by its member's score:
/// what readers see), so a renewal keeps its place in the order of
/// creation. Answers 1.
pub(super) const CANDIDATE_PUBLISH: &str = r"
local now = now_ms()
local ttl = tonumber(ARGV[5])
-- A record whose member lapsed is a new record (readers no longer list it).
local until_ms = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not until_ms or tonumber(until_ms) <= now then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 'identity', ARGV[1], 'priority', ARGV[2], 'revision', ARGV[3],
  'ready', ARGV[4], 'ttl', ARGV[5], 'renewed', now, 'preempt_after', ARGV[7] or '',
  'frozen_until', ARGV[8] or '')
redis.call('HSETNX', KEYS[1], 'created', now)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
redis.call('PUBLISH', ARGV[6], ARGV[1])
return 1
";

/// Remove a record. KEYS: record, members. ARGV: identity, channel.
/// Answers 1 removed, 0 not there.
pub(super) const CANDIDATE_WITHDRAW: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return n
";

/// The live records, the lapsed members pruned first. KEYS: members. ARGV:
/// the records' key prefix (`<base>:candidates:`). Answers one array per
/// record: `{identity, priority, revision, ready, ttl, created, renewed,
/// now, preempt_after, frozen_until}`, `created`, `renewed` and `now` by
/// the server's clock in ms.
pub(super) const CANDIDATE_LIST: &str = r"
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local r = redis.call('HMGET', ARGV[1] .. id, 'identity', 'priority', 'revision', 'ready', 'ttl', 'created', 'renewed', 'preempt_after', 'frozen_until')
  if r[1] then
    out[#out + 1] = {r[1], r[2] or '', r[3] or '', r[4] or '', r[5] or '0', r[6] or '0', r[7] or '0', tostring(now), r[8] or '', r[9] or ''}
  end
end
return out
";
