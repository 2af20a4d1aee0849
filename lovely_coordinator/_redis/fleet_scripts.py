"""The fleet's Lua scripts: one atomic admission per request, timed by the server's clock.

Keys of fleet ``N`` under prefix ``P`` (one hash tag ``{fleet:N}``, so one slot: every
script below touches the keys of one fleet only, see keys.py)::

    B = P{fleet:N}
    B:epoch            the fleet's state id (a random id, never expires; absent = state lost)
    B:members          zset member id -> expiry ms (renewed every ttl/3 by each member)
    B:governed         hash tuple tag -> 1, for every tuple with a setting
    B:t:T:cfg          hash rpm, tpm, limit, closed (reopen instant, ms)
    B:t:T:bucket       hash rq, tk (available, floats, may be negative), at (us of last refill)
    B:t:T:holders      zset unit id -> expiry ms (one per admitted request; the member renews)
    B:t:T:charges      hash unit id -> tokens charged (what settle() corrects)
    B:t:T:queue        zset waiter id -> ticket (order of arrival at the fleet)
    B:t:T:waiters      zset waiter id -> heartbeat expiry ms (refreshed by every attempt)
    B:t:T:needs        hash waiter id -> tokens it asks for
    B:t:T:ticket       the ticket counter (never expires: its absence means lost state)
    B:t:T:quiet        during a quiet period (see scripts.py)
    B:t:T:abandoned:I  briefly, after the clean-up of an abandoned attempt

**Admission** (``ADMIT``) is one script per attempt: drop expired units and waiters (a dead
member's units come back), take a ticket on the first attempt, and grant only if (a) the
gate is open, (b) the limit's window of free units reaches the caller's rank, and (c) the
bucket holds what every waiter up to and including the caller asks for (one request each,
and their tokens, each capped at the bucket's capacity: a request larger than the bucket
waits for a full bucket, then takes it below zero). So a small request never overtakes a
large one waiting for the budget, and within the free window the order of arrival holds
as in ``RedisPermitPool``. A refused waiter is told how long until what it waits for can
be there (the reopen instant, the first unit's expiry, the refill instant of the
cumulative need), which it waits for unless woken earlier by an announcement.

**Order key.** The queue's score is the ticket. Room is left for what comes next: a bounded
priority offset (score = ticket - offset, offset <= a bound: interactive work ahead of
background work by at most that many places, so nothing starves) and per-tenant shares
(a waiter id may carry its tenant; the rank test would then count a tenant's own units).

**Settling** replaces a unit's charge with the actual usage; a unit that lapsed (its
member died or stalled past the ttl) is gone, so a late settle or release changes nothing.

**Lost state.** A server that lost the fleet (no ``epoch``) answers ``LOST``: members put
back the settings they know, with every bucket *empty* at that instant (it refills at its
rate), so a restart never admits more than the budget allowed. Any loss of state the
server's generation marker notices (generation.py: a flush, a restart, a failover to a
replica that missed writes) also empties a bucket written before it (each bucket records
the generation that wrote it), and a limit's units are granted only after the quiet
period, when every unit that may still be held elsewhere has lapsed.
"""

from __future__ import annotations

from typing import Final

from .scripts import PRELUDE

__all__ = ["ADMIT", "BEAT", "LEAVE", "LOST", "RELEASE", "SET", "SETTLE", "STATS", "UNGOVERNED"]

UNGOVERNED: Final = 3  # {UNGOVERNED}: the tuple has no setting any more
LOST: Final = 4  # {LOST}: the fleet's state is gone (restore the settings, then retry)

