//! The Lua scripts of read-write locks (see [`super::coord`] for the keys),
//! run under their names in [`super::lua::Lua`] after its shared prelude.
//! Every script takes `KEYS[1]` = the lock's base key, which holds the
//! writer's value `<token>|<fencing>|<owner>`; beside it (same hash tag):
//! `:readers`, a sorted set of reader tokens scored by expiry (the server's
//! clock, ms); `:owners`, a hash of reader token to its value; `:intent`, a
//! waiting writer's `<id>|0|<owner>` with its TTL. Releases publish on
//! `KEYS[1]`.

/// Shared prelude: `rw_prune(base, now)` drops expired readers (every
/// acquisition does first, so a waiter's next look never sees one and
/// never wakes for one);
/// `rw_reader(base, now)` is a live reader's value or `false`;
/// `rw_keep(key, ttl)` makes `key` live at least `ttl` ms.
pub(super) const RW: &str = r"
local function rw_prune(base, now)
  local rkey = base .. ':readers'
  local gone = redis.call('ZRANGEBYSCORE', rkey, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', rkey, '-inf', now)
    for _, t in ipairs(gone) do redis.call('HDEL', base .. ':owners', t) end
  end
end
local function rw_reader(base, now)
  local first = redis.call('ZRANGEBYSCORE', base .. ':readers', '(' .. now, '+inf', 'LIMIT', 0, 1)
  if #first == 0 then return false end
  return redis.call('HGET', base .. ':owners', first[1]) or (first[1] .. '|0|')
end
local function rw_keep(key, ttl)
  if redis.call('PTTL', key) < tonumber(ttl) then redis.call('PEXPIRE', key, ttl) end
end
";

/// A reader. KEYS: base, counter. ARGV: token, owner, TTL in ms. Answers
/// `{1, fencing}`, `{0, value}` held by the writer or kept out by a waiting
/// writer's intent, `{-2, counter}` bad counter.
pub(super) const RW_READ: &str = r"
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local now = now_ms()
rw_prune(KEYS[1], now)
local w = redis.call('GET', KEYS[1])
if w then return {0, w} end
local i = redis.call('GET', KEYS[1] .. ':intent')
if i then return {0, i} end
local f = fence_next(KEYS[2])
local rkey, okey = KEYS[1] .. ':readers', KEYS[1] .. ':owners'
redis.call('ZADD', rkey, now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', okey, ARGV[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2])
rw_keep(rkey, ARGV[3])
rw_keep(okey, ARGV[3])
return {1, f}
";

/// The writer. KEYS: base, counter. ARGV: token, owner, TTL in ms, intent id
/// ('' when the writer does not wait), intent TTL in ms. Answers as
/// [`RW_READ`]; a writer kept out by the writer or by readers records its
/// intent when no intent is live, and its grant deletes its own intent.
pub(super) const RW_WRITE: &str = r"
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local now = now_ms()
rw_prune(KEYS[1], now)
local ikey = KEYS[1] .. ':intent'
local i = redis.call('GET', ikey)
local ours = i and ARGV[4] ~= '' and string.sub(i, 1, string.len(ARGV[4]) + 1) == ARGV[4] .. '|'
local function kept_out(by)
  if ARGV[4] ~= '' and not i then
    redis.call('SET', ikey, ARGV[4] .. '|0|' .. ARGV[2], 'PX', ARGV[5])
  end
  return {0, by}
end
local w = redis.call('GET', KEYS[1])
if w then return kept_out(w) end
if i and not ours then return {0, i} end
local r = rw_reader(KEYS[1], now)
if r then return kept_out(r) end
local f = fence_next(KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
if ours then redis.call('DEL', ikey) end
return {1, f}
";

/// A reader's renewal. KEYS: base. ARGV: token, TTL in ms. Answers 1 or 0
/// (expired or never there); never re-creates.
pub(super) const RW_READ_RENEW: &str = r"
local now = now_ms()
local rkey = KEYS[1] .. ':readers'
local score = redis.call('ZSCORE', rkey, ARGV[1])
if not score or tonumber(score) <= now then return 0 end
redis.call('ZADD', rkey, 'XX', now + tonumber(ARGV[2]), ARGV[1])
rw_keep(rkey, ARGV[2])
rw_keep(KEYS[1] .. ':owners', ARGV[2])
return 1
";

/// A reader's release (and the give-back of a refused Redlock reader).
/// KEYS: base. ARGV: token. Answers 1 released, 0 expired or never there.
pub(super) const RW_UNREAD: &str = r"
local now = now_ms()
local rkey = KEYS[1] .. ':readers'
local score = redis.call('ZSCORE', rkey, ARGV[1])
redis.call('ZREM', rkey, ARGV[1])
redis.call('HDEL', KEYS[1] .. ':owners', ARGV[1])
if not score or tonumber(score) <= now then return 0 end
redis.call('PUBLISH', KEYS[1], 'released')
return 1
";

/// A waiting writer gives up: its intent goes. KEYS: base. ARGV: intent id.
/// Answers 1 removed, 0 not (or no longer) there.
pub(super) const RW_GIVE_UP: &str = r"
local ikey = KEYS[1] .. ':intent'
local i = redis.call('GET', ikey)
if i and string.sub(i, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '|' then
  redis.call('DEL', ikey)
  redis.call('PUBLISH', KEYS[1], 'released')
  return 1
end
return 0
";
