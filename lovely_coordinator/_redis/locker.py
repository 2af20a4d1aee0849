"""Per-conversation leases across replicas: :class:`RedisLocker` and :class:`RedisLease`.

Keys for conversation ``C`` under prefix ``P`` (one hash tag, so Redis Cluster works)::

    P{C}:lock      the lease: a per-acquire owner id, expiring after ttl
    P{C}:fence     the last fencing token issued (see scripts.py for why it may expire)
    P{C}:waiting   set by a refused acquire, so that the release knows to publish
    P{C}:abandoned:<owner>   briefly, after the clean-up of an abandoned acquire

and one channel per prefix, ``Preleased``, carrying the conversation id of each release
that somebody was waiting for. A waiter re-checks when a release of its conversation is
announced, when the holder's lease is due to expire (a dead holder announces nothing),
and at least every second in any case, so a lost message only costs latency.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, final

from . import scripts
from .grant import FENCE_TTL_MS, MAX_RECHECK, Grant, wait_for_grant
from .subscriber import Subscriber, Watch
from .validation import check_key, check_prefix, check_ttl

__all__ = ["RedisLease", "RedisLocker"]


@final
class RedisLocker:
    """Serializes each conversation's turns across replicas; implements the turns ``Locker``.

    Args:
        client: a ``redis.asyncio.Redis`` (Redis >= 7 or Valkey >= 8).
        ttl: seconds a lease survives without renewal; it renews every ``ttl / 3``.
        prefix: namespace of every key and channel; lockers with different prefixes are
            independent.

    Raises:
        InvalidArgumentError: ``ttl`` is not a finite number >= 0.01, or ``prefix`` not a
            string.
    """

    def __init__(self, client: Any, *, ttl: float = 30.0, prefix: str = "lovely:") -> None:
        self._ttl = check_ttl(ttl)
        self._client = client
        self._prefix = check_prefix(prefix)
        self._ttl_ms = max(1, round(self._ttl * 1000))
        self._channel = f"{prefix}released"
        self._acquire_script = client.register_script(scripts.LOCK_ACQUIRE)
        self._extend_script = client.register_script(scripts.LOCK_EXTEND)
        self._release_script = client.register_script(scripts.LOCK_RELEASE)
        self._watches: dict[str, set[Watch]] = {}
        self._subscriber = Subscriber(client, self._channel, self._on_release, self._on_reset)

    @property
    def ttl(self) -> float:
        return self._ttl

    def _keys(self, conversation_id: str) -> tuple[str, str, str]:
        base = f"{self._prefix}{{{conversation_id}}}"
        return f"{base}:lock", f"{base}:fence", f"{base}:waiting"

    async def acquire(self, conversation_id: str) -> RedisLease:
        """Wait until this replica holds the conversation's lease, and return it.

        The lease's fencing token is minted in the same atomic step as the grant. If the
        wait is cancelled (or fails) while a request is in flight, the attempt's own lease,
        should the server have granted it, is deleted before the exception propagates.

        Raises:
            InvalidArgumentError: ``conversation_id`` is not a nonempty string.
            redis.exceptions.RedisError: the server could not be reached.
        """
        check_key(conversation_id, "conversation_id")
        owner = uuid.uuid4().hex  # unique per attempt: only this attempt can own it
        keys = (*self._keys(conversation_id), self._tombstone(conversation_id, owner))
        reply, sent = await wait_for_grant(
            lambda: self._acquire_script(keys, [owner, self._ttl_ms, FENCE_TTL_MS]),
            lambda: self._watching(conversation_id),
            lambda: self._delete(conversation_id, owner, abandon=True),
            subscribed=lambda: self._subscriber.subscribed,
            bound=self._ttl,
            recheck=MAX_RECHECK,
            what=f"acquiring {conversation_id!r}",
        )
        return RedisLease(self, conversation_id, owner, int(reply[1]), sent)

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

    async def _extend(self, conversation_id: str, owner: str) -> bool:
        lock_key = self._keys(conversation_id)[0]
        return bool(await self._extend_script([lock_key], [owner, self._ttl_ms]))

    def _tombstone(self, conversation_id: str, owner: str) -> str:
        return f"{self._prefix}{{{conversation_id}}}:abandoned:{owner}"

    async def _delete(self, conversation_id: str, owner: str, *, abandon: bool = False) -> bool:
        """Compare-and-delete: remove the lease only if ``owner`` holds it.

        With ``abandon`` (the clean-up of an acquire that gave up), a request of that
        attempt still in flight, which a different connection may deliver after this one,
        is also refused when it arrives (for the lease's ttl).
        """
        lock_key, _, waiting_key = self._keys(conversation_id)
        deleted = await self._release_script(
            [lock_key, waiting_key, self._tombstone(conversation_id, owner)],
            [owner, self._channel, conversation_id, self._ttl_ms if abandon else 0],
        )
        return bool(deleted)


@final
class RedisLease(Grant):
    """A conversation's lease, held by this replica until released or lost.

    Attributes:
        fence: the fencing token, strictly greater than every earlier token of the same
            conversation (even across a server restart without persistence).
        conversation_id: the conversation it serializes.
        lost: an :class:`anyio.Event`, set when the lease can no longer be shown held: a
            renewal was refused, or none succeeded before the local deadline (always
            before ``ttl`` has passed since the last successful renewal was sent).

    ``await lease.release()`` deletes the lease only if this replica still holds it; it
    is idempotent, shielded, and never raises for a lease that lapsed. An async context
    manager: leaving the block releases it.
    """

    def __init__(
        self, locker: RedisLocker, conversation_id: str, owner: str, fence: int, sent_at: float
    ) -> None:
        self.conversation_id = conversation_id
        self.fence = fence
        super().__init__(
            ttl=locker.ttl,
            sent_at=sent_at,
            renew=lambda: locker._extend(conversation_id, owner),
            give_back=lambda: locker._delete(conversation_id, owner),
            name=f"the lease on {conversation_id!r} (fence {fence})",
        )