_FLEET_PRELUDE: Final = (
    PRELUDE
    + """
local function g(x) return string.format('%.17g', x) end

-- A tuple's settings: rpm, tpm, limit (numbers or nil), closed (ms or nil).
local function config(cfg_key)
  local c = redis.call('HMGET', cfg_key, 'rpm', 'tpm', 'limit', 'closed')
  return tonumber(c[1]), tonumber(c[2]), tonumber(c[3]), tonumber(c[4])
end

-- The bucket refilled to now (us): available requests and tokens (nil: no dimension).
local function refill(bucket_key, rpm, tpm, now)
  local b = redis.call('HMGET', bucket_key, 'rq', 'tk', 'at')
  local at = tonumber(b[3]) or now
  local minutes = math.max(0, now - at) / 60000000
  local rq, tk
  if rpm then rq = math.min(rpm, (tonumber(b[1]) or rpm) + minutes * rpm) end
  if tpm then tk = math.min(tpm, (tonumber(b[2]) or tpm) + minutes * tpm) end
  return rq, tk
end

local function store(bucket_key, rq, tk, now)
  local fields = {'at', g(now)}
  if rq then table.insert(fields, 'rq'); table.insert(fields, g(rq)) end
  if tk then table.insert(fields, 'tk'); table.insert(fields, g(tk)) end
  redis.call('HSET', bucket_key, unpack(fields))
  if not rq then redis.call('HDEL', bucket_key, 'rq') end
  if not tk then redis.call('HDEL', bucket_key, 'tk') end
end

-- What the bucket has drawn in all (requests, tokens): the marks a learned remaining
-- amount is compared with (see SET's 'learn').
local function drawn(bucket_key, requests, tokens)
  if requests ~= 0 then redis.call('HINCRBYFLOAT', bucket_key, 'drq', requests) end
  if tokens ~= 0 then redis.call('HINCRBYFLOAT', bucket_key, 'dtk', tokens) end
end

-- Drop expired units and waiters (KEYS 5..9 of ADMIT's layout, given explicitly).
local function purge(holders, charges, queue, waiters, needs, now_ms)
  local dead = redis.call('ZRANGEBYSCORE', holders, '-inf', now_ms)
  for _, id in ipairs(dead) do
    redis.call('ZREM', holders, id)
    redis.call('HDEL', charges, id)
  end
  local gone = redis.call('ZRANGEBYSCORE', waiters, '-inf', now_ms)
  for _, id in ipairs(gone) do
    redis.call('ZREM', queue, id)
    redis.call('ZREM', waiters, id)
    redis.call('HDEL', needs, id)
  end
  return #dead + #gone
end

-- Wake the waiters that may now be admitted: up to the limit's free window (or the first
-- 64 without a limit); "<tag> <highest ticket>" on the fleet's channel.
local function announce(holders, queue, limit, channel, tag)
  local window = 64
  if limit then window = math.min(window, limit - redis.call('ZCARD', holders)) end
  if window <= 0 then return end
  local last = redis.call('ZRANGE', queue, window - 1, window - 1, 'WITHSCORES')
  if #last == 0 then last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES') end
  if #last > 0 then redis.call('SPUBLISH', channel, tag .. ' ' .. last[2]) end
end
"""
)

