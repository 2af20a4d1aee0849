"""Per-conversation leases across replicas: :class:`RedisLocker` and :class:`RedisLease`.

Keys for conversation ``C`` under prefix ``P`` (one hash tag, so Redis Cluster works)::

    P{C}:lock      the lease: a per-acquire owner id, expiring after ttl
    P{C}:fence     the last fencing token issued (see scripts.py for why it may expire)
    P{C}:waiting   set by a refused acquire, so that the release knows to publish

and one channel per prefix, ``Preleased``, carrying the conversation id of each release
that somebody was waiting for. A waiter re-checks when a release of its conversation is
announced, when the holder's lease is due to expire (a dead holder announces nothing),
and at least every second in any case, so a lost message only costs latency.
"""

from __future__ import annotations

import contextlib
import uuid
from types import TracebackType
from typing import Any, Final, final

import anyio

from . import scripts
from .renewal import Renewer, best_effort
from .subscriber import Subscriber, Watch
from .validation import check_key, check_ttl

__all__ = ["RedisLease", "RedisLocker"]

FENCE_TTL_MS: Final = 86_400_000  # a day; tokens stay monotonic after it lapses anyway
MAX_RECHECK: Final = 1.0  # seconds a waiter may go without re-checking


@final
class RedisLocker:
    """Serializes each conversation's turns across replicas; implements the turns ``Locker``.

    Args:
        client: a ``redis.asyncio.Redis`` (Redis >= 7 or Valkey >= 8).
        ttl: seconds a lease survives without renewal; it renews every ``ttl / 3``.
        prefix: namespace of every key and channel; lockers with different prefixes are
            independent.

    Raises:
        InvalidArgumentError: ``ttl`` is not a finite number >= 0.01.
    """

    def __init__(self, client: Any, *, ttl: float = 30.0, prefix: str = "lovely:") -> None:
        self._ttl = check_ttl(ttl)
        if not isinstance(prefix, str):
            raise TypeError("prefix must be a string")
        self._client = client
        self._prefix = prefix
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
        keys = self._keys(conversation_id)
        owner = uuid.uuid4().hex
        watch: Watch | None = None
        async with contextlib.AsyncExitStack() as stack:
            try:
                while True:
                    if watch is not None:
                        watch.reset()
                    sent = anyio.current_time()
                    tag, value = await self._acquire_script(
                        keys, [owner, self._ttl_ms, FENCE_TTL_MS]
                    )
                    if tag == scripts.GRANTED:
                        return RedisLease(self, conversation_id, owner, int(value), sent)
                    if tag == scripts.CLOCK_BEHIND:
                        await anyio.sleep(min(int(value) / 1e6, MAX_RECHECK))
                    elif watch is None:
                        # Subscribe, then check again at once: a release may have been
                        # announced before the subscription was in place.
                        watch = stack.enter_context(self._watching(conversation_id))
                        await stack.enter_async_context(self._subscriber.active())
                    else:
                        pttl = int(value)
                        wait = MAX_RECHECK if pttl < 0 else min(pttl / 1000, MAX_RECHECK)
                        with anyio.move_on_after(wait + 0.001):
                            await watch.event.wait()
            except BaseException:
                # The request may have been granted with its reply lost: delete that grant.
                await best_effort(
                    lambda: self._delete(conversation_id, owner),
                    self._ttl,
                    f"cleaning up an abandoned acquire of {conversation_id!r}",
                )
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def _watching(self, conversation_id: str) -> Any:
        watch = Watch()
        self._watches.setdefault(conversation_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches[conversation_id]
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

    async def _delete(self, conversation_id: str, owner: str) -> bool:
        """Compare-and-delete: remove the lease only if ``owner`` holds it."""
        lock_key, _, waiting_key = self._keys(conversation_id)
        deleted = await self._release_script(
            [lock_key, waiting_key], [owner, self._channel, conversation_id]
        )
        return bool(deleted)


@final
class RedisLease:
    """A conversation's lease, held by this replica until released or lost.

    Attributes:
        fence: the fencing token, strictly greater than every earlier token of the same
            conversation (even across a server restart without persistence).
        lost: set when the lease can no longer be shown held: a renewal was refused, or
            none succeeded before the local deadline (always before ``ttl`` has passed
            since the last successful renewal was sent).
        conversation_id: the conversation it serializes.

    An async context manager: leaving the block releases it.
    """

    def __init__(
        self, locker: RedisLocker, conversation_id: str, owner: str, fence: int, sent_at: float
    ) -> None:
        self.conversation_id = conversation_id
        self.fence = fence
        self._locker = locker
        self._owner = owner
        self._released: anyio.Event | None = None
        self._renewer = Renewer(
            locker.ttl,
            sent_at,
            lambda: locker._extend(conversation_id, owner),
            f"the lease on {conversation_id!r} (fence {fence})",
        )
        self.lost = self._renewer.lost

    @property
    def released(self) -> bool:
        return self._released is not None

    async def release(self) -> None:
        """Delete the lease if this replica still holds it; idempotent and shielded.

        Never raises for a lease that already lapsed or was lost. If the server cannot be
        reached the failure is logged and the lease lapses by itself within ``ttl``.
        """
        if self._released is not None:
            await self._released.wait()
            return
        self._released = done = anyio.Event()
        try:
            await self._renewer.stop()
            await best_effort(
                lambda: self._locker._delete(self.conversation_id, self._owner),
                self._locker.ttl,
                f"releasing {self!r}",
            )
        finally:
            done.set()

    async def __aenter__(self) -> RedisLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "lost" if self.lost.is_set() else "held"
        return f"<RedisLease {self.conversation_id!r} fence={self.fence} {state}>"
