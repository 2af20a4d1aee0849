"""Coordination across server replicas on Redis >= 7 or Valkey >= 7.2 (asyncio-only).

Needs the ``redis`` extra (redis-py's asyncio client, with hiredis)::

    client = redis.asyncio.Redis.from_url(url, retry=Retry(ExponentialWithJitterBackoff(), 3))
    async with TurnRegistry(locker=RedisLocker(client)) as turns: ...

* :class:`RedisLocker` / :class:`RedisLease`: per-conversation leases with fencing tokens.
* :class:`FencedLog` / :class:`StaleFenceError`: a store that refuses stale holders' writes,
  with fenced reads (``entries(fence=f)``, ``claim(f)``) for read-modify-writes.
* :class:`RedisGates`: provider/model gates shared by every replica's coordinator.
* :class:`RedisPermitPool` / :class:`RedisPermit`: a cluster-wide FIFO cap.
* :class:`RedisFleet` / :class:`FleetStatistics`: budgets, tuple limits and gates shared by
  every process's ``coordinator.request()`` (one atomic admission per request).
* :class:`UnsupportedServerError`: the server is older than Redis 7.0 / Valkey 7.2.

**Retries.** ``Redis.from_url()`` clients of redis-py 8 do not retry a command at all (a
``Redis(host=...)`` client retries up to 10 times), so the first command after a server
restart or a dropped connection fails; pass ``retry=`` as above (from
``redis.asyncio.retry`` and ``redis.backoff``). The scripts are written so that a retried
command never acts twice.

**Lost state.** A server can forget grants whose holders still run: a restart without
persistence, ``FLUSHALL``, a restart from an older snapshot, a failover to a replica that
missed writes. Every script that grants checks a per-server generation marker (the key
``lovely-coordinator:generation``, which names the server boot that wrote it), so any of
these is noticed at the next call, and nothing is granted for a quiet period of the
caller's ttl and a second (logged at WARNING); fences keep increasing, and the gates'
closures are restored by the replicas that know them. A server the library has not used
before waits one quiet period too: to skip it on a server you *know* is new (nothing was
ever granted by an earlier boot), set the key ``lovely-coordinator:fresh-boot`` to the
``run_id`` that ``INFO server`` reports. The marker must not be evicted (a
``maxmemory-policy`` of ``noeviction`` or ``volatile-*``; evicting it costs a quiet period).

**Failover.** ``RedisLocker(..., min_replicas=n)``, ``RedisPermitPool(...,
min_replicas=n)`` and ``RedisFleet(..., min_replicas=n)`` count a grant, and each renewal,
only once ``n`` replicas have it (``WAIT``): a failover to one of them loses no grant. While
fewer acknowledge, acquires keep waiting and holders see ``lost`` by their deadline (a fleet
member treats an unconfirmed heartbeat as Redis being unreachable: ``on_unavailable``).

**Redis Cluster.** Every class takes a ``redis.asyncio.RedisCluster`` as well. Every key
of an object shares one hash tag (its slot), and ids are escaped so that no two objects
ever share a key, whatever characters their prefixes and ids contain. On a cluster the
generation marker is one per slot (``lovely-coordinator:generation{<tag>}``), so a slot
the library has not used waits one quiet period (vouch for a new cluster by putting the
run ids of all its nodes, separated by spaces, in ``lovely-coordinator:fresh-boot``).
Pools, gates and fleets publish on sharded channels (``SPUBLISH``, in their object's slot;
on a single server too); a locker's release notices are classic pub/sub, which a cluster
carries to every node. The scripts read
``INFO server`` (the version once per client; the run id at every grant), so the server
must allow ``INFO`` to the client's user.
"""

from ._base.errors import StaleFenceError as StaleFenceError
from ._base.errors import UnsupportedServerError as UnsupportedServerError
from ._redis.fenced_log import FencedLog as FencedLog
from ._redis.fleet import RedisFleet as RedisFleet
from ._redis.fleet_state import FleetStatistics as FleetStatistics
from ._redis.fleet_state import FleetTupleStatistics as FleetTupleStatistics
from ._redis.gates import RedisGates as RedisGates
from ._redis.locker import RedisLease as RedisLease
from ._redis.locker import RedisLocker as RedisLocker
from ._redis.permit_pool import RedisPermit as RedisPermit
from ._redis.permit_pool import RedisPermitPool as RedisPermitPool

__all__ = [
    "FencedLog",
    "FleetStatistics",
    "FleetTupleStatistics",
    "RedisFleet",
    "RedisGates",
    "RedisLease",
    "RedisLocker",
    "RedisPermit",
    "RedisPermitPool",
    "StaleFenceError",
    "UnsupportedServerError",
]
