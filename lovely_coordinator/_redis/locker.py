"""Per-conversation leases across replicas: :class:`RedisLocker` and :class:`RedisLease`.

Keys for conversation ``C`` under prefix ``P`` (one hash tag, see keys.py)::

    P{conv:C}:lock      the lease: "<owner> <token>", the owner unique per acquire call,
                        expiring after ttl
    P{conv:C}:fence     the last fencing token issued (see scripts.py for why it may expire)
    P{conv:C}:waiting   the line: zset owner -> ticket (FIFO: only its head is granted)
    P{conv:C}:beats     zset owner -> heartbeat expiry (ms), renewed by every attempt
    P{conv:C}:ticket    the ticket counter (the line's keys expire once nobody waits)
    P{conv:C}:abandoned:<owner>   briefly, after the clean-up of an abandoned acquire

the server's generation marker (see generation.py), and one channel per prefix,
``P{conv}:released``, carrying the conversation id of each release (or place given up)
while somebody stands in line. A waiter re-checks when a release of its conversation is
announced, when the holder's lease is due to expire (a dead holder announces nothing), and
at least every ``min(ttl / 3, 1 s)`` in any case (which doubles as its heartbeat), so a
lost message only costs latency.

Leases are granted in the order the waiters' first requests reached the server, across
processes: a free lease goes only to the head of the line; a place whose process died
leaves the line when its heartbeat (a ttl) lapses; a holder that releases and asks again
goes to the back.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from typing import final

from . import boot, generation, scripts
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

__all__ = ["RedisLease", "RedisLocker"]


@final
class RedisLocker:
    """Serializes each conversation's turns across replicas; implements the turns ``Locker``.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` (Redis >= 7 or
            Valkey >= 7.2).
        ttl: seconds a lease survives without renewal; it renews every ``ttl / 3``. Every
            replica should use the same ttl for the same prefix.
        prefix: namespace of every key and channel; lockers with different prefixes are
            independent.
        min_replicas: how many replicas must have a grant, and each renewal, before it
            counts (``WAIT``; see the module ``lovely_coordinator.redis``). While fewer
            acknowledge, ``acquire()`` keeps waiting and a holder's renewals fail, so it
            sees ``lost`` by its deadline.

    Raises:
        InvalidArgumentError: ``client`` is not an asyncio redis client (a
            ``TypeError`` one), ``ttl`` is not a number of seconds from 0.01 to 1e9,
            ``prefix`` is not a string, or ``min_replicas`` not an int from 0 to 1000.
        UsageError: constructed under trio (this module is asyncio-only).
    """

    def __init__(
        self,
        client: Client,
        *,
        ttl: float = 30.0,
        prefix: str = "lovely:",
        min_replicas: int = 0,
    ) -> None:
        self._client = check_client(client)
        self._ttl = check_ttl(ttl)
        self._prefix = check_prefix(prefix)
        self._confirm = Confirmation(check_min_replicas(min_replicas), self._ttl)
        check_sendable(client, "prefix", prefix)
        self._ttl_ms = max(1, round(self._ttl * 1000))
        self._channel = f"{object_base(prefix, 'conv')}:released"
        self._acquire_script = Script(client, scripts.LOCK_ACQUIRE)
        self._extend_script = Script(client, scripts.LOCK_EXTEND)
        self._release_script = Script(client, scripts.LOCK_RELEASE)
        self._watches: dict[str, set[Watch]] = {}
        self._subscriber = Subscriber(client, self._channel, self._on_release, self._on_reset)

    @property
    def ttl(self) -> float:
        return self._ttl

    def _base(self, conversation_id: str) -> str:
        return object_base(self._prefix, "conv", conversation_id)

    async def acquire(self, conversation_id: str) -> RedisLease:
        """Wait until this replica holds the conversation's lease, and return it.

        The lease's fencing token is minted in the same atomic step as the grant. If the
        wait is cancelled (or fails) while a request is in flight, the attempt's own lease,
        should the server have granted it, is deleted before the exception propagates. A
        grant whose reply arrives after its ttl ran out is given back, and the wait goes
        on; after a server restart without persistence nothing is granted until the
        quiet period is over (see the module ``lovely_coordinator.redis``).

        Raises:
            InvalidArgumentError: ``conversation_id`` is not a nonempty string, or one
                the client cannot encode.
            UnsupportedServerError: the server is older than Redis 7.0.
            UsageError: called with no asyncio event loop running (under trio).
            redis.exceptions.RedisError: the server could not be reached.
        """
        check_key(conversation_id, "conversation_id")
        check_sendable(self._client, "conversation_id", conversation_id)
        require_asyncio()
        await boot.ensure_supported(self._client)
        owner = uuid.uuid4().hex  # unique per attempt: only this attempt can own it
        base = self._base(conversation_id)
        marker = generation.marker_key(self._client, base)
        keys = [f"{base}:lock", f"{base}:fence", f"{base}:waiting", marker]
        keys += [f"{base}:abandoned:{owner}", f"{base}:beats", f"{base}:ticket"]
        client = self._client

        async def attempt() -> list[int]:
            fresh = boot.vouch(client, marker)
            args: list[str | int] = [owner, self._ttl_ms, FENCE_TTL_MS, fresh, self._ttl_ms]
            reply: list[int] = await self._confirm.grant(
                self._acquire_script,
                keys,
                args,
                give_back=lambda _: self._delete(conversation_id, owner),
                what=f"the lease on {conversation_id!r}",
            )
            return reply

        reply, sent = await wait_for_grant(
            attempt,
            lambda: self._watching(conversation_id),
            lambda: self._delete(conversation_id, owner, abandon=True),
            give_back=lambda _: self._delete(conversation_id, owner),
            on_quiet=functools.partial(
                boot.on_quiet, client, marker, f"conversation {conversation_id!r}"
            ),
            subscribed=lambda: self._subscriber.subscribed,
            ttl=self._ttl,
            recheck=min(self._ttl / 3, MAX_RECHECK),  # also the waiter's heartbeat
            what=f"acquiring {conversation_id!r}",
        )
        lease = RedisLease(self, conversation_id, owner, int(reply[1]), sent)
        lease.ticket = int(reply[2])
        return lease

    @contextlib.asynccontextmanager
    async def _watching(self, conversation_id: str) -> AsyncIterator[Watch]:
        watch = Watch()
        watches = self._watches.setdefault(conversation_id, set())
        watches.add(watch)
        try:
            async with self._subscriber.active():
                yield watch
        finally:
            watches.discard(watch)
            if not watches:
                del self._watches[conversation_id]

    def _on_release(self, conversation_id: str) -> None:
        for watch in self._watches.get(conversation_id, ()):
            watch.event.set()

    def _on_reset(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.event.set()

    async def _extend(self, conversation_id: str, owner: str, fence: int) -> bool:
        """Renew the lease if ``owner`` holds it; report its fence either way."""
        base = self._base(conversation_id)
        keys = [f"{base}:lock", f"{base}:fence"]
        args: list[str | int] = [f"{owner} {fence}", self._ttl_ms, fence, FENCE_TTL_MS]
        return bool(await self._confirm.renewal(self._extend_script, keys, args))

    async def _delete(self, conversation_id: str, owner: str, *, abandon: bool = False) -> bool:
        """Compare-and-delete: remove the lease only if ``owner`` holds it.

        With ``abandon`` (the clean-up of an acquire that gave up), a request of that
        attempt still in flight, which a different connection may deliver after this one,
        is also refused when it arrives (for the lease's ttl).
        """
        base = self._base(conversation_id)
        deleted = await self._release_script(
            [f"{base}:lock", f"{base}:waiting", f"{base}:abandoned:{owner}", f"{base}:beats"],
            [owner, self._channel, conversation_id, self._ttl_ms if abandon else 0],
        )
        return bool(deleted)


@final
class RedisLease(Grant):
    """A conversation's lease, held by this replica until released or lost.

    Attributes:
        fence: the fencing token, strictly greater than every earlier token of the same
            conversation (even across a server restart without persistence).
        ticket: its place in the conversation's line (increasing in the order the
            waiters asked; 0 when the reply that told it was lost and resent).
        conversation_id: the conversation it serializes.
        lost: an :class:`anyio.Event`, set when the lease can no longer be shown held: a
            renewal was refused, or none succeeded before the local deadline (always
            before ``ttl`` has passed since the last successful renewal was sent).

    ``await lease.release()`` deletes the lease only if this replica still holds it; it
    is idempotent, shielded, and never raises for a lease that lapsed. An async context
    manager: leaving the block releases it. Renewal stops with the event loop, so a
    lease still held when ``asyncio.run()`` ends never keeps it running.
    """

    def __init__(
        self, locker: RedisLocker, conversation_id: str, owner: str, fence: int, sent_at: float
    ) -> None:
        self.conversation_id = conversation_id
        self.fence = fence
        self.ticket = 0
        super().__init__(
            ttl=locker.ttl,
            sent_at=sent_at,
            renew=lambda: locker._extend(conversation_id, owner, fence),
            give_back=lambda: locker._delete(conversation_id, owner),
            name=f"the lease on {conversation_id!r} (fence {fence})",
        )
