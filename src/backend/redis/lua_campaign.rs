//! The election's campaign script, run as [`super::lua::Lua::Campaign`]
//! after the shared prelude (`now_ms`, `counter_ok`): the one place of the
//! campaign's rules, including the hold-offs after a restart and after a
//! replica's promotion, and the rule that keeps fencing tokens growing.

/// Election campaign. KEYS: key, counter, pause marker, successor,
/// promotion marker, and with failsafe the roster key. ARGV: 1 term token, 2 identity, 3 TTL in ms, 4 the
/// `<run_id>/<master_replid>` this candidate last saw on this server ('' if
/// none), 5 '1' while this candidate keeps out of a server it saw restart or
/// promoted, 6 `--redis-min-replicas` ('0': off), 7 the longest a successor
/// marker may keep others out, in ms, 8 the largest fencing token this
/// candidate has seen ('0': none), 9 with failsafe the roster JSON written
/// with a grant ([`super::roster`]).
/// A server that does not say it is the master (`INFO replication` role)
/// answers a `READONLY` error before anything is written.
/// The promotion marker `<master_replid>|<server ms>` records when this
/// server was first seen to serve the election under its replication id: a
/// replica promoted (a new id; the marker it has, if any, carries its old
/// primary's) keeps every candidate out for one TTL plus a second from then.
/// Answers (each ending with `<run_id>/<master_replid>`): `{1, fencing}` elected
/// (deleting the successor marker), `{0, value, pttl}` held, `{3, wait_ms}`
/// too fresh, `{4, counter}` bad counter, `{5, replicas}` fewer replicas
/// linked and acknowledging than ARGV[6], `{6}` paused, `{7, successor,
/// pttl}` left to the named successor. The one write of a refusal: a
/// successor marker without a TTL, or with more than ARGV[7] (written by
/// hand), gets ARGV[7], so it keeps others out at most that long.
pub(super) const CAMPAIGN: &str = r"
local info = redis.call('INFO', 'server')
local repl = redis.call('INFO', 'replication')
local replid = string.match(repl, 'master_replid:(%x+)') or ''
local run = (string.match(info, 'run_id:(%x+)') or '') .. '/' .. replid
local master = string.match(repl, 'role:(%a+)') == 'master'
local ttl = tonumber(ARGV[3])
local now = now_ms()
-- A replica promoted less than one TTL ago may lack a live term, whoever
-- asks: the marker says since when this replication id serves the election
-- (written at the first campaign after the promotion, held key or not, so
-- the wait runs while the old holder's key runs out). No marker on a server
-- never promoted (master_replid2 all zeros): nothing to wait for (a restart
-- is the uptime check's).
local since
if master then
  local mark = redis.call('GET', KEYS[5])
  if mark then
    local id, at = string.match(mark, '^(%x+)|(%d+)$')
    if id == replid then since = tonumber(at) end
  elseif string.match(repl, 'master_replid2:0+[\r\n]') then
    since = 0
  end
  if since == nil then
    redis.call('SET', KEYS[5], replid .. '|' .. string.format('%.0f', now))
    since = now
  end
end
local current = redis.call('GET', KEYS[1])
if current then
  return {0, current, redis.call('PTTL', KEYS[1]), run}
end
if not master then
  return redis.error_reply('READONLY this server is a replica (INFO replication), not the primary: nothing written')
end
if redis.call('EXISTS', KEYS[3]) == 1 then return {6, run} end
local named = redis.call('GET', KEYS[4])
if named and named ~= ARGV[2] then
  local left, cap = redis.call('PTTL', KEYS[4]), tonumber(ARGV[7])
  if left < 0 or left > cap then redis.call('PEXPIRE', KEYS[4], cap) left = cap end
  return {7, named, left, run}
end
-- A server that restarted (or was replaced, e.g. a replica promoted) since
-- this candidate last saw it may have forgotten a live term.
if ARGV[5] == '1' or (ARGV[4] ~= '' and ARGV[4] ~= run) then
  return {3, ttl + 1000, run}
end
local held = math.max(now - since, 0)
if held < ttl + 1000 then
  return {3, ttl + 1000 - held, run}
end
-- A server up for less than one TTL may have restarted without persistence
-- and forgotten a live term. uptime_in_seconds counts whole wall-clock
-- seconds and reads N after as little as N - 1 s: demand one more second.
local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
if up and up * 1000 < ttl + 1000 then
  return {3, ttl + 1000 - up * 1000, run}
end
-- With --redis-min-replicas: no grant while fewer replicas are online and
-- acknowledging (their last acknowledgement at most 2 s old; they send one
-- every second). WAIT after the grant is the check that counts; this one
-- keeps a grant that cannot count from showing as a holder meanwhile.
local want = tonumber(ARGV[6] or '0') or 0
if want > 0 then
  local live = 0
  for lag in string.gmatch(repl, 'state=online,[^\r\n]-lag=(%d+)') do
    if tonumber(lag) <= 2 then live = live + 1 end
  end
  if live < want then return {5, live, run} end
end
-- The fencing counter must be one a Lua number holds exactly (counter_ok).
local c = redis.call('GET', KEYS[2])
if not counter_ok(c) then
  return {4, c, run}
end
-- Tokens only grow: the next token is max(counter + 1, server clock in ms,
-- the largest token the candidate has seen + 1), so a counter that went back
-- (a lagging replica promoted, a restart without persistence) does not hand
-- out a token an earlier term had.
local seen = tonumber(ARGV[8] or '0') or 0
local fencing = math.max((tonumber(c) or 0) + 1, now, seen + 1)
local f = string.format('%.0f', fencing)
redis.call('SET', KEYS[2], f)
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[2], 'PX', ARGV[3])
if named then redis.call('DEL', KEYS[4]) end
if ARGV[9] and ARGV[9] ~= '' then redis.call('SET', KEYS[6], ARGV[9]) end
return {1, f, run}
";
