"""The clients the primitives accept, and what differs on a Redis Cluster.

Every primitive takes a ``redis.asyncio.Redis`` (one server) or a
``redis.asyncio.RedisCluster``. On a cluster:

* **Keys.** Each object's keys share one hash tag (``keys.py``), so its scripts run on the
  node that serves its slot; redis-py routes a script by its ``KEYS``.
* **The generation marker** (``generation.py``) is one per *slot*, not per server: a script
  reaches only its own slot's keys. :func:`slot_marker` names it: the server marker's name
  followed by a hash tag that hashes to that slot (:func:`slot_tag`).
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
import string
from binascii import crc_hqx
from typing import Any, Final, TypeAlias

import redis.asyncio

__all__ = [
    "CLIENT_TYPES",
    "Client",
    "encoder",
    "is_cluster",
    "node_client",
    "slot_marker",
    "slot_tag",
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


# A slot's tag is found by solving CRC16 (init 0, no final xor: linear over GF(2) for
# messages of one length) in three printable bytes: crc(abc) = crc(a00) ^ crc(0b0) ^
# crc(00c), so for each (a, b) one lookup says which c, if any, completes the slot. Every
# slot has such a tag (the tests check them all); about 50 us each, once per slot.
_ALPHABET: Final = (string.digits + string.ascii_letters + "-_").encode()
_MASK: Final = _SLOTS - 1
_FIRST: Final = {a: crc_hqx(bytes([a, 0, 0]), 0) for a in _ALPHABET}
_SECOND: Final = {b: crc_hqx(bytes([0, b, 0]), 0) for b in _ALPHABET}
_LAST: Final[dict[int, int]] = {}
for _c in _ALPHABET:
    _LAST.setdefault(crc_hqx(bytes([0, 0, _c]), 0) & _MASK, _c)


@functools.cache
def slot_tag(slot: int) -> str:
    """Three letters, digits, ``-`` or ``_`` whose CRC16 is ``slot`` modulo 16384: a hash
    tag of that slot."""
    for a in _ALPHABET:
        for b in _ALPHABET:
            c = _LAST.get((_FIRST[a] ^ _SECOND[b] ^ slot) & _MASK)
            if c is not None:
                return bytes([a, b, c]).decode()
    raise AssertionError(f"no tag for slot {slot}")  # pragma: no cover  (every slot has one)


def slot_marker(name: str, client: redis.asyncio.RedisCluster, key: str) -> str:
    """``name{<tag>}``: the marker of the slot that serves ``key``. Nothing follows its
    closing brace, while every key of an object goes on with ``:<part>`` (``keys.py``),
    so no object's key is a marker."""
    return f"{name}{{{slot_tag(client.keyslot(key))}}}"


def node_client(client: redis.asyncio.RedisCluster, key: str) -> redis.asyncio.Redis:
    """A plain client on the primary that serves ``key``'s slot, with the cluster's
    connection options (the caller closes it)."""
    node: Any = client.get_node_from_key(key)
    pool = redis.asyncio.ConnectionPool(
        connection_class=node.connection_class, **node.connection_kwargs
    )
    return redis.asyncio.Redis.from_pool(pool)