# KEYS: 1 epoch, 2 cfg, 3 bucket, 4 quiet, 5 holders, 6 charges, 7 queue, 8 waiters,
#       9 needs, 10 ticket counter, 11 this attempt's tombstone, 12 the generation marker
# ARGV: 1 id, 2 tokens, 3 unit ttl ms, 4 waiter ttl ms, 5 channel, 6 tag, 7 fresh run id
# -> {GRANTED, ticket, server ms, drawn requests, drawn tokens ('' without a budget)}
#  | {WAITING, ms or -1, ticket, closed 0/1}
#  | {QUIET, ms, "<run id>:<generation>"}
#  | {UNGOVERNED} | {LOST}
ADMIT: Final = (
    _FLEET_PRELUDE
    + """
local id, tokens = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[11]) == 1 then
  return {0, -1, 0, 0}  -- overtaken by its own clean-up
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {4} end
local rpm, tpm, limit, closed = config(KEYS[2])
if not (rpm or tpm or limit or closed) then
  redis.call('ZREM', KEYS[7], id)
  redis.call('ZREM', KEYS[8], id)
  redis.call('HDEL', KEYS[9], id)
  return {3}
end
local now = now_us()
local now_ms = math.floor(now / 1000)
local purged = purge(KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], now_ms)
if redis.call('ZSCORE', KEYS[5], id) then
  -- A retried call whose first reply was lost: the unit stands.
  return {1, tonumber(redis.call('HGET', KEYS[6], id .. ':ticket') or '0'), now_ms}
end
-- Lost state (a flush, a restart, a failover: see generation.py): a limit's units may be
-- held elsewhere, so none is granted for a quiet period; a bucket that may be stale
-- starts empty now.
local wait, token, gen = generation(KEYS[12], tonumber(ARGV[3]), ARGV[7])
if limit and wait > 0 then return {2, wait, token} end
local ticket = redis.call('ZSCORE', KEYS[7], id)
if not ticket then
  ticket = redis.call('INCR', KEYS[10])
  redis.call('ZADD', KEYS[7], ticket, id)
  redis.call('HSET', KEYS[9], id, ARGV[2])
end
ticket = tonumber(ticket)
local function refuse(ms, is_closed)
  redis.call('ZADD', KEYS[8], now_ms + tonumber(ARGV[4]), id)
  if purged > 0 then announce(KEYS[5], KEYS[7], limit, ARGV[5], ARGV[6]) end
  return {0, ms, ticket, is_closed}
end
if closed and closed > now_ms then
  return refuse(closed - now_ms, 1)
end
local rank = redis.call('ZRANK', KEYS[7], id)
if limit and rank >= limit - redis.call('ZCARD', KEYS[5]) then
  local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  local ms = -1
  if #first > 0 then ms = tonumber(first[2]) - now_ms end
  return refuse(ms, 0)
end
if rpm or tpm then
  local written_by = redis.call('HGET', KEYS[3], 'gen')
  if written_by and written_by ~= gen then
    store(KEYS[3], rpm and 0 or nil, tpm and 0 or nil, now)
  end
  redis.call('HSET', KEYS[3], 'gen', gen)
end
local rq, tk = refill(KEYS[3], rpm, tpm, now)
if rpm or tpm then
  -- What every waiter up to the caller asks for, each capped at the capacity.
  local need_rq, need_tk = 0, 0
  local ahead = redis.call('ZRANGE', KEYS[7], 0, rank)
  for _, other in ipairs(ahead) do
    if rpm then need_rq = need_rq + math.min(1, rpm) end
    if tpm then
      need_tk = need_tk + math.min(tonumber(redis.call('HGET', KEYS[9], other) or '0'), tpm)
    end
  end
  local ms = 0
  if rpm and rq < need_rq then ms = math.max(ms, (need_rq - rq) / rpm * 60000) end
  if tpm and tk < need_tk then ms = math.max(ms, (need_tk - tk) / tpm * 60000) end
  if ms > 0 then return refuse(math.ceil(ms), 0) end
  if rq then rq = rq - 1 end
  if tk then tk = tk - tokens end
  store(KEYS[3], rq, tk, now)
  drawn(KEYS[3], 1, tokens)
end
local marks = redis.call('HMGET', KEYS[3], 'drq', 'dtk')
redis.call('ZREM', KEYS[7], id)
redis.call('ZREM', KEYS[8], id)
redis.call('HDEL', KEYS[9], id)
redis.call('ZADD', KEYS[5], now_ms + tonumber(ARGV[3]), id)
redis.call('HSET', KEYS[6], id, ARGV[2], id .. ':ticket', ticket)
if purged > 0 then announce(KEYS[5], KEYS[7], limit, ARGV[5], ARGV[6]) end
return {1, ticket, now_ms, marks[1] or '', marks[2] or ''}
"""
)

# Settle a unit: its charge becomes ARGV[2] tokens; a lapsed unit changes nothing.
# KEYS: 1 cfg, 2 bucket, 3 holders, 4 charges, 5 queue
# ARGV: 1 id, 2 tokens, 3 channel, 4 tag -> 1 applied | 0 the unit is gone
SETTLE: Final = (
    _FLEET_PRELUDE
    + """
local now = now_us()
local expiry = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not expiry or tonumber(expiry) <= math.floor(now / 1000) then return 0 end
local charged = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0')
local delta = tonumber(ARGV[2]) - charged
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
local rpm, tpm, limit = config(KEYS[1])
if tpm and delta ~= 0 then
  local rq, tk = refill(KEYS[2], rpm, tpm, now)
  tk = math.min(tpm, tk - delta)
  store(KEYS[2], rq, tk, now)
  drawn(KEYS[2], 0, delta)
  if delta < 0 then announce(KEYS[3], KEYS[5], limit, ARGV[3], ARGV[4]) end
end
return 1
"""
)

