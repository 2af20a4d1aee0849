"""What leases and permits share: waiting for a grant, holding it, and giving it back.

Waiting: each attempt is one script call; the reply says granted, waiting (with the time
until something held is due to expire), or quiet (the server may have lost grants still
held elsewhere, see scripts.py; with the time until the quiet period ends). A refused
waiter subscribes for wake-ups (and, if it was not subscribed before its attempt, tries
again at once, since a release may have been announced before the subscription was in
place), then re-tries whenever woken, when the holder is due to expire, and at least every
``recheck`` seconds. If the wait ends by any exception while a request may be in flight,
``clean_up`` (shielded, bounded) removes whatever the server may have granted or queued
for this attempt.

No stale grant: a grant is only returned if its ttl, counted from when its request was
*sent*, has not run out by the time the reply is read (the same local deadline the
renewal watchdog keeps). A reply delayed past that would hand the caller a grant the
server may already have given to someone else; it is given back instead, and the wait
goes on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Final, Self

import anyio

from . import cancellation, scripts
from .log import log
from .renewal import Renewer, best_effort, local_deadline
from .subscriber import Watch, text

__all__ = ["FENCE_TTL_MS", "MAX_RECHECK", "Grant", "wait_for_grant"]


FENCE_TTL_MS: Final = 86_400_000  # a day; tokens stay monotonic after it lapses anyway
MAX_RECHECK: Final = 1.0  # seconds a waiter may go without re-checking


async def wait_for_grant(
    attempt: Callable[[], Awaitable[Sequence[Any]]],
    watching: Callable[[], AbstractAsyncContextManager[Watch]],
    clean_up: Callable[[], Awaitable[object]],
    *,
    give_back: Callable[[Sequence[Any]], Awaitable[object]],
    on_quiet: Callable[[int, str], Awaitable[bool]],
    subscribed: Callable[[], bool],
    ttl: float,
    recheck: float,
    what: str,
) -> tuple[Sequence[Any], float]:
    """Attempt until granted; return the granting reply and when its request was sent.

    Args:
        attempt: one script call; its reply starts with ``(tag, value)``.
        watching: registers a :class:`Watch` and keeps the wake-up subscription alive
            while it is entered. A third field in a refusal is the waiter's ticket,
            copied to ``watch.ticket`` (wake-ups may be meant for tickets up to some
            number only).
        clean_up: undoes whatever this attempt may hold on the server.
        give_back: returns the grant of a reply that came too late (see the module
            docstring), keeping the place in line where there is one.
        on_quiet: told of a quiet period (ms left, the generation's token); True if the
            boot turned out to be declared fresh, and the attempt should be made again
            at once.
        subscribed: whether the subscription is already up; then the watch is set
            before the first attempt, which saves the re-try after subscribing.
        ttl: the grant's ttl; also the bound on each clean-up.
        recheck: the longest wait between attempts.
        what: names the attempt in log messages.
    """
    watch: Watch | None = None
    async with contextlib.AsyncExitStack() as stack:
        try:
            if subscribed():
                watch = await stack.enter_async_context(watching())
            while True:
                if watch is not None:
                    watch.reset()  # before the attempt, so no wake-up is missed
                sent = anyio.current_time()
                reply = await cancellation.call(attempt())
                tag, value = int(reply[0]), int(reply[1])
                if tag == scripts.GRANTED:
                    late = anyio.current_time() - local_deadline(sent, ttl)
                    if late < 0:
                        return reply, sent
                    log.warning(
                        "%s: the grant arrived %.3f s after its ttl had run out; given back",
                        what,
                        late,
                    )
                    await best_effort(
                        functools.partial(give_back, reply), ttl, f"giving back ({what})"
                    )
                    continue
                if tag == scripts.QUIET:
                    if await cancellation.call(on_quiet(value, text(reply[2]))):
                        continue
                    wait = min(value / 1000, recheck)
                elif watch is None:
                    # Subscribe, then try again at once: a wake-up may have been
                    # published before the subscription was in place.
                    watch = await stack.enter_async_context(watching())
                    if len(reply) > 2:
                        watch.ticket = int(reply[2])
                    continue
                else:
                    if len(reply) > 2:
                        watch.ticket = int(reply[2])
                    wait = recheck if value < 0 else min(value / 1000, recheck)
                with anyio.move_on_after(wait + 0.001):
                    if watch is None:
                        await anyio.sleep_forever()
                    else:
                        await watch.event.wait()
        except BaseException:
            await best_effort(clean_up, ttl, f"cleaning up after {what}")
            raise
    raise AssertionError("unreachable")  # pragma: no cover


class Grant:
    """A held grant: renewed every ``ttl / 3`` until released or lost.

    Attributes:
        lost: set when the grant can no longer be shown held: a renewal was refused, or
            none succeeded before the local deadline (always before ``ttl`` has passed
            since the last successful renewal was sent).

    An async context manager: leaving the block releases it.
    """

    def __init__(
        self,
        *,
        ttl: float,
        sent_at: float,
        renew: Callable[[], Awaitable[bool]],
        give_back: Callable[[], Awaitable[object]],
        name: str,
    ) -> None:
        self._ttl = ttl
        self._give_back = give_back
        self._name = name
        self._released: anyio.Event | None = None
        self._renewer = Renewer(ttl, sent_at, renew, name)
        self.lost = self._renewer.lost

    @property
    def released(self) -> bool:
        return self._released is not None

    async def release(self) -> None:
        """Give the grant back if still held; idempotent and shielded.

        Never raises for a grant that lapsed or was lost (the server-side delete only
        removes this grant's own entry). If the server cannot be reached the failure is
        logged and the grant lapses by itself within ``ttl``.
        """
        if self._released is not None:
            await self._released.wait()
            return
        self._released = done = anyio.Event()
        try:
            await self._renewer.stop()
            await best_effort(self._give_back, self._ttl, f"releasing {self._name}")
        finally:
            done.set()

    async def __aenter__(self) -> Self:
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
        return f"<{type(self).__name__} {self._name} {state}>"
