"""Coordination across server replicas on Redis >= 7 or Valkey >= 8 (asyncio-only).

Needs the ``redis`` extra (redis-py's asyncio client, with hiredis)::

    client = redis.asyncio.Redis.from_url(url)
    async with TurnRegistry(locker=RedisLocker(client)) as turns: ...

* :class:`RedisLocker` / :class:`RedisLease`: per-conversation leases with fencing tokens.
* :class:`FencedLog` / :class:`StaleFenceError`: a store that refuses stale holders' writes.
* :class:`RedisGates`: provider/model gates shared by every replica's coordinator.
* :class:`RedisPermitPool`: a cluster-wide FIFO cap.
"""

from ._errors import StaleFenceError as StaleFenceError
from ._redis.fenced_log import FencedLog as FencedLog
from ._redis.gates import RedisGates as RedisGates
from ._redis.locker import RedisLease as RedisLease
from ._redis.locker import RedisLocker as RedisLocker
from ._redis.permit_pool import RedisPermit as RedisPermit
from ._redis.permit_pool import RedisPermitPool as RedisPermitPool

__all__ = [
    "FencedLog",
    "RedisGates",
    "RedisLease",
    "RedisLocker",
    "RedisPermit",
    "RedisPermitPool",
    "StaleFenceError",
]
