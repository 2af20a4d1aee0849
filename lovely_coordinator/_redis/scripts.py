"""The Lua scripts of leases and logs, and the rules every script shares.

A script runs alone on the server, so each one is a small synchronous state machine over
Redis keys, and the Python side only sends it and interprets the reply. All shared
timing uses the server clock (``TIME``), never a replica's; a replica's own clock is used
only for its local deadlines. (The permit pool's and the gates' scripts are in
``pool_scripts.py`` and ``gate_scripts.py``; they share the prelude below.)

**Fencing tokens** (leases and permits) follow one rule (``mint``): the token is the larger
of the server's time in microseconds and the last token stored for the resource plus one.

* within a run, every token is strictly greater than the previous one for the same
  resource (the stored counter enforces it, whatever the clock does);
* normally the token *is* the server time of the grant (two grants of one resource within
  one microsecond put it a tick ahead; a backward step of the server clock, by up to the
  step, until the clock catches up);
* after the counter is lost (restart without persistence, flush, expiry of its long TTL),
  the next token is the current server time: later than the moment any earlier token was
  issued, hence larger than every one of them, unless the counter was lost while a
  backward clock step still had the clock behind the last token (the risk the design
  accepts: NTP in slew mode, alarm on steps).

A grant is never refused or delayed for the sake of the token. Microsecond timestamps
(~1.8e15) are below 2**53, so Lua's doubles hold them (and ``+ 1``) exactly; they are
formatted with ``%.0f`` because ``tostring`` would switch to exponent notation. ``TIME``
and ``INFO`` before writes are allowed because scripts replicate their effects (the only
mode of Redis >= 7 and Valkey), never the script itself.

**Lost state.** Every script that grants first checks the server's generation marker
(``generation()``, see generation.py): after a flush, a restart, a failover, it grants
nothing for a quiet period. ``quiet()`` is the older, narrower check (an object whose
state is missing, on a server younger than a ttl), kept for callers not yet moved over.

Key names are built by the callers and passed in ``KEYS`` (never built inside a script);
the keys of one object share a hash tag (see ``keys.py``), so the scripts run on Redis
Cluster as well.
"""

from __future__ import annotations

from typing import Final

from .generation import GENERATION_LUA

__all__ = [
    "FENCED_APPEND",
    "FENCED_CLAIM",
    "GRANTED",
    "LOCK_ACQUIRE",
    "LOCK_EXTEND",
    "LOCK_RELEASE",
    "PRELUDE",
    "QUIET",
    "WAITING",
]

# Reply tags shared with the Python side.
GRANTED: Final = 1
WAITING: Final = 0
QUIET: Final = 2  # {QUIET, ms until the quiet period ends, "<run id>:<generation>"}

PRELUDE: Final = (
    """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- Mint the next fencing token for the counter at fence_key (see the module docstring).
local function mint(fence_key, fence_ttl_ms, now)
  local token = math.max(tonumber(redis.call('GET', fence_key) or '0') + 1, now)
  redis.call('SET', fence_key, fmt(token), 'PX', fence_ttl_ms)
  return token
end

-- For an object whose state this server lacks: how many ms to grant nothing (<= 0: none),
-- and the server's run id (see the module docstring).
local function quiet(quiet_key, ttl_ms, fresh_run_id)
  local info = redis.call('INFO', 'server')
  local run_id = string.match(info, 'run_id:(%x+)')
  if fresh_run_id ~= '' and
      string.find(' ' .. fresh_run_id .. ' ', ' ' .. run_id .. ' ', 1, true) then
    return 0, run_id
  end
  -- The uptime counts the wall clock's whole seconds since the one the server started in
  -- (a cached clock, so never more), so it had started by the end of that second.
  local t = redis.call('TIME')
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
  local started_by_ms = (tonumber(t[1]) - uptime + 1) * 1000
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local longest = math.max(ttl_ms, tonumber(redis.call('GET', quiet_key) or '0'))
  local wait = started_by_ms + longest - now_ms
  if wait > 0 then
    redis.call('SET', quiet_key, fmt(longest), 'PX', fmt(wait))
  end
  return wait, run_id
end

-- Raise the counter at fence_key to a holder's fence (a renewal reports it, see
-- generation.py), so that no later grant mints below a fence still held.
local function report_fence(fence_key, fence, fence_ttl_ms)
  if tonumber(redis.call('GET', fence_key) or '0') < tonumber(fence) then
    redis.call('SET', fence_key, fence, 'PX', fence_ttl_ms)
  end
end
"""
    + GENERATION_LUA
)

