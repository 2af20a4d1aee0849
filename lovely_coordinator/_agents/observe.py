"""Seeing a coordinator from outside (CONTRACT §7): statistics, updates, instruments, endpoint.

:class:`CoordinatorObservation` is the part of ``AgentCoordinator``'s API that changes
nothing: ``statistics`` and ``tuple_statistics`` (pure reads), ``subscribe`` and ``watch``
(the changes, delivered by the core's update hub, see ``updates``), ``add_instrument``
(the hooks metrics and tracing libraries use, see ``instruments``) and
``serve_statistics`` (a read-only JSON endpoint, see ``_base/json_endpoint``). The
endpoint's document is ``statistics()`` plus the waiters (``waiting``), both pure reads
taken together under the lock, so they agree.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from time import monotonic
from typing import Final

from .._base.errors import InvalidArgumentError, InvalidArgumentTypeError
from .._base.json_endpoint import serve_document
from .._base.types import CoordinatorStatistics, ModelTupleLike, TupleStatistics, as_model_tuple
from .._base.validate import as_callable, as_index
from .admission import attached
from .core import CoordinatorCore
from .instruments import Dispatch, Instrument
from .statistics import snapshot, tuple_snapshot
from .updates import StatisticsCallback
from .waiting import PER_TUPLE, WaiterStatistics, waiters

__all__ = ["STATISTICS_PATH", "CoordinatorObservation", "document"]

STATISTICS_PATH: Final = "/statistics"
_PORT_MESSAGE: Final = "port must be an integer from 0 to 65535"
_HOST_MESSAGE: Final = "host must be a nonempty string"


class CoordinatorObservation:
    """The observing half of ``AgentCoordinator``'s public API (over its ``_core``)."""

    _core: CoordinatorCore

    def statistics(self) -> CoordinatorStatistics:
        """A snapshot of the scheduling state (one entry per non-idle tuple, sorted).

        A pure read: it changes nothing, and arms or fires no timer.
        """
        return self._core._statistics()

    def tuple_statistics(self, t: ModelTupleLike) -> TupleStatistics | None:
        """One tuple's entry of :meth:`statistics` (None where it would not be listed),
        without building the others: an O(1) pure read, for integrations that look at one
        tuple's budget or cap on every response.

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        core = self._core
        with core._lock:
            state = core._scheduler.tuple_state(model_tuple)
            if state is None:
                return None
            return tuple_snapshot(state, core._clock.now(), core._clock.here_minus_home())

    def subscribe(self, callback: StatisticsCallback) -> Callable[[], None]:
        """Call ``callback(statistics)`` after scheduling changes: asynchronously (never
        inside the scheduling call), coalesced, on the loop it subscribed from; whatever
        it raises is logged and swallowed. It runs in the contextvars context of this
        ``subscribe()`` call (a fresh copy of that snapshot for each call).

        Returns:
            An idempotent unsubscribe that removes this subscription only.

        Raises:
            InvalidArgumentTypeError: ``callback`` is not callable.
        """
        return self._core._hub.subscribe(as_callable(callback, "callback must be callable"))

    def watch(self) -> AsyncGenerator[CoordinatorStatistics]:
        """``async for s in coordinator.watch():`` the current statistics, then the latest
        statistics after each change (coalesced).

        An async generator that never ends by itself: to leave it early, close it, e.g.
        ``async with contextlib.aclosing(coordinator.watch()) as updates:`` (trio asks
        this of every async generator left before it ends).
        """
        return self._core._hub.watch()

    def add_instrument(self, instrument: Instrument) -> Callable[[], None]:
        """Tell ``instrument`` about every wait from now on (see :class:`Instrument`).

        Its hooks are called synchronously inside scheduling calls, under the lock;
        whatever they raise is logged and swallowed. Adding the same instrument twice
        makes two registrations.

        Returns:
            An idempotent remove that ends this registration only.

        Raises:
            InvalidArgumentTypeError: ``instrument`` is not an :class:`Instrument`.
        """
        if not isinstance(instrument, Instrument):
            raise InvalidArgumentTypeError("instrument must be a lovely_coordinator.Instrument")
        token = object()
        with self._core._lock:
            self._set_instruments((*self._instrument_entries(), (token, instrument)))

        def remove() -> None:
            with self._core._lock:
                entries = self._instrument_entries()
                kept = tuple(entry for entry in entries if entry[0] is not token)
                if len(kept) != len(entries):
                    self._set_instruments(kept)

        return remove

    def _instrument_entries(self) -> tuple[tuple[object, Instrument], ...]:
        observer = self._core._scheduler.observer
        return () if observer is None else observer.entries

    def _set_instruments(self, entries: tuple[tuple[object, Instrument], ...]) -> None:
        self._core._scheduler.observer = Dispatch(entries) if entries else None

    def serve_statistics(
        self, host: str = "127.0.0.1", port: int = 0
    ) -> AbstractAsyncContextManager[tuple[str, int]]:
        """``async with coordinator.serve_statistics() as (host, port):`` — a read-only
        JSON view of this coordinator at ``http://host:port/statistics`` while the block
        runs (asyncio and trio).

        ``GET /statistics`` returns the fields of :meth:`statistics` (each tuple as a
        ``[provider, model]`` pair) plus ``waiters``: the first
        ``waiters_per_tuple`` (100) waiters of each tuple in acceptance order, each with
        ``tuple``, ``acceptance_order``, ``waited`` (seconds), ``reason`` (``gate``,
        ``tuple_limit``, ``budget``, ``capacity`` or ``inactive``) and ``kind``; a
        tuple's whole count is its ``queued``. Each request takes a fresh snapshot, O(n)
        in the waiters, that changes nothing. Other methods get 405, other paths 404,
        malformed requests 400, and the server keeps serving: a connection idle for 10 s is
        closed, and past 64 connections at once a new one gets 503. Loopback by default: the
        document names models and counts, nothing else, but is not meant for the
        internet.

        Args:
            host: the address to listen on.
            port: the port; 0 picks a free one (the block gets the one bound).

        Raises:
            InvalidArgumentError: ``host`` is not a nonempty string, or ``port`` not an
                int from 0 to 65535.
            OSError: the address cannot be bound (raised on entering the block).
        """
        if not isinstance(host, str):
            raise InvalidArgumentTypeError(_HOST_MESSAGE)
        if not host:
            raise InvalidArgumentError(_HOST_MESSAGE)
        number = as_index(port, _PORT_MESSAGE, minimum=0)
        if number > 65535:
            raise InvalidArgumentError(_PORT_MESSAGE)
        return self._serve(host, number)

    @asynccontextmanager
    async def _serve(self, host: str, port: int) -> AsyncIterator[tuple[str, int]]:
        async with serve_document(host, port, STATISTICS_PATH, self._document) as address:
            yield address

    def _document(self) -> bytes:
        with self._core._lock:
            statistics = snapshot(self._core._scheduler, self._core._clock, self._core.residents())
            found = waiters(self._core._scheduler, self._core._clock.now(), monotonic())
        content = document(statistics, found)
        hook = attached(self)
        if hook is not None:  # a fleet: its view beside the process's
            content["fleet"] = hook.document()
        return json.dumps(content, allow_nan=False).encode()


def document(statistics: CoordinatorStatistics, found: list[WaiterStatistics]) -> dict[str, object]:
    """The endpoint's JSON document (plain data) for a snapshot and its waiters."""
    return {
        "max_concurrency": statistics.max_concurrency,
        "active": statistics.active,
        "queued": statistics.queued,
        "lent": statistics.lent,
        "residents": statistics.residents,
        "tuples": [_tuple(t) for t in statistics.tuples],
        "waiters": [
            {
                "tuple": list(w.tuple),
                "acceptance_order": w.acceptance_order,
                "waited": round(w.waited, 6),
                "reason": w.reason,
                "kind": w.kind,
            }
            for w in found
        ],
        "waiters_per_tuple": PER_TUPLE,
    }


def _tuple(t: TupleStatistics) -> dict[str, object]:
    return {
        "tuple": list(t.tuple),
        "active": t.active,
        "queued": t.queued,
        "lent": t.lent,
        "limit": t.limit,
        "open": t.open,
        "reopens_at": t.reopens_at,
        "reopens_in": t.reopens_in,
        "requests_available": t.requests_available,
        "tokens_available": t.tokens_available,
    }