# Release a unit (and settle it at ARGV[2]), or give up a place in line. Unused (ARGV[3] =
# '0': the call was never made) refunds the request and its charge. ARGV[5] > 0 is the
# clean-up of an abandoned attempt: its tombstone refuses a resend for that many ms.
# KEYS: 1 cfg, 2 bucket, 3 holders, 4 charges, 5 queue, 6 waiters, 7 needs, 8 tombstone
# ARGV: 1 id, 2 tokens, 3 used, 4 channel/tag ("channel\\ntag"), 5 tombstone ms
RELEASE: Final = (
    _FLEET_PRELUDE
    + """
local id = ARGV[1]
if ARGV[5] ~= '0' then redis.call('SET', KEYS[8], '1', 'PX', ARGV[5]) end
local channel, tag = string.match(ARGV[4], '^(.-)\\n(.*)$')
local now = now_us()
local now_ms = math.floor(now / 1000)
local rpm, tpm, limit = config(KEYS[1])
local queued = redis.call('ZREM', KEYS[5], id)
redis.call('ZREM', KEYS[6], id)
redis.call('HDEL', KEYS[7], id)
local expiry = redis.call('ZSCORE', KEYS[3], id)
local held = 0
if expiry and tonumber(expiry) > now_ms then
  held = 1
  local charged = tonumber(redis.call('HGET', KEYS[4], id) or '0')
  if rpm or tpm then
    local rq, tk = refill(KEYS[2], rpm, tpm, now)
    if ARGV[3] == '0' then
      if rq then rq = math.min(rpm, rq + 1) end
      if tk then tk = math.min(tpm, tk + charged) end
      drawn(KEYS[2], -1, -charged)
    elseif tk then
      tk = math.min(tpm, tk - (tonumber(ARGV[2]) - charged))
      drawn(KEYS[2], 0, tonumber(ARGV[2]) - charged)
    end
    store(KEYS[2], rq, tk, now)
  end
end
redis.call('ZREM', KEYS[3], id)
redis.call('HDEL', KEYS[4], id, id .. ':ticket')
if held + queued > 0 then announce(KEYS[3], KEYS[5], limit, channel, tag) end
return held
"""
)

# A member's heartbeat: its own expiry, and its units' (each "k unit": KEYS[k] holds it).
# KEYS: 1 epoch, 2 members, then holders keys; ARGV: 1 member, 2 ttl ms, then pairs
# -> {epoch or '', live members, units no longer held (their ids)...}
BEAT: Final = (
    _FLEET_PRELUDE
    + """
local now_ms = math.floor(now_us() / 1000)
local expiry = now_ms + tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
local reply = {redis.call('GET', KEYS[1]) or '', redis.call('ZCARD', KEYS[2])}
for i = 3, #ARGV, 2 do
  local key, unit = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local held = redis.call('ZSCORE', key, unit)
  if held and tonumber(held) > now_ms then
    redis.call('ZADD', key, 'XX', expiry, unit)
  else
    table.insert(reply, unit)
  end
end
return reply
"""
)

# KEYS: 1 members; ARGV: 1 member -> 1
LEAVE: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""

