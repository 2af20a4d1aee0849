"""Noticing that a server may have lost state: the generation marker and the quiet period.

A server can forget grants that are still held in more ways than a restart: ``FLUSHALL``
or ``FLUSHDB``, a restart from a snapshot older than the last grants, a failover to a
replica that missed writes, an eviction. Whatever the cause, the objects' own keys cannot
tell: a missing key may be an object never used, and a present one may be stale. So every
script that grants first checks one marker per server (per slot on a Cluster, where a
script can only reach its own slot's keys): a hash that names the server boot it was
written by (``run_id`` of ``INFO server``).

* **Missing** (a flush, a restart without persistence, a server the library never used)
  or **written by another boot** (a restart that loaded a snapshot, a failover, a slot
  that moved): the state may be stale. The marker is written afresh for this boot, and a
  quiet period starts: nothing is granted until every grant that may still be held
  elsewhere has lapsed.
* **This boot's**: the state is this boot's own, granted by it or confirmed since.

**The quiet period** lasts, for each caller, its own ttl plus :data:`TICK` of quiet time,
counted from when the marker was (re)written. Quiet time is not the wall clock: each
script call adds the server time since the previous call, but at most ``TICK`` (1 s), so
a forward step of the server clock shortens the period by one tick at most (the extra
tick covers it), and a backward step lengthens it. Waiters re-try at least every second
while it lasts, so quiet time keeps up with real time; when nobody asks for a while, the
period is counted from the next caller on, which only costs availability. A holder whose
grant predates the loss renewed it last before the loss, so its local deadline (within
its ttl of that renewal, see ``renewal.py``) has passed once the period is over: the
holders of different objects should therefore use the same ttl for the same object, as
the docs ask.

A boot that whoever started it *vouches for* as new (``SET lovely-coordinator:fresh-boot
<run_id>``: nothing granted before it is held anywhere; several run ids, separated by
spaces, for the nodes of a Cluster) has no quiet period: a script that reports one names
the marker's generation (``<run_id>:<gen>``), the client reads the key, and passes that
token back if the boot is vouched for (see ``boot.py``). A token names one generation, so
a marker written afresh (a flush) is never vouched for by a token found before it; the
call that writes it never is. (A bare run id vouches for the whole boot: the scripts'
tests use it.)

**Fences** after a loss: the next token is still the larger of the counter plus one and
the server time in microseconds (``scripts.py``), and every renewal reports the holder's
fence, which raises the counter to it. A live holder renews at least once during the quiet
period (every ``ttl / 3``), so the first grant after it mints above every fence still
held, even on a new primary whose clock is behind the old one's and whose counter is old.
"""

from __future__ import annotations

from typing import Final

import redis.asyncio

from .cluster import Client, slot_marker

__all__ = ["GENERATION_LUA", "MARKER_KEY", "TICK_MS", "marker_key"]

# The marker of a standalone server (one per server, whatever the prefix: a new prefix on
# a server that kept its state is granted at once).
MARKER_KEY: Final = "lovely-coordinator:generation"

TICK_MS: Final = 1000  # the most quiet time one script call may add (see above)

_VOUCHED_MS: Final = 10**13  # quiet time that outlasts any ttl (ttls are below 1e12 ms)


def marker_key(client: Client, base: str) -> str:
    """The generation marker that the scripts of the object at ``base`` check.

    One per server, or on a Cluster one per slot (in the slot of ``base``, see
    ``cluster.py``); the scripts receive it in ``KEYS`` like the object's own keys.
    """
    if isinstance(client, redis.asyncio.RedisCluster):
        return slot_marker(MARKER_KEY, client, base)
    return MARKER_KEY


# -- generation(marker_key, ttl_ms, vouched) -> ms still to grant nothing (<= 0: none),
#    the generation's token "<run id>:<gen>" (what a client vouches with), the marker's
#    generation id (changes whenever state may be lost).
GENERATION_LUA: Final = f"""
local function generation(marker_key, ttl_ms, vouched)
  local info = redis.call('INFO', 'server')
  local run_id = string.match(info, 'run_id:(%x+)')
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local m = redis.call('HMGET', marker_key, 'run', 'gen', 'done', 'last')
  local gen, done, last = m[2], tonumber(m[3]), tonumber(m[4])
  if m[1] ~= run_id or not done or not last then
    -- No marker, or another boot's: whatever is here may be stale. Quiet time from now.
    gen = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
    done, last = 0, now_ms
    redis.call('HSET', marker_key, 'run', run_id, 'gen', gen)
  end
  done = done + math.min(math.max(now_ms - last, 0), {TICK_MS})
  local token = run_id .. ':' .. gen
  if done < {_VOUCHED_MS} and (vouched == token or vouched == run_id) then
    done = {_VOUCHED_MS}
  end
  redis.call('HSET', marker_key, 'done', string.format('%.0f', done), 'last', now_ms)
  return ttl_ms + {TICK_MS} - done, token, gen
end
"""
