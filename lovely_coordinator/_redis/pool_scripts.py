"""The permit pool's Lua scripts (the shared rules are in ``scripts.py``).

KEYS of every pool script, in this order: holders (zset id -> expiry ms), queue (zset id
-> ticket), waiter heartbeats (zset id -> expiry ms), ticket counter, fence counter, grants
(hash id -> "fence ticket"), the server's generation marker (see generation.py), and
(acquire, leave) the id's tombstone.

Announcements: whenever permits may have become free (a release, a place given up, a dead
holder or waiter purged), the script publishes the highest ticket that could now be
granted, so each process wakes only its waiters up to that ticket. Nothing is published
while the pool is full.
"""

from __future__ import annotations

from typing import Final

from .scripts import PRELUDE

__all__ = ["POOL_ACQUIRE", "POOL_LEAVE", "POOL_REFRESH"]

_POOL_PRELUDE: Final = (
    PRELUDE
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
    redis.call('SPUBLISH', channel, last[2])
  end
end
"""
)

# ARGV: id, limit, permit ttl ms, waiter ttl ms, fence ttl ms, channel, vouched run ids
# -> {GRANTED, token, ticket} | {WAITING, ms until the first holder expires or -1, ticket}
#  | {QUIET, ms, "<run id>:<generation>"}
POOL_ACQUIRE: Final = (
    _POOL_PRELUDE
    + """
local id, limit = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[8]) == 1 then
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
local wait, token = generation(KEYS[7], tonumber(ARGV[3]), ARGV[7])
if wait > 0 then
  return {2, wait, token}  -- not even a place in line
end
local ticket = redis.call('ZSCORE', KEYS[2], id)
if not ticket then
  ticket = redis.call('INCR', KEYS[4])
  -- The heartbeat first: a script that fails further on (a corrupted key) keeps its
  -- writes, and a place in line without a heartbeat would never be purged.
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[4]), id)
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

# ARGV: id, permit ttl ms, the permit's fence, fence ttl ms -> 1 renewed | 0 lost (expired
# or removed). Either way the fence is reported (see generation.py).
POOL_REFRESH: Final = (
    PRELUDE
    + """
report_fence(KEYS[5], ARGV[3], ARGV[4])
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
# ('0' unless it is the clean-up of an abandoned attempt: then the pool ttl), and to give a
# permit back but keep the place in line (a grant that arrived too late to use), its
# ticket and the waiter ttl ms ('' and '0' otherwise) -> 1 if it held a permit
POOL_LEAVE: Final = (
    _POOL_PRELUDE
    + """
local id = ARGV[1]
if ARGV[4] ~= '0' then
  -- A request of the abandoned attempt may still be on its way: refuse it on arrival.
  redis.call('SET', KEYS[8], '1', 'PX', ARGV[4])
end
local now_ms = math.floor(now_us() / 1000)
local purged = purge(now_ms)
local held = redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[6], id)
local queued
if ARGV[5] ~= '' then
  queued = redis.call('ZADD', KEYS[2], ARGV[5], id)
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[6]), id)
else
  queued = redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
if held + queued + purged > 0 then
  announce(tonumber(ARGV[2]), ARGV[3])
end
return held
"""
)
