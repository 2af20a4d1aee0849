"""The Lua scripts: every decision that several replicas share is made here, atomically.

A script runs alone on the server, so each one is a small synchronous state machine over
Redis keys, and the Python side only sends it and interprets the reply. All shared
timing uses the server clock (``TIME``), never a replica's; a replica's own clock is used
only for its local deadlines.

Fencing tokens (leases and permits) follow one rule (``mint``): the token is the larger of
the server's time in microseconds and the last token stored for the resource plus one. So:

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

A grant is never refused or delayed for the sake of the token: a clock step costs nothing
but that window. Microsecond timestamps (~1.8e15) are below 2**53, so Lua's doubles hold
them (and ``+ 1``) exactly; they are formatted with ``%.0f`` because ``tostring`` would
switch to exponent notation. ``TIME`` before writes is allowed because scripts replicate
their effects (the only mode of Redis >= 7 and Valkey), never the script itself.

Key names are built by the callers and passed in ``KEYS`` (never built inside a script);
the keys of one resource share a hash tag so the scripts also run on Redis Cluster.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "FENCED_APPEND",
    "GATE_CLOSE",
    "GATE_OPEN",
    "GATE_STATE",
    "LOCK_ACQUIRE",
    "LOCK_EXTEND",
    "LOCK_RELEASE",
    "POOL_ACQUIRE",
    "POOL_LEAVE",
    "POOL_REFRESH",
]

# Reply tags shared with the Python side.
GRANTED: Final = 1
WAITING: Final = 0

_PRELUDE = """
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
"""

# KEYS: lock, fence counter, "someone is waiting" flag, this owner's tombstone
# ARGV: owner (unique per acquire call), ttl ms, fence-counter ttl ms
# -> {GRANTED, token} | {WAITING, remaining ttl ms or -1}
LOCK_ACQUIRE: Final = (
    _PRELUDE
    + """
if redis.call('EXISTS', KEYS[4]) == 1 then
  -- The attempt was abandoned and cleaned up already: this request was overtaken by its
  -- own clean-up (they travel on different connections), and nobody awaits the grant.
  return {0, -1}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, mint(KEYS[2], ARGV[3], now_us())}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- A retried call whose first reply was lost: the grant stands, and as nobody else
  -- could mint since, the counter holds its token.
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
local pttl = redis.call('PTTL', KEYS[1])
-- Ask the holder's release to publish; the flag outlives the lease.
redis.call('SET', KEYS[3], '1', 'PX', math.max(pttl, 0) + tonumber(ARGV[2]))
return {0, pttl}
"""
)

# KEYS: lock; ARGV: owner, ttl ms -> 1 renewed (expiry reset to the full ttl) | 0 not ours
LOCK_EXTEND: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lock, waiting flag, the owner's tombstone
# ARGV: owner, channel, message, tombstone ttl ms ('0' for a release, the lease ttl for the
# clean-up of an abandoned attempt) -> 1 deleted | 0 not ours
LOCK_RELEASE: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if ARGV[4] ~= '0' then
    -- A request of the abandoned attempt may still be on its way: refuse it on arrival.
    redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
  end
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
"""

# KEYS: entries (list), high-water mark, this append's receipt
# ARGV: fence (decimal, >= 0), entry, receipt ttl ms -> {1, index} | {0, high water}
# Fences are compared as decimal strings, so any nonnegative integer is exact. The receipt
# makes a resent call (redis-py retries a command whose reply was lost) answer as the
# first did instead of appending twice, or refusing an entry it already appended.
FENCED_APPEND: Final = """
local done = redis.call('GET', KEYS[3])
if done then
  return {1, tonumber(done)}
end
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
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

# The permit pool. KEYS (all scripts): holders (zset id -> expiry ms), queue (zset id ->
# ticket), waiter heartbeats (zset id -> expiry ms), ticket counter, fence counter,
# grants (hash id -> "fence ticket"), and (acquire, leave) the id's tombstone.
_POOL_PRELUDE = (
    _PRELUDE
    + """
-- Drop holders and waiters whose expiry passed: a dead process gives its places back.
local function purge(now_ms)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms)
  for _, id in ipairs(dead) do
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[6], id)
  end
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  for _, id in ipairs(gone) do
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
  end
  return #dead + #gone
end

