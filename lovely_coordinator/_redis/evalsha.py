"""Calling a Lua script by its SHA1: ``EVALSHA``, and ``SCRIPT LOAD`` on ``NOSCRIPT``.

redis-py's ``register_script`` does the same, and also serves pipelines; without that
(an import, a type check and a tuple copy per call) a call costs some 5 us less, which is
most of what a fenced read costs beyond a plain ``LRANGE``.

**Confirmed calls** (``min_replicas``): :meth:`Script.confirmed` sends the script and then
``WAIT replicas timeout`` on the same connection (a pipeline), so the server answers how
many replicas have acknowledged every write of that connection up to and including the
script's. (``WAIT`` inside a script does not block; sent from another connection it would
wait for that connection's writes.) ``WAIT`` narrows what a failover can lose; it does not
make Redis strongly consistent: a replica that acknowledged may still lose the write if it
crashes before its own persistence catches up. On a Cluster, ``WAIT`` is pinned to the node
of the script's keys: redis-py's cluster pipeline sends one node's commands on one
connection, in order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, final

import redis.asyncio
from redis.exceptions import NoScriptError, RedisError

from .cluster import Client

__all__ = ["Script", "UnconfirmedError"]

Arg = str | int | bytes


class UnconfirmedError(RedisError):
    """Fewer replicas than required acknowledged a write in time (internal: a renewal
    that cannot be confirmed is retried like one that failed)."""


@final
class Script:
    """One script of one client."""

    __slots__ = ("_client", "_source", "sha")

    def __init__(self, client: Client, source: str) -> None:
        self._client = client
        self._source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            return await self._client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # A new server (a restart, a failover) has an empty script cache.
            await self._client.script_load(self._source)
            return await self._client.evalsha(self.sha, len(keys), *keys, *args)

    async def confirmed(
        self, keys: Sequence[str], args: Sequence[Arg], replicas: int, timeout_ms: int
    ) -> tuple[Any, int]:
        """The script's reply, and how many replicas acknowledged its writes (``WAIT``)."""
        for attempt in range(2):
            async with self._client.pipeline(transaction=False) as pipe:
                # (A cluster pipeline blocks its evalsha method, not the command.)
                pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
                if isinstance(self._client, redis.asyncio.RedisCluster):
                    node = self._client.get_node_from_key(keys[0])
                    pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
                else:
                    pipe.execute_command("WAIT", replicas, timeout_ms)
                try:
                    reply, acknowledged = await pipe.execute()
                except NoScriptError:
                    if attempt:
                        raise
                    await self._client.script_load(self._source)
                    continue
            return reply, int(acknowledged)
        raise AssertionError("unreachable")  # pragma: no cover
