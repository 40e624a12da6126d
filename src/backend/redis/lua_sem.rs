//! The Lua scripts of semaphores (see [`super::coord`] for the keys), run
//! under their names in [`super::lua::Lua`] after its shared prelude: on
//! one server a sorted set of permit tokens scored by expiry (the server's
//! clock, ms); on Redlock a slot key per permit ([`SIZE`] and after).

/// Live permits of a semaphore (by the server's clock), read-only. KEYS: set.
pub(super) const SEM_LIVE: &str = r"
local now = now_ms()
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
";

/// Single-server semaphore: a sorted set of tokens scored by expiry. KEYS:
/// set, counter, size. ARGV: token, permits, TTL in ms. Answers `{1,
/// fencing}`, `{0, live}` full, `{-2, counter}` bad counter, `{-3, size}`
/// live permits taken with another size (one name is one semaphore). The
/// size key, like the counter, outlives the set; it binds only while a
/// permit is live.
pub(super) const SEM_ACQUIRE: &str = r"
local now = now_ms()
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local size = redis.call('GET', KEYS[3])
if live > 0 and size and size ~= ARGV[2] then return {-3, size} end
if live >= tonumber(ARGV[2]) then return {0, live} end
local f = fence_next(KEYS[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
redis.call('SET', KEYS[3], ARGV[2])
return {1, f}
";

/// Single-server permit renew. KEYS: set. ARGV: token, TTL in ms. Answers 1 or 0.
pub(super) const SEM_RENEW: &str = r"
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
";

/// Single-server permit release. KEYS: set. ARGV: token. Answers 1 or 0.
pub(super) const SEM_RELEASE: &str = r"
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZREM', KEYS[1], ARGV[1])
if n == 1 then redis.call('PUBLISH', KEYS[1], 'released') end
return n
";

/// Shared prelude of the Redlock semaphore scripts: `other_size(base,
/// skey, permits)` is the size recorded in `skey` when it differs from
/// `permits` and one of its slots `base:slot:0..size-1` is live (it binds),
/// else `false`.
pub(super) const SIZE: &str = r"
local function other_size(base, skey, permits)
  local size = redis.call('GET', skey)
  if not size or size == permits then return false end
  local m = tonumber(size)
  if not m then return false end
  for i = 0, m - 1 do
    if redis.call('EXISTS', base .. ':slot:' .. i) == 1 then return size end
  end
  return false
end
";

/// Redlock semaphore: which of the slots `KEYS[1]:slot:0..ARGV[1]-1` are
/// taken on this server. KEYS: base, size. ARGV: permits. Answers `{size,
/// {taken indices}}`, `size` the binding size of live permits taken with
/// another size ([`SIZE`]) or `0`. Read-only.
pub(super) const SLOTS: &str = r"
local taken = {}
for i = 0, tonumber(ARGV[1]) - 1 do
  if redis.call('EXISTS', KEYS[1] .. ':slot:' .. i) == 1 then taken[#taken + 1] = i end
end
return {tonumber(other_size(KEYS[1], KEYS[2], ARGV[1]) or '0'), taken}
";

/// Redlock semaphore slot: `LOCK` unless live permits were taken with
/// another size, then record this size. KEYS: slot, counter, size, base.
/// ARGV: token, owner, TTL in ms, permits. Answers as `LOCK`, or `{-3,
/// size}`.
pub(super) const SLOT_LOCK: &str = r"
local other = other_size(KEYS[4], KEYS[3], ARGV[4])
if other then return {-3, other} end
local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local f = fence_next(KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[4])
return {1, f}
";