-- Tell waiters up to the highest ticket that may now be granted to come and try.
local function announce(limit, channel)
  local free = limit - redis.call('ZCARD', KEYS[1])
  if free <= 0 then return end
  local last = redis.call('ZRANGE', KEYS[2], free - 1, free - 1, 'WITHSCORES')
  if #last == 0 then
    last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  end
  if #last > 0 then
    redis.call('PUBLISH', channel, last[2])
  end
end
"""
)

# ARGV: id, limit, permit ttl ms, waiter ttl ms, fence ttl ms, channel
# -> {GRANTED, token, ticket} | {WAITING, ms until the first holder expires or -1, ticket}
POOL_ACQUIRE: Final = (
    _POOL_PRELUDE
    + """
local id, limit = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[7]) == 1 then
  return {0, -1, 0}  -- overtaken by its own clean-up (see LOCK_ACQUIRE)
end
local now = now_us()
local now_ms = math.floor(now / 1000)
local purged = purge(now_ms)
local grant = redis.call('HGET', KEYS[6], id)
if grant and redis.call('ZSCORE', KEYS[1], id) then
  -- A retried call whose first reply was lost: the grant stands, unless it expired
  -- meanwhile (then purge() dropped it, and the caller queues afresh).
  if purged > 0 then announce(limit, ARGV[6]) end
  local fence, ticket = string.match(grant, '(%d+) (%d+)')
  return {1, tonumber(fence), tonumber(ticket)}
end
local ticket = redis.call('ZSCORE', KEYS[2], id)
if not ticket then
  ticket = redis.call('INCR', KEYS[4])
  redis.call('ZADD', KEYS[2], ticket, id)
end
ticket = tonumber(ticket)
local free = limit - redis.call('ZCARD', KEYS[1])
if redis.call('ZRANK', KEYS[2], id) < free then
  local token = mint(KEYS[5], ARGV[5], now)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[3]), id)
  redis.call('HSET', KEYS[6], id, fmt(token) .. ' ' .. fmt(ticket))
  if purged > 0 then announce(limit, ARGV[6]) end
  return {1, token, ticket}
end
redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[4]), id)
if purged > 0 then announce(limit, ARGV[6]) end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local until_free = -1
if #first > 0 then until_free = tonumber(first[2]) - now_ms end
return {0, until_free, ticket}
"""
)

# ARGV: id, permit ttl ms -> 1 renewed | 0 lost (expired or removed)
POOL_REFRESH: Final = (
    _PRELUDE
    + """
local now_ms = math.floor(now_us() / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now_ms then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now_ms + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

# Release a permit or give up a queue place. ARGV: id, limit, channel, tombstone ttl ms
# ('0' for a release, the pool ttl for the clean-up of an abandoned attempt)
# -> 1 if it held a permit
POOL_LEAVE: Final = (
    _POOL_PRELUDE
    + """
local id = ARGV[1]
if ARGV[4] ~= '0' then
  -- A request of the abandoned attempt may still be on its way: refuse it on arrival.
  redis.call('SET', KEYS[7], '1', 'PX', ARGV[4])
end
local purged = purge(math.floor(now_us() / 1000))
local held = redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[6], id)
local queued = redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
if held + queued + purged > 0 then
  announce(tonumber(ARGV[2]), ARGV[3])
end
return held
"""
)

# Gates. KEYS: closed (zset member -> reopen time, ms on the server clock). Messages on the
# channel: "c <remaining ms> <member>" (closed until) and "o <member>" (opened).
# ARGV: member, reopen after ms, channel -> remaining ms of the (possibly longer) closure
GATE_CLOSE: Final = (
    _PRELUDE
    + """
local now_ms = math.floor(now_us() / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local want = now_ms + tonumber(ARGV[2])
local current = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if current >= want then
  return current - now_ms
end
redis.call('ZADD', KEYS[1], want, ARGV[1])
redis.call('PUBLISH', ARGV[3], 'c ' .. ARGV[2] .. ' ' .. ARGV[1])
return tonumber(ARGV[2])
"""
)

# ARGV: member, channel
GATE_OPEN: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'o ' .. ARGV[1])
return 1
"""

# -> {member, remaining ms, member, remaining ms, ...} for every closure still running
GATE_STATE: Final = (
    _PRELUDE
    + """
local now_ms = math.floor(now_us() / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local closed = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local out = {}
for i = 1, #closed, 2 do
  out[#out + 1] = closed[i]
  out[#out + 1] = fmt(tonumber(closed[i + 1]) - now_ms)
end
return out
"""
)