# Change a tuple's settings. KEYS: 1 epoch, 2 governed, 3 cfg, 4 bucket, 5 holders, 6 queue
# ARGV: 1 op, 2 tag, 3 channel, 4 a new epoch id (used if there is none), 5.. the values:
#   budget rpm tpm ('' removes)      limit n ('' removes)      close ms      open
#   restore rpm tpm limit (only where the tuple has no settings; the buckets start empty;
#     closures are restored by a separate 'close')
#   charge requests tokens (admitted while Redis was unreachable: drawn now)
#   learn rpm tpm requests-remaining tokens-remaining [drawn-requests drawn-tokens ms]
#     (from a provider's headers: a rate sets its dimension unless it was set explicitly;
#     a remaining amount lowers what is available, never raises it. With the marks of the
#     request the headers answer (what the bucket had drawn in all when it was admitted,
#     and when), the bound is the remaining amount plus the refill since, less what was
#     drawn since: the provider had not counted those yet)
# -> the epoch id
SET: Final = (
    _FLEET_PRELUDE
    + """
local op, tag = ARGV[1], ARGV[2]
local a, b, c, d = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local mark_rq, mark_tk, mark_ms = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[4]
  redis.call('SET', KEYS[1], epoch)
end
local now = now_us()
local now_ms = math.floor(now / 1000)
local rpm, tpm, limit, closed = config(KEYS[3])
local before = {rpm, tpm, limit, closed}
local flags = redis.call('HMGET', KEYS[3], 'rpm_learned', 'tpm_learned')
local rpm_learned, tpm_learned = flags[1], flags[2]
local rq, tk = refill(KEYS[4], rpm, tpm, now)
local function budget(new_rpm, new_tpm)
  -- Keep what was spent: never above the new capacity; a new dimension starts full.
  if new_rpm then rq = math.min(new_rpm, rq or new_rpm) else rq = nil end
  if new_tpm then tk = math.min(new_tpm, tk or new_tpm) else tk = nil end
  rpm, tpm = new_rpm, new_tpm
end
if op == 'charge' then
  if rq then rq = rq - a end
  if tk then tk = tk - b end
  if rq or tk then store(KEYS[4], rq, tk, now) end
  return epoch
elseif op == 'budget' then
  budget(a, b)
  rpm_learned, tpm_learned = nil, nil
elseif op == 'learn' then
  local new_rpm, new_tpm = rpm, tpm
  if a and (not rpm or rpm_learned) then new_rpm, rpm_learned = a, '1' end
  if b and (not tpm or tpm_learned) then new_tpm, tpm_learned = b, '1' end
  budget(new_rpm, new_tpm)
  if mark_ms then
    local minutes = math.max(0, now_ms - mark_ms) / 60000
    local since = redis.call('HMGET', KEYS[4], 'drq', 'dtk')
    if c and rq then
      c = c + rpm * minutes - math.max(0, (tonumber(since[1]) or 0) - (mark_rq or 0))
    end
    if d and tk then
      d = d + tpm * minutes - math.max(0, (tonumber(since[2]) or 0) - (mark_tk or 0))
    end
  end
  if c and rq then rq = math.min(rq, c) end
  if d and tk then tk = math.min(tk, d) end
elseif op == 'limit' then
  limit = a
elseif op == 'close' then
  closed = math.max(closed or 0, now_ms + a)
elseif op == 'open' then
  closed = nil
elseif op == 'restore' then
  if rpm or tpm or limit then return epoch end
  rpm, tpm, limit = a, b, c
  rq, tk = rpm and 0 or nil, tpm and 0 or nil
end
if closed and closed <= now_ms then closed = nil end
if rpm or tpm then store(KEYS[4], rq, tk, now) else redis.call('DEL', KEYS[4]) end
redis.call('DEL', KEYS[3])
local fields = {}
local function put(name, value)
  if value then table.insert(fields, name); table.insert(fields, value) end
end
put('rpm', rpm and g(rpm))
put('tpm', tpm and g(tpm))
put('limit', limit and g(limit))
put('closed', closed and g(closed))
put('rpm_learned', rpm and rpm_learned)
put('tpm_learned', tpm and tpm_learned)
if #fields > 0 then
  redis.call('HSET', KEYS[3], unpack(fields))
  redis.call('HSET', KEYS[2], tag, '1')
else
  redis.call('HDEL', KEYS[2], tag)
end
if op ~= 'learn' or before[1] ~= rpm or before[2] ~= tpm then
  -- Members re-read the settings, and the tuple's waiters re-try. (Not for a learned
  -- remaining amount, which only ever lowers what is available: it arrives with every
  -- response, and would wake every waiter of the fleet each time.)
  redis.call('SPUBLISH', ARGV[3], tag .. ' *')
end
return epoch
"""
)

# Every tuple's view. KEYS: 1 epoch, 2 members, then 5 per tuple (cfg, bucket, holders,
# queue, waiters) -> {server ms, epoch or '', live members, then per tuple {rpm, tpm, limit,
# closed, rq, tk, in flight, queued}} (numbers as strings, '' where absent)
STATS: Final = (
    _FLEET_PRELUDE
    + """
local now = now_us()
local now_ms = math.floor(now / 1000)
local reply = {tostring(now_ms), redis.call('GET', KEYS[1]) or '',
  redis.call('ZCOUNT', KEYS[2], '(' .. now_ms, '+inf')}
for i = 3, #KEYS, 5 do
  local rpm, tpm, limit, closed = config(KEYS[i])
  local rq, tk = refill(KEYS[i + 1], rpm, tpm, now)
  local function s(x) if x then return g(x) end return '' end
  if closed and closed <= now_ms then closed = nil end
  table.insert(reply, {s(rpm), s(tpm), s(limit), s(closed), s(rq), s(tk),
    redis.call('ZCOUNT', KEYS[i + 2], '(' .. now_ms, '+inf'),
    redis.call('ZCOUNT', KEYS[i + 4], '(' .. now_ms, '+inf')})
end
return reply
"""
)
