"""The clients the primitives accept, and what differs on a Redis Cluster.

Every primitive takes a ``redis.asyncio.Redis`` (one server) or a
``redis.asyncio.RedisCluster``. On a cluster:

* **Keys.** Each object's keys share one hash tag (``keys.py``), so its scripts run on the
  node that serves its slot; redis-py routes a script by its ``KEYS``.
* **The generation marker** (``generation.py``) is one per *slot*, not per server: a script
  reaches only its own slot's keys. :func:`slot_marker` names it: the server marker's name
  followed by a hash tag that hashes to that slot (found once, see :func:`_slot_tags`).
* **Pub/sub.** Channels that follow an object's slot (a pool's, the gates', a fleet's) are
  *sharded* (``SPUBLISH`` in the scripts, ``SSUBSCRIBE`` here), on a single server too:
  Redis 7 and Valkey 7.2 have both, and one code path serves both kinds of client. A
  locker's channel is one per prefix, not per conversation, so its scripts, which run in
  each conversation's slot, publish classically: a cluster carries that to every node.
  Either way, the subscription of a cluster client is made on a plain client to the node
  that serves the channel's slot (:func:`node_client`), found again after every error.
* **Pipelines.** A fenced read and a confirmed grant send two commands on one connection:
  on a cluster through redis-py's cluster pipeline, which sends the commands for one node
  on one connection, in order (``WAIT`` pinned to the script's node).
"""

from __future__ import annotations

import functools
from typing import Any, Final, TypeAlias

import redis.asyncio
from redis.crc import key_slot

__all__ = [
    "CLIENT_TYPES",
    "Client",
    "encoder",
    "is_cluster",
    "node_client",
    "slot_marker",
]

Client: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster

CLIENT_TYPES: Final = (redis.asyncio.Redis, redis.asyncio.RedisCluster)

_SLOTS: Final = 16384


def is_cluster(client: Client) -> bool:
    """Whether ``client`` is a ``redis.asyncio.RedisCluster``."""
    return isinstance(client, redis.asyncio.RedisCluster)


def encoder(client: Client) -> Any:
    """The client's encoder (redis-py's ``Encoder``; its methods are not typed)."""
    if isinstance(client, redis.asyncio.RedisCluster):
        return client.get_encoder()
    pool: Any = client.connection_pool
    return pool.get_encoder()


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    """For each slot, a short hash tag (a hex number) whose keys hash to that slot.

    Found once per process, on first use by a cluster client: about 170,000 CRC16s of
    short strings (a fraction of a second).
    """
    tags: list[str] = [""] * _SLOTS
    missing = _SLOTS
    number = 0
    while missing:
        tag = format(number, "x")
        slot = key_slot(tag.encode())
        if not tags[slot]:
            tags[slot] = tag
            missing -= 1
        number += 1
    return tuple(tags)


def slot_marker(name: str, client: redis.asyncio.RedisCluster, key: str) -> str:
    """``name{<tag>}``: the marker of the slot that serves ``key`` (its hash tag is a hex
    number, never a kind word of ``keys.py``, so it is no object's key)."""
    return f"{name}{{{_slot_tags()[client.keyslot(key)]}}}"


def node_client(client: redis.asyncio.RedisCluster, key: str) -> redis.asyncio.Redis:
    """A plain client on the primary that serves ``key``'s slot, with the cluster's
    connection options (the caller closes it)."""
    node: Any = client.get_node_from_key(key)
    pool = redis.asyncio.ConnectionPool(
        connection_class=node.connection_class, **node.connection_kwargs
    )
    return redis.asyncio.Redis.from_pool(pool)
