"""A cluster-wide FIFO cap: :class:`RedisPermitPool` and :class:`RedisPermit`.

Keys of pool ``N`` under prefix ``P`` (one hash tag, see keys.py)::

    P{pool:N}:holders   zset  permit id -> expiry (ms, server clock); renewed every ttl/3
    P{pool:N}:queue     zset  waiter id -> ticket (its place in line)
    P{pool:N}:waiters   zset  waiter id -> heartbeat expiry (ms); refreshed by every attempt
    P{pool:N}:ticket    the ticket counter (never expires: its absence means lost state)
    P{pool:N}:fence     the last fencing token
    P{pool:N}:grants    hash  permit id -> "fence ticket"
    P{pool:N}:abandoned:<id>    briefly, after the clean-up of an abandoned acquire

and the server's generation marker (see generation.py).

One script decides each attempt (see pool_scripts.py): it first drops expired holders and
waiters, so a dead process's permits and queue places come back, then grants the caller
only if its rank in the queue is below the number of free permits. Grants therefore follow
ticket order, except that the waiters within the free window may win in either order
(never more than ``limit - 1`` places out of line).

Waking: a release (or an abandoned place) publishes the highest ticket that may now be
granted, and each process wakes only its local waiters up to that ticket. Every waiter
also re-checks when the earliest holder is due to expire and at least every
``min(ttl / 3, 1 s)``, which doubles as its heartbeat.
"""

from __future__ import annotations

import contextlib
import functools
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, final

from .._base.validate import as_index
from . import boot, generation, pool_scripts
from .cluster import Client
from .confirm import Confirmation
from .evalsha import Script
from .grant import FENCE_TTL_MS, MAX_RECHECK, Grant, wait_for_grant
from .keys import object_base
from .subscriber import Subscriber, Watch
from .validation import (
    check_client,
    check_key,
    check_min_replicas,
    check_prefix,
    check_sendable,
    check_ttl,
    require_asyncio,
)

__all__ = ["RedisPermit", "RedisPermitPool"]

MAX_LIMIT: Final = 10**9

_KEY_NAMES: Final = ("holders", "queue", "waiters", "ticket", "fence", "grants")


