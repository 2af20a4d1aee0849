"""The gates' Lua scripts (the shared rules are in ``scripts.py``).

KEYS: closed (zset member -> reopen time, ms on the server clock) and, for the state,
epoch (a value the gate set gets when it is first read) and the server's generation marker
(see generation.py): together they let a replica tell that the server lost the set, or
may have (a restart, a failover). Messages on the channel: ``c <remaining ms> <member>``
(closed until) and ``o <member>`` (opened).
"""

from __future__ import annotations

from typing import Final

from .scripts import PRELUDE

__all__ = ["GATE_CLOSE", "GATE_OPEN", "GATE_STATE"]

# ARGV: member, reopen after ms, channel -> remaining ms of the (possibly longer) closure
GATE_CLOSE: Final = (
    PRELUDE
    + """
local now_ms = math.floor(now_us() / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local want = now_ms + tonumber(ARGV[2])
local current = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if current >= want then
  return current - now_ms
end
redis.call('ZADD', KEYS[1], want, ARGV[1])
redis.call('SPUBLISH', ARGV[3], 'c ' .. ARGV[2] .. ' ' .. ARGV[1])
return tonumber(ARGV[2])
"""
)

# ARGV: member, channel
GATE_OPEN: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('SPUBLISH', ARGV[2], 'o ' .. ARGV[1])
return 1
"""

# -> {epoch, server time ms, member, remaining ms, member, remaining ms, ...} for every
# closure still running. The epoch is the gate set's (created, the server time in
# microseconds, when missing) and the marker's generation: a replica that saw another
# epoch before knows the server lost, or may have lost, the gate set since. The server time
# lets a replica notice a forward step of the server clock (which ends closures early).
GATE_STATE: Final = (
    PRELUDE
    + """
local now = now_us()
local now_ms = math.floor(now / 1000)
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = fmt(now)
  redis.call('SET', KEYS[2], epoch)
end
local _, _, gen = generation(KEYS[3], 0, '')
epoch = epoch .. ':' .. gen
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local closed = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local out = {epoch, now_ms}
for i = 1, #closed, 2 do
  out[#out + 1] = closed[i]
  out[#out + 1] = fmt(tonumber(closed[i + 1]) - now_ms)
end
return out
"""
)
