//! The Lua scripts of the shard store (see [`super::shards`] for the keys),
//! run under their names in [`super::lua::Lua`] after its shared prelude
//! and [`SHARDS`]. Every script takes `ARGV[1]` = `<base>:shards:` (the
//! keys' common prefix), `ARGV[2]` = the session id ('' for a read) and
//! `KEYS[1]` = the members set `<base>:shards:members`;
//! every script that changes what a read answers publishes on `ARGV[3]`,
//! the shards' channel.
//!
//! A session is **live** while its key exists and its score in the members
//! set is still ahead of the server's clock; a record bound to a session
//! that is not live is treated as absent (read) and may be taken (acquire).

/// Shared prelude of the shard scripts (after [`super::lua`]'s): `now` is
/// the server's clock in ms; `live(sid)`; `record_sid(value)` the session
/// a record `<sid>|<token>|<member>` is bound to; `forget(sid)` deletes a
/// session, its set of held shard ids and the records still bound to it;
/// `prune()` forgets the sessions whose score has passed and answers how
/// many; `noticed()` publishes on the channel.
pub(super) const SHARDS: &str = r"
local P = ARGV[1]
local now = now_ms()
local members = KEYS[1]
local function session_key(sid) return P .. 'session:' .. sid end
local function held_key(sid) return P .. 'held:' .. sid end
local function record_key(id) return P .. 's:' .. id end
local function record_sid(value) return string.match(value, '^([^|]*)|') end
local function live(sid)
  local at = redis.call('ZSCORE', members, sid)
  return at ~= false and tonumber(at) > now and redis.call('EXISTS', session_key(sid)) == 1
end
local function forget(sid)
  for _, id in ipairs(redis.call('SMEMBERS', held_key(sid))) do
    local r = redis.call('GET', record_key(id))
    if r and record_sid(r) == sid then redis.call('DEL', record_key(id)) end
  end
  redis.call('DEL', session_key(sid), held_key(sid))
  redis.call('ZREM', members, sid)
end
local function prune()
  local dead = redis.call('ZRANGEBYSCORE', members, '-inf', now)
  for _, sid in ipairs(dead) do forget(sid) end
  return #dead
end
local function noticed() redis.call('PUBLISH', ARGV[3], ARGV[2]) end
local function keep_members(ttl)
  if redis.call('PTTL', members) < ttl then redis.call('PEXPIRE', members, ttl) end
end
";

/// Open a session. ARGV: prefix, session id, channel, TTL in ms, the
/// session's value `<shards>|<member>`. Answers 1.
pub(super) const SHARD_OPEN: &str = r"
prune()
local ttl = tonumber(ARGV[4])
redis.call('SET', session_key(ARGV[2]), ARGV[5], 'PX', ttl)
redis.call('ZADD', members, now + ttl, ARGV[2])
keep_members(ttl)
noticed()
return 1
";

/// Renew a live session, its set of held ids and every record bound to it
/// (one script whatever their number; ids whose record is no longer ours
/// leave the set), and forget (and announce) sessions that ran out. ARGV: prefix, session id, channel, TTL in ms. Answers 1
/// renewed, 0 the session is not live (forgotten now; never re-created).
pub(super) const SHARD_RENEW: &str = r"
local sid = ARGV[2]
local ttl = tonumber(ARGV[4])
if not live(sid) then
  forget(sid)
  prune()
  noticed()
  return 0
end
redis.call('PEXPIRE', session_key(sid), ttl)
redis.call('ZADD', members, now + ttl, sid)
keep_members(ttl)
local held = held_key(sid)
for _, id in ipairs(redis.call('SMEMBERS', held)) do
  local r = redis.call('GET', record_key(id))
  if r and record_sid(r) == sid then
    redis.call('PEXPIRE', record_key(id), ttl)
  else
    redis.call('SREM', held, id)
  end
end
redis.call('PEXPIRE', held, ttl)
-- A session that ran out is noticed by the next renewal of any member
-- (an expiry publishes nothing): the others read within a renew interval.
if prune() > 0 then noticed() end
return 1
";

/// Take a shard. ARGV: prefix, session id, channel, shard id, member, the
/// session's TTL in ms. KEYS: members, the shard's fencing counter. The
/// record is written with the session's PTTL when it is absent, bound to
/// this session, or bound to a session that is not live. Answers `{1,
/// token}`, `{0}` refused (the session is not live, another live session
/// holds it), `{3, wait_ms}` the server has been up for less than one TTL
/// (+ 1 s: `uptime_in_seconds` counts whole seconds), so it may have
/// restarted without persistence and forgotten a record whose owner still
/// claims it, as the campaign's hold-off; `{-2, counter}` for a counter
/// that is not ours to raise.
pub(super) const SHARD_ACQUIRE: &str = r"
local sid, id = ARGV[2], ARGV[4]
if not live(sid) then return {0} end
local wait = tonumber(ARGV[6]) + 1000
local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
if up and up * 1000 < wait then return {3, wait - up * 1000} end
local current = redis.call('GET', record_key(id))
if current then
  local owner = record_sid(current)
  if owner ~= sid and owner ~= nil and live(owner) then return {0} end
end
local ok, bad = fence_ok(KEYS[2])
if not ok then return {-2, bad} end
local left = redis.call('PTTL', session_key(sid))
if left <= 0 then return {0} end
local f = fence_next(KEYS[2])
redis.call('SET', record_key(id), sid .. '|' .. string.format('%.0f', f) .. '|' .. ARGV[5], 'PX', left)
local held = held_key(sid)
redis.call('SADD', held, id)
if redis.call('PTTL', held) < left then redis.call('PEXPIRE', held, left) end
noticed()
return {1, f}
";

/// Release a shard. ARGV: prefix, session id, channel, shard id. Deletes
/// the record only while it is bound to the session. Answers 1 deleted, 0
/// not ours.
pub(super) const SHARD_RELEASE: &str = r"
local sid, id = ARGV[2], ARGV[4]
local current = redis.call('GET', record_key(id))
if not current or record_sid(current) ~= sid then return 0 end
redis.call('DEL', record_key(id))
redis.call('SREM', held_key(sid), id)
noticed()
return 1
";

/// End a session with its records. ARGV: prefix, session id, channel.
/// Answers 1.
pub(super) const SHARD_CLOSE: &str = r"
forget(ARGV[2])
prune()
noticed()
return 1
";

/// The live members and the records of shards `0..ARGV[4]-1`, the dead
/// sessions forgotten first (published when there were any). ARGV: prefix,
/// '', channel, number of shards. Answers `{{sid, value, ...}, {record or
/// '' per shard}}`: a record bound to a session that is not live is ''.
pub(super) const SHARD_READ: &str = r"
if prune() > 0 then noticed() end
local listed = {}
for _, sid in ipairs(redis.call('ZRANGEBYSCORE', members, '(' .. now, '+inf')) do
  local v = redis.call('GET', session_key(sid))
  if v then
    listed[#listed + 1] = sid
    listed[#listed + 1] = v
  end
end
local alive = {}
local records = {}
for i = 0, tonumber(ARGV[4]) - 1 do
  local r = redis.call('GET', record_key(i)) or ''
  local sid = record_sid(r)
  if sid == nil then
    r = ''
  elseif alive[sid] == nil then
    alive[sid] = live(sid)
  end
  if sid ~= nil and not alive[sid] then r = '' end
  records[#records + 1] = r
end
return {listed, records}
";