# A lease is the lock key holding "<owner> <token>": the owner is unique per acquire call,
# the token the fence minted with the grant (so a retried call can answer with it).
# Waiters stand in line (FIFO, as in the permit pool): the line is a zset owner -> ticket,
# each place kept alive by a heartbeat (zset owner -> expiry ms) that every attempt renews;
# only the head of the line is granted a free lease. The line's keys expire when nobody
# has stood in it for two waiter ttls.
#
# KEYS: lock, fence counter, line, generation marker, this owner's tombstone, heartbeats,
# ticket counter
# ARGV: owner, ttl ms, fence-counter ttl ms, vouched run ids ('' if none), waiter ttl ms
# -> {GRANTED, token, ticket (0 if unknown)} | {WAITING, remaining ttl ms or -1, ticket}
#  | {QUIET, ms, "<run id>:<generation>"}
LOCK_ACQUIRE: Final = (
    PRELUDE
    + """
if redis.call('EXISTS', KEYS[5]) == 1 then
  -- The attempt was abandoned and cleaned up already: this request was overtaken by its
  -- own clean-up (they travel on different connections), and nobody awaits the grant.
  return {0, -1, 0}
end
local owner = ARGV[1]
local holder = redis.call('GET', KEYS[1])
if holder then
  local held_by, token = string.match(holder, '^(%x+) (%d+)$')
  if held_by == owner then
    return {1, tonumber(token), 0}  -- a retried call whose first reply was lost
  end
end
-- Places whose heartbeat lapsed (their process died) leave the line.
local now_ms = math.floor(now_us() / 1000)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now_ms)) do
  redis.call('ZREM', KEYS[3], gone)
  redis.call('ZREM', KEYS[6], gone)
end
-- Take a place, or keep it: the heartbeat first (see POOL_ACQUIRE).
local waiter_ttl = tonumber(ARGV[5])
redis.call('ZADD', KEYS[6], now_ms + waiter_ttl, owner)
local ticket = redis.call('ZSCORE', KEYS[3], owner)
if not ticket then
  ticket = redis.call('INCR', KEYS[7])
  redis.call('ZADD', KEYS[3], ticket, owner)
end
for _, key in ipairs({KEYS[3], KEYS[6], KEYS[7]}) do
  redis.call('PEXPIRE', key, 2 * waiter_ttl)
end
ticket = tonumber(ticket)
if holder then
  return {0, redis.call('PTTL', KEYS[1]), ticket}
end
if redis.call('ZRANGE', KEYS[3], 0, 0)[1] ~= owner then
  return {0, -1, ticket}  -- free, but someone stood in line first
end
local wait, token = generation(KEYS[4], tonumber(ARGV[2]), ARGV[4])
if wait > 0 then
  return {2, wait, token}
end
local token = mint(KEYS[2], ARGV[3], now_us())
redis.call('SET', KEYS[1], owner .. ' ' .. fmt(token), 'PX', ARGV[2])
redis.call('ZREM', KEYS[3], owner)
redis.call('ZREM', KEYS[6], owner)
return {1, token, ticket}
"""
)

# KEYS: lock, fence counter; ARGV: "<owner> <token>", ttl ms, token, fence-counter ttl ms
# -> 1 renewed (expiry reset to the full ttl) | 0 not ours. Either way the token is
# reported (see generation.py).
LOCK_EXTEND: Final = (
    PRELUDE
    + """
report_fence(KEYS[2], ARGV[3], ARGV[4])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
)

# Release a lease, or leave the line (an abandoned attempt). Whoever stands in line is
# told (its head may now be granted).
# KEYS: lock, line, the owner's tombstone, heartbeats
# ARGV: owner, channel, message, tombstone ttl ms ('0' for a release, the lease ttl for the
# clean-up of an abandoned attempt) -> 1 deleted | 0 not ours
LOCK_RELEASE: Final = """
if ARGV[4] ~= '0' then
  -- A request of the abandoned attempt may still be on its way (a resend of one that was
  -- granted, too): refuse it on arrival.
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
end
local left = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
local holder = redis.call('GET', KEYS[1])
local mine = holder and string.match(holder, '^(%x+) ') == ARGV[1]
if mine then
  redis.call('DEL', KEYS[1])
end
if (mine or left == 1) and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
if mine then return 1 end
return 0
"""

# Fences are compared as decimal strings, so any nonnegative integer is exact.
_LESS: Final = """
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
"""

# KEYS: entries (list), high-water mark, this append's receipt
# ARGV: fence (decimal, >= 0), entry, receipt ttl ms -> {1, index} | {0, high water}
# The receipt makes a resent call (redis-py retries a command whose reply was lost) answer
# as the first did instead of appending twice, or refusing an entry it already appended.
FENCED_APPEND: Final = (
    _LESS
    + """
local done = redis.call('GET', KEYS[3])
if done then
  return {1, tonumber(done)}
end
local fence = ARGV[1]
if fence ~= '0' then
  local high = redis.call('GET', KEYS[2]) or '0'
  if less(fence, high) then
    return {0, high}
  end
  if less(high, fence) then
    redis.call('SET', KEYS[2], fence)
  end
end
local index = redis.call('RPUSH', KEYS[1], fence .. ':' .. ARGV[2]) - 1
redis.call('SET', KEYS[3], index, 'PX', ARGV[3])
return {1, index}
"""
)

# A claim (what a fenced read starts with): refused when the fence is below the mark, and
# otherwise raising the mark to it, so every older holder's write fails from now on. A
# resent call does the same again, harmlessly. (The comparison is written out rather than
# calling less(): this runs for every turn's read.)
# KEYS: high-water mark; ARGV: fence -> 1 | the high water (a string) when refused
FENCED_CLAIM: Final = """
local fence = ARGV[1]
if fence == '0' then
  return 1
end
local high = redis.call('GET', KEYS[1]) or '0'
if #fence < #high or (#fence == #high and fence < high) then
  return high
end
if fence ~= high then
  redis.call('SET', KEYS[1], fence)
end
return 1
"""
