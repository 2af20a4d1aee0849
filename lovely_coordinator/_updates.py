"""Publication of a coordinator's statistics: ``subscribe`` callbacks and ``watch()`` iterators.

The coordinator calls :meth:`UpdateHub.notify` after every state change, synchronously,
from inside the scheduling call. Nothing is delivered there: a notify only records that
the state moved on (a version counter) and, when someone listens, arranges a delivery.

Deliveries are *level-triggered and coalesced*. A delivery never carries an old value: it
takes a fresh snapshot when it runs, so however many notifies a burst contains, listeners
get at least one snapshot showing the state after the burst, and never a stale one.

* Subscribers get one ``call_soon`` per event loop turn in which something changed, no
  matter how many subscribers or notifies there are.
* Each ``watch()`` iterator remembers the version it last yielded and waits on one event
  shared by all watchers, which the next notify sets and drops. So notify costs O(1)
  whatever the number of listeners, and a slow consumer simply skips to the latest state.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncGenerator, Callable
from typing import final

import anyio
import anyio.lowlevel

from ._backend import call_soon, current_loop
from ._context import bind_to_snapshot
from ._types import CoordinatorStatistics

__all__ = ["StatisticsCallback", "UpdateHub"]

_log = logging.getLogger("lovely_coordinator")

StatisticsCallback = Callable[[CoordinatorStatistics], object]


@final
class _Subscription:
    """One ``subscribe`` call. Its identity is what the matching unsubscribe removes.

    ``call`` is the callback bound to the context of the ``subscribe`` call.
    """

    __slots__ = ("call", "callback")

    def __init__(self, callback: StatisticsCallback) -> None:
        self.callback = callback
        self.call = bind_to_snapshot(callback)


@final
class UpdateHub:
    """Fan-out of statistics snapshots to subscribers and watchers.

    Args:
        snapshot: returns the current statistics; called when a delivery runs (never
            inside :meth:`notify`).

    Outside a running event loop (for example ``set_max_concurrency`` called at import
    time) a notify cannot schedule anything, so it delivers nothing; the change is not
    lost, because the next delivery, triggered by a notify inside a loop, snapshots the
    state that includes it.

    Invariants:
        * ``_version`` counts notifies; a watcher whose last yielded version is below it
          has something new to yield.
        * ``_changed`` is either None or an unset event, created on the loop
          ``_changed_on``, that the next notify sets and drops.
        * ``_pending_on`` is the event loop on which a subscriber delivery is scheduled
          and has not run yet, or None. A delivery scheduled on a loop that ended before
          running it does not block deliveries on another loop.
    """

    __slots__ = (
        "_changed",
        "_changed_on",
        "_pending_on",
        "_snapshot",
        "_subscriptions",
        "_version",
    )

    def __init__(self, snapshot: Callable[[], CoordinatorStatistics]) -> None:
        self._snapshot = snapshot
        self._subscriptions: dict[_Subscription, None] = {}  # an insertion-ordered set
        self._changed: anyio.Event | None = None
        self._changed_on: object | None = None
        self._pending_on: object | None = None
        self._version = 0

    def notify(self) -> None:
        """Record a state change and schedule its delivery. Sync, O(1), never raises."""
        self._version += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        if self._subscriptions:
            self._schedule_delivery()

    def _schedule_delivery(self) -> None:
        loop = current_loop()
        if loop is None or loop is self._pending_on:
            return
        try:
            call_soon(self._deliver)
        except RuntimeError:  # the loop is shutting down; nothing can run on it any more
            return
        self._pending_on = loop

    def subscribe(self, callback: StatisticsCallback) -> Callable[[], None]:
        """Call ``callback(statistics)`` after changes, on the event loop, coalesced.

        The callback must be synchronous; exceptions it raises are logged and swallowed.
        Each call runs in a fresh copy of the contextvars context this ``subscribe`` was
        called in (see :func:`~lovely_coordinator._context.bind_to_snapshot`).
        Subscribing the same callback twice makes two independent subscriptions.

        Returns:
            An idempotent unsubscribe that ends this subscription only.
        """
        subscription = _Subscription(callback)
        self._subscriptions[subscription] = None

        def unsubscribe() -> None:
            self._subscriptions.pop(subscription, None)

        return unsubscribe

    def _deliver(self) -> None:
        self._pending_on = None
        if not self._subscriptions:
            return
        try:
            statistics = self._snapshot()
        except Exception:
            _log.exception("lovely_coordinator: taking a statistics snapshot failed")
            return
        for subscription in list(self._subscriptions):
            # A callback may unsubscribe a later one; that one must not be called.
            if subscription not in self._subscriptions:
                continue
            try:
                result = subscription.call(statistics)
            except Exception:
                _log.exception(
                    "lovely_coordinator: statistics callback %r failed", subscription.callback
                )
                continue
            if inspect.iscoroutine(result):
                result.close()  # never awaited: close it rather than leak a warning
                _log.error(
                    "lovely_coordinator: statistics callback %r is async; subscribe() "
                    "takes a plain function",
                    subscription.callback,
                )

    async def watch(self) -> AsyncGenerator[CoordinatorStatistics]:
        """Yield the current statistics, then the latest statistics after each change.

        Changes that happen while the consumer is busy are coalesced into the next item.
        The iterator never ends by itself: cancel the consuming scope, or leave the loop
        inside ``async with contextlib.aclosing(coord.watch()) as updates:`` (which trio
        asks of every async generator left early). Closing it leaves nothing registered.
        """
        seen = self._version
        yield self._snapshot()
        while True:
            if seen == self._version:
                await self._next_change()
            else:
                await anyio.lowlevel.checkpoint()
            seen = self._version
            yield self._snapshot()

    async def _next_change(self) -> None:
        loop = current_loop()
        if self._changed is None or self._changed_on is not loop:
            # An event left by a loop that has ended cannot be awaited on this one.
            self._changed, self._changed_on = anyio.Event(), loop
        await self._changed.wait()
