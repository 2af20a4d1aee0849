"""The watchdog that keeps a grant (a lease or a permit) alive and says when it is lost.

Timing rule: every deadline is measured on the local monotonic clock from the moment the
grant or renewal request was *sent*. The server set the expiry no earlier than that, so
``sent + ttl`` is a lower bound on the server-side expiry, and ``lost`` is set a little
before it (minus a drift allowance of 1 % of the TTL plus 2 ms, the usual Redlock figure).
The watchdog runs on the event loop on purpose: a stalled loop stalls renewals, the grant
lapses, and the stalled holder finds itself lost when it wakes (a thread would keep
renewing for a holder that makes no progress). For the same reason the watchdog ends with
its event loop: ``asyncio.run()`` cancels it at shutdown like any task, and a cancellation
that redis-py swallows is delivered again (see cancellation.py), so a grant still held
then never keeps the loop alive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import final

import anyio
from redis.exceptions import RedisError

from . import cancellation
from .log import describe, log

__all__ = ["Renewer", "best_effort", "local_deadline"]


async def best_effort(call: Callable[[], Awaitable[object]], bound: float, what: str) -> None:
    """Run a clean-up ``call`` shielded from cancellation, but for at most ``bound`` seconds.

    The bound is the grant's ttl: past it the server forgets the grant by itself, so a hung
    server must not hang the caller forever. Errors are logged, never raised.
    """
    with anyio.move_on_after(bound, shield=True) as scope:
        try:
            await call()
        except Exception as exc:
            # Whatever it is, the grant lapses by itself; the caller (a release, or an
            # acquire already failing with its own exception) must not get this one.
            unexpected = not isinstance(exc, RedisError | OSError)
            log.warning(
                "%s failed (it lapses within its ttl): %s", what, describe(exc), exc_info=unexpected
            )
    if scope.cancelled_caught:
        log.warning("%s got no answer within %s s (it lapses by itself)", what, bound)


def local_deadline(sent_at: float, ttl: float) -> float:
    """The local time by which a grant sent at ``sent_at`` must be renewed or counted lost."""
    return sent_at + ttl - (0.01 * ttl + 0.002)


@final
class Renewer:
    """Renews every ``ttl / 3``; sets :attr:`lost` when a renewal is refused or the deadline passes.

    After a failed attempt (any error, or no answer) it retries every ``ttl / 10`` until the
    deadline. ``renew()`` returns True when the server confirmed the grant is still held.
    """

    def __init__(
        self, ttl: float, sent_at: float, renew: Callable[[], Awaitable[bool]], name: str
    ) -> None:
        self.lost = anyio.Event()
        self._ttl = ttl
        self._renew = renew
        self._name = name
        self._deadline = local_deadline(sent_at, ttl)
        # No task until the first renewal is due: most grants are released before that,
        # and then holding one costs a timer, not a task. (asyncio's loop clock is the
        # anyio clock.) The task is stopped through its anyio scope, never Task.cancel():
        # the anyio scopes inside could otherwise absorb a native cancellation.
        self._task: asyncio.Task[None] | None = None
        self._scope = anyio.CancelScope()
        first_attempt = sent_at + ttl / 3
        self._timer = asyncio.get_running_loop().call_at(first_attempt, self._start, first_attempt)

    def _start(self, first_attempt: float) -> None:
        self._task = asyncio.create_task(self._main(first_attempt))

    async def stop(self) -> None:
        """Stop renewing (idempotent). The grant then lapses unless released."""
        self._timer.cancel()
        if self._task is not None:
            self._scope.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([self._task])

    async def _main(self, first_attempt: float) -> None:
        with self._scope:
            await self._run(first_attempt)

    async def _run(self, next_attempt: float) -> None:
        while True:
            await anyio.sleep_until(min(next_attempt, self._deadline))
            sent = anyio.current_time()
            if sent >= self._deadline:  # the loop stalled past the deadline
                break
            with anyio.move_on_at(self._deadline):
                try:
                    held = await cancellation.call(self._renew())
                except Exception as exc:
                    # Anything, not only a connection error: a watchdog that died here
                    # would leave the grant looking held long after the server dropped it.
                    unexpected = not isinstance(exc, RedisError | OSError)
                    log.warning(
                        "renewing %s failed: %s", self._name, describe(exc), exc_info=unexpected
                    )
                    next_attempt = sent + self._ttl / 10
                    continue
                if not held:
                    break
                self._deadline = local_deadline(sent, self._ttl)
                next_attempt = sent + self._ttl / 3
                continue
            break  # no answer before the deadline
        log.warning("%s is lost: it could not be shown held", self._name)
        self.lost.set()
