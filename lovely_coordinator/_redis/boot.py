"""What each client's server is: its version (checked once) and its current boot.

**Version.** The scripts need Redis >= 7.0 or Valkey >= 7.2 (the first Valkey).
The first call through a client reads ``INFO server`` once and refuses an older server
with :class:`~lovely_coordinator.redis.UnsupportedServerError`, before anything is
written; later calls cost a dictionary lookup.

**Boot.** A server that may have lost state (a flush, a restart, a failover: see
generation.py) grants nothing for a quiet period. A server *known* to be new holds no
grants anywhere, and whoever starts one may say so: ``SET lovely-coordinator:fresh-boot
<run_id>``, with the ``run_id`` of that boot from ``INFO server`` (on a Cluster, the run
ids of its nodes, separated by spaces). A script that reports a quiet period names the
marker's generation, ``<run_id>:<gen>`` (a new ``gen`` whenever the marker is written
afresh, see generation.py); the client then reads that key (once per generation) and, if
it names the boot, passes that token with the object's next calls, which then skip the
quiet period. The vouch is bound to the generation, not only to the boot: a later
``FLUSHALL`` (which deletes the key too) starts another generation, which nobody vouched
for, and a later restart has another run id. (The test and demo servers are declared this
way by ``lovely_coordinator_dev``.) On a Cluster the key lives on one node: a flush of
*another* node of a vouched cluster leaves it in place, so that node's slots are vouched
for again (vouch only for clusters whose nodes are never flushed while in use).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from redis.exceptions import ResponseError

from .._base.errors import UnsupportedServerError
from .cluster import Client
from .keys import FRESH_BOOT_KEY
from .log import log
from .subscriber import text

__all__ = [
    "declared_fresh",
    "ensure_supported",
    "on_quiet",
    "tell_quiet",
    "too_old",
    "vouch",
]


OLDEST_REDIS: Final = (7, 0)
OLDEST_VALKEY: Final = (7, 2)  # the first Valkey release


@dataclass
class _ServerState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    checked: bool = False
    refused: UnsupportedServerError | None = None
    fresh_checked: dict[str, bool] = field(default_factory=dict)  # token -> vouched for
    vouched: dict[str, str] = field(default_factory=dict)  # marker key -> its vouched token
    quiet_told_for: str | None = None


_states: weakref.WeakKeyDictionary[Client, _ServerState] = weakref.WeakKeyDictionary()


def _state(client: Client) -> _ServerState:
    state = _states.get(client)
    if state is None:
        state = _states[client] = _ServerState()
    return state


def _version(value: object) -> tuple[int, ...]:
    parts = []
    for piece in str(value).split("."):
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def too_old(info: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(server name, version)`` if ``INFO server`` describes an unsupported server.

    Valkey (which also reports ``redis_version:7.2.4`` for compatibility) is judged by its
    own version; anything else by ``redis_version``.
    """
    name = str(info.get("server_name") or "redis")
    if name == "valkey":
        version, oldest = str(info.get("valkey_version", "0")), OLDEST_VALKEY
    else:
        version, oldest = str(info.get("redis_version", "0")), OLDEST_REDIS
    if _version(version) >= oldest:
        return None
    return {"redis": "Redis", "valkey": "Valkey"}.get(name, name), version


async def ensure_supported(client: Client) -> None:
    """Refuse a server older than Redis 7.0 / Valkey 7.2 (read once per client, remembered).

    Raises:
        UnsupportedServerError: the server is too old.
        redis.exceptions.RedisError: the server could not be asked.
    """
    state = _state(client)
    if state.checked:
        if state.refused is not None:
            raise state.refused
        return
    async with state.lock:
        if not state.checked:
            found = too_old(await client.info("server"))
            if found is not None:
                state.refused = UnsupportedServerError(*found)
            state.checked = True
    if state.refused is not None:
        raise state.refused


def vouch(client: Client, marker: str) -> str:
    """The token (``<run_id>:<gen>``) found vouched for at generation marker ``marker``,
    for the scripts to skip its quiet period, or ``""``."""
    state = _states.get(client)
    return "" if state is None else state.vouched.get(marker, "")


async def declared_fresh(client: Client, token: str) -> bool:
    """Whether the boot of ``token`` (``<run_id>:<gen>``, or a bare run id) is declared
    fresh now (the key is read once per token).

    A server that refuses the read (an ACL that does not cover the key) declares nothing.
    """
    state = _state(client)
    known = state.fresh_checked.get(token)
    if known is None:
        try:
            value = await client.get(FRESH_BOOT_KEY)
        except ResponseError:
            value = None
        known = value is not None and token.partition(":")[0] in text(value).split()
        state.fresh_checked[token] = known
    return known


async def on_quiet(client: Client, marker: str, what: str, remaining_ms: int, token: str) -> bool:
    """What a waiter does when a script tells it of a quiet period (see ``grant.py``).

    Returns:
        True if the boot of ``token`` was declared fresh: the attempt is to be made again
        at once, vouched (:func:`vouch`). Otherwise the period is logged (:func:`tell_quiet`).
    """
    if await declared_fresh(client, token):
        _state(client).vouched[marker] = token
        return True
    tell_quiet(client, token.partition(":")[0], what, remaining_ms)
    return False


def tell_quiet(client: Client, run_id: str, what: str, remaining_ms: int) -> None:
    """Log a quiet period: once per client and boot at WARNING, then at DEBUG."""
    state = _state(client)
    first = state.quiet_told_for != run_id
    state.quiet_told_for = run_id
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "the Redis server may have lost state (a flush, a restart or a failover) while "
        "grants of %s were still held, so nothing is granted for %.1f s (quiet period)",
        what,
        remaining_ms / 1000,
    )
