"""Publication of a coordinator's statistics: ``subscribe`` callbacks and ``watch()`` iterators.

The coordinator calls :meth:`UpdateHub.notify` from its one change point (the
scheduler's change hook, and the registries), synchronously, inside the call that
changed something. Nothing is delivered there: a notify only records that the state moved
on (a version counter) and, when someone listens, arranges a delivery on the listener's
event loop (through that loop's thread-safe entry when it runs in another thread).

Deliveries are *level-triggered and coalesced*. A delivery never carries an old value: it
takes a fresh snapshot when it runs, so however many notifies a burst contains, listeners
get at least one snapshot showing the state after the burst, and never a stale one.

* Subscribers get one delivery per event loop turn in which something changed, on the
  loop they subscribed from (a subscription made outside any loop: on the notifying one).
* Each ``watch()`` iterator remembers the version it last yielded and waits on one event
  per loop, shared by all watchers of that loop, which the next notify sets and drops.

A callback is user code: whatever it raises (any ``BaseException``) is logged and
swallowed, since a callback run by the event loop has nobody to raise to, and letting it
escape would take the loop (or trio's run) down.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from contextvars import copy_context
from typing import final

import anyio
import anyio.lowlevel

from .._base.backend import call_soon_on, current_loop
from .._base.types import CoordinatorStatistics

__all__ = ["StatisticsCallback", "UpdateHub", "bind_to_snapshot"]

_log = logging.getLogger("lovely_coordinator")

StatisticsCallback = Callable[[CoordinatorStatistics], object]


def bind_to_snapshot(fn: StatisticsCallback) -> StatisticsCallback:
    """``fn`` bound to a snapshot of the calling context, taken now.

    Every call of the result runs ``fn`` in its *own fresh copy* of that snapshot: it sees
    the context variables as they were at binding, whatever context the call comes from,
    and what one call sets is gone by the next. (``Future.add_done_callback`` instead
    reuses one context for every call; for a callback called again and again, each call
    starting from the same snapshot is the least surprising, and a fresh copy can never be
    "already entered" by a call still running.)
    """
    snapshot = copy_context()

    def bound(statistics: CoordinatorStatistics) -> object:
        return snapshot.copy().run(fn, statistics)

    return bound


@final
class _Subscription:
    """One ``subscribe`` call; its identity is what the matching unsubscribe removes."""

    __slots__ = ("call", "callback", "loop")

    def __init__(self, callback: StatisticsCallback, loop: object | None) -> None:
        self.callback = callback
        self.call = bind_to_snapshot(callback)
        self.loop = loop


@final
class UpdateHub:
    """Fan-out of statistics snapshots to subscribers and watchers.

    Args:
        snapshot: returns the current statistics; called when a delivery runs (never
            inside :meth:`notify`).
        lock: the coordinator's lock (notifies come from any thread holding it).
        on_listening: called (under the lock) whenever :attr:`listening` may have changed,
            so the coordinator notifies only while someone listens.

    Outside a running event loop (for example ``set_max_concurrency`` called at import
    time) a notify cannot schedule anything for subscriptions made outside a loop; the
    change is not lost, because the next delivery snapshots the state that includes it.

    Invariants:
        * ``_version`` counts notifies, which happen on every change while anyone
          listens (a subscription, or a ``watch()`` generator that has started and not
          been closed); a watcher whose last yielded version is below it has something
          new to yield.
        * ``_changed`` maps each loop with a waiting watcher to the unset event that the
          next notify sets (and drops).
        * ``_pending`` holds the loops on which a subscriber delivery is scheduled and has
          not run yet.
    """

    __slots__ = (
        "_changed",
        "_lock",
        "_on_listening",
        "_pending",
        "_snapshot",
        "_subscriptions",
        "_version",
        "_watchers",
    )

    def __init__(
        self,
        snapshot: Callable[[], CoordinatorStatistics],
        lock: threading.RLock,
        on_listening: Callable[[], object] = lambda: None,
    ) -> None:
        self._snapshot = snapshot
        self._lock = lock
        self._on_listening = on_listening
        self._subscriptions: dict[_Subscription, None] = {}  # an insertion-ordered set
        self._changed: dict[object, anyio.Event] = {}
        self._pending: set[object] = set()
        self._version = 0
        self._watchers = 0

    @property
    def listening(self) -> bool:
        """Whether anyone listens: then every change must be notified."""
        return bool(self._subscriptions) or self._watchers > 0

    def notify(self) -> None:
        """Record a state change and schedule its deliveries. Sync, never raises."""
        self._version += 1
        if self._changed:
            changed, self._changed = self._changed, {}
            here = current_loop()
            for loop, event in changed.items():
                if loop is here:
                    event.set()
                else:
                    call_soon_on(loop, event.set)
        if self._subscriptions:
            here = current_loop()
            for subscription in self._subscriptions:
                loop = subscription.loop if subscription.loop is not None else here
                if loop is None or loop in self._pending:
                    continue
                if call_soon_on(loop, functools.partial(self._deliver, loop)):
                    self._pending.add(loop)

    def subscribe(self, callback: StatisticsCallback) -> Callable[[], None]:
        """Call ``callback(statistics)`` after changes, on the event loop, coalesced.

        The callback must be synchronous; whatever it raises is logged and swallowed.
        Each call runs in a fresh copy of the contextvars context this ``subscribe`` was
        called in, on the loop it was called on. Subscribing the same callback twice
        makes two independent subscriptions.

        Returns:
            An idempotent unsubscribe that ends this subscription only.
        """
        subscription = _Subscription(callback, current_loop())
        with self._lock:
            self._subscriptions[subscription] = None
            self._on_listening()

        def unsubscribe() -> None:
            with self._lock:
                if self._subscriptions.pop(subscription, 0) is None:
                    self._on_listening()

        return unsubscribe

    def _deliver(self, loop: object) -> None:
        with self._lock:
            self._pending.discard(loop)
            targets = [s for s in self._subscriptions if s.loop is loop or s.loop is None]
        if not targets:
            return
        try:
            statistics = self._snapshot()
        except Exception:
            _log.exception("lovely_coordinator: taking a statistics snapshot failed")
            return
        for subscription in targets:
            # A callback may unsubscribe a later one; that one must not be called.
            if subscription not in self._subscriptions:
                continue
            try:
                result = subscription.call(statistics)
            except BaseException:
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
        with self._lock:
            self._watchers += 1
            self._on_listening()
        try:
            seen = self._version
            yield self._snapshot()
            while True:
                if seen == self._version:
                    await self._next_change(seen)
                else:
                    await anyio.lowlevel.checkpoint()
                seen = self._version
                yield self._snapshot()
        finally:
            with self._lock:
                self._watchers -= 1
                self._on_listening()

    async def _next_change(self, seen: int) -> None:
        loop = current_loop()
        with self._lock:
            event = None if self._version != seen else self._changed.get(loop)
            if event is None and self._version == seen:
                event = self._changed[loop] = anyio.Event()
        if event is None:  # changed between the check and now (another thread)
            await anyio.lowlevel.checkpoint()
        else:
            await event.wait()