@final
class RedisPermitPool:
    """At most ``limit`` permits held at once across every process sharing ``name``.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` (Redis >= 7 or
            Valkey >= 7.2).
        name: the pool's name; pools with the same name and prefix are one pool. Every
            process should pass the same ``limit`` and ``ttl``.
        limit: the cap, an int from 1 to 1e9.
        ttl: seconds a permit (or a queue place) survives its process; permits renew
            every ``ttl / 3``.
        prefix: namespace of the keys and channel.
        min_replicas: how many replicas must have a grant, and each renewal, before it
            counts (``WAIT``, as for :class:`~lovely_coordinator.redis.RedisLocker`).

    Raises:
        InvalidArgumentError: a bad ``client`` (a ``TypeError`` one), ``name``,
            ``limit`` (an int from 1 to 1e9), ``ttl`` (a number of seconds from 0.01 to
            1e9), ``prefix`` or ``min_replicas`` (an int from 0 to 1000).
        UsageError: constructed under trio (this module is asyncio-only).
    """

    def __init__(
        self,
        client: Client,
        *,
        name: str,
        limit: int,
        ttl: float = 30.0,
        prefix: str = "lovely:",
        min_replicas: int = 0,
    ) -> None:
        self._client = check_client(client)
        check_key(name, "name")
        check_sendable(client, "name", name)
        # Bounded so that the scripts hand the server exact integers (a Lua number as
        # large as 1e20 reaches a command as "1e+20", which the server refuses midway).
        limit = as_index(limit, "limit must be a positive integer up to 1e9", maximum=MAX_LIMIT)
        self._ttl = check_ttl(ttl)
        self._confirm = Confirmation(check_min_replicas(min_replicas), self._ttl)
        self.name = name
        self.limit = limit
        self._ttl_ms = max(1, round(self._ttl * 1000))
        check_sendable(client, "prefix", check_prefix(prefix))
        self._base = base = object_base(prefix, "pool", name)
        self._keys = [f"{base}:{part}" for part in _KEY_NAMES]
        self._marker = generation.marker_key(client, base)
        self._keys.append(self._marker)
        self._channel = f"{base}:released"
        self._acquire_script = Script(client, pool_scripts.POOL_ACQUIRE)
        self._refresh_script = Script(client, pool_scripts.POOL_REFRESH)
        self._leave_script = Script(client, pool_scripts.POOL_LEAVE)
        self._watches: set[Watch] = set()
        self._subscriber = Subscriber(
            client, self._channel, self._on_announce, self._on_reset, sharded=True
        )

    @property
    def ttl(self) -> float:
        return self._ttl

    @contextlib.asynccontextmanager
    async def permit(self) -> AsyncIterator[RedisPermit]:
        """``async with pool.permit() as p:`` acquire, and release on exit (shielded)."""
        permit = await self.acquire()
        try:
            yield permit
        finally:
            await permit.release()

    async def acquire(self) -> RedisPermit:
        """Take a place in line and wait (cancellable) until a permit is granted.

        A cancelled (or failed) acquire gives up its place and, should the server have
        granted it a permit whose reply was lost, that permit too. A grant whose reply
        arrives after its ttl ran out is given back (the place in line is kept) and the
        wait goes on; after a server restart without persistence nothing is granted, not
        even a place, until the quiet period is over.

        Raises:
            UnsupportedServerError: the server is older than Redis 7.0.
            UsageError: called with no asyncio event loop running (under trio).
            redis.exceptions.RedisError: the server could not be reached.
        """
        require_asyncio()
        client = self._client
        await boot.ensure_supported(client)
        permit_id = uuid.uuid4().hex
        keys = [*self._keys, self._tombstone(permit_id)]
        args: list[str | int] = [
            permit_id, self.limit, self._ttl_ms, self._ttl_ms, FENCE_TTL_MS, self._channel
        ]  # fmt: skip

        async def give_back(reply: Sequence[Any]) -> None:
            await self._leave(permit_id, requeue=int(reply[2]))

        async def attempt() -> list[int]:
            reply: list[int] = await self._confirm.grant(
                self._acquire_script,
                keys,
                [*args, boot.vouch(client, self._marker)],
                give_back=give_back,
                what=f"a permit of pool {self.name!r}",
            )
            return reply

        reply, sent = await wait_for_grant(
            attempt,
            self._watching,
            lambda: self._leave(permit_id, abandon=True),
            give_back=give_back,
            on_quiet=functools.partial(
                boot.on_quiet, client, self._marker, f"permit pool {self.name!r}"
            ),
            subscribed=lambda: self._subscriber.subscribed,
            ttl=self._ttl,
            recheck=min(self._ttl / 3, MAX_RECHECK),  # also the waiter's heartbeat
            what=f"acquiring a permit of pool {self.name!r}",
        )
        return RedisPermit(self, permit_id, int(reply[1]), int(reply[2]), sent)

    @contextlib.asynccontextmanager
    async def _watching(self) -> AsyncIterator[Watch]:
        # Woken by every announcement until its ticket is known: an announcement may
        # overtake the reply that tells the ticket.
        watch = Watch(ticket=-math.inf)
        self._watches.add(watch)
        try:
            async with self._subscriber.active():
                yield watch
        finally:
            self._watches.discard(watch)

    def _on_announce(self, message: str) -> None:
        cutoff = int(message)
        for watch in self._watches:
            if watch.ticket <= cutoff:
                watch.event.set()

    def _on_reset(self) -> None:
        for watch in self._watches:
            watch.event.set()

    async def _refresh(self, permit_id: str, fence: int) -> bool:
        """Renew the permit if still held; report its fence either way."""
        args: list[str | int] = [permit_id, self._ttl_ms, fence, FENCE_TTL_MS]
        return await self._confirm.renewal(self._refresh_script, self._keys, args)

    def _tombstone(self, permit_id: str) -> str:
        return f"{self._base}:abandoned:{permit_id}"

    async def _leave(
        self, permit_id: str, *, abandon: bool = False, requeue: int | None = None
    ) -> None:
        """Give back the permit or queue place of ``permit_id``.

        With ``abandon`` (the clean-up of an acquire that gave up), a request of that
        attempt still in flight, which a different connection may deliver after this one,
        is also refused when it arrives (for the pool's ttl). With ``requeue`` (a ticket),
        the permit is given back but the place in line with that ticket is kept.
        """
        await self._leave_script(
            [*self._keys, self._tombstone(permit_id)],
            [
                permit_id,
                self.limit,
                self._channel,
                self._ttl_ms if abandon else 0,
                "" if requeue is None else requeue,
                self._ttl_ms,
            ],
        )


@final
class RedisPermit(Grant):
    """One permit of a :class:`RedisPermitPool`, held until released or lost.

    Attributes:
        fence: a fencing token, strictly greater than every earlier permit's of the pool.
        ticket: the place in line it was granted from (1, 2, 3, ... per pool).
        lost: an :class:`anyio.Event`, set when the permit can no longer be shown held.

    ``await permit.release()`` gives it back (the next in line is woken); idempotent,
    shielded, never raises for a permit that lapsed. An async context manager: leaving
    the block releases it. Renewal stops with the event loop.
    """

    def __init__(
        self, pool: RedisPermitPool, permit_id: str, fence: int, ticket: int, sent_at: float
    ) -> None:
        self.fence = fence
        self.ticket = ticket
        super().__init__(
            ttl=pool.ttl,
            sent_at=sent_at,
            renew=lambda: pool._refresh(permit_id, fence),
            give_back=lambda: pool._leave(permit_id),
            name=f"permit {fence} of pool {pool.name!r}",
        )
