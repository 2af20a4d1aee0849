"""One fleet: budgets, tuple limits and gates shared by every process (CONTRACT §10).

:class:`RedisFleet` is a thin async shell: the decisions are the scripts'
(``fleet_scripts.py``, one atomic step on the server per attempt), the member's life is
``fleet_member.py``, the local fallback is ``fleet_state.Share``, and the composition with
the local coordinator is the admission hook (``lovely_coordinator._agents.admission``, whose
docstring says how a request waiting on the fleet holds no local slot and keeps its order).

Waiting: an attempt refused by the fleet subscribes for wake-ups on the tuple and re-tries
when woken (a release, a refund, a setting changed), when what it waits for is due (the
reopen instant, the first unit's expiry, the refill instant of its cumulative need), and at
least every ``min(ttl / 3, 1 s)`` (which is also its place's heartbeat): never a polling loop.

What the fleet cannot promise: admission is timed by the server's clock, so a server whose
clock jumps moves refills and reopen instants with it; a failover to a replica that missed
writes, or a restart without persistence, forgets the buckets (they restart *empty*, so
nothing overshoots) and the units (limits wait one quiet period, as in §6); a member
stalled past its ttl loses its units while its calls may still be running at the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Literal, Self, final

import anyio

from .._agents import admission as _admission
from .._agents.controls import _budget
from .._agents.coordinator import AgentCoordinator
from .._base.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    UsageError,
)
from .._base.types import ModelTuple, ModelTupleLike, as_model_tuple
from .._base.validate import as_index
from .fleet_admit import AdmissionListener, FleetAdmission, Unit
from .fleet_member import UNAVAILABLE_ERRORS, Member
from .fleet_state import FleetStatistics, fleet_document
from .renewal import best_effort
from .validation import (
    check_client,
    check_key,
    check_min_replicas,
    check_prefix,
    check_seconds,
    check_sendable,
    check_ttl,
    require_asyncio,
)

__all__ = ["RedisFleet"]

_LIMIT_MESSAGE: Final = "Tuple limit must be a positive integer up to 1e9 or None"
_MODES: Final = ("local", "wait")


@final
class RedisFleet(FleetAdmission):
    """Budgets, tuple limits and gates shared across processes (an async context manager).

    While entered, ``coordinator.request()`` for a tuple the fleet governs (one with a
    fleet budget, a fleet tuple limit, or a closed fleet gate) is admitted fleet-wide
    first (see the module docstring and ``CONTRACT §10``); the coordinator's own caps,
    budgets and gates still apply afterwards.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` (Redis >= 7 or
            Valkey >= 7.2).
        coordinator: the process's :class:`~lovely_coordinator.AgentCoordinator`.
        name: the fleet's name; members with the same name and prefix are one fleet.
        ttl: seconds a member's units (requests in flight) survive it; renewed every ttl/3.
        prefix: namespace of the keys and channel.
        on_unavailable: while Redis cannot be reached, ``"local"`` admits at this member's
            last known share of each budget and limit, ``"wait"`` makes requests wait.
        min_replicas: an admission, and each heartbeat (which renews the units in flight),
            counts only once this many replicas have it (``WAIT``), so a failover to one of
            them loses no unit. An admission fewer acknowledge is given back (its budget
            draw refunded) and the request keeps waiting; a heartbeat fewer acknowledge
            counts as Redis being unreachable (``on_unavailable`` applies until one is
            confirmed again).

    Raises:
        InvalidArgumentError: a bad argument (a ``TypeError`` one for wrong types).
        UsageError: constructed under trio (asyncio-only, like every Redis type).
    """

    def __init__(
        self,
        client: Any,
        coordinator: AgentCoordinator,
        *,
        name: str,
        ttl: float = 30.0,
        prefix: str = "lovely:",
        on_unavailable: Literal["local", "wait"] = "local",
        min_replicas: int = 0,
    ) -> None:
        client = check_client(client)
        if not isinstance(coordinator, AgentCoordinator):
            raise InvalidArgumentTypeError("coordinator must be an AgentCoordinator")
        check_key(name, "name")
        check_sendable(client, "name", name)
        check_sendable(client, "prefix", check_prefix(prefix))
        ttl = check_ttl(ttl)
        if on_unavailable not in _MODES:
            raise InvalidArgumentError('on_unavailable must be "local" or "wait"')
        replicas = check_min_replicas(min_replicas)
        self.name = name
        self.coordinator = coordinator
        self._member = Member(
            client,
            name=name,
            prefix=prefix,
            ttl=ttl,
            on_unavailable=on_unavailable,
            min_replicas=replicas,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lines: dict[ModelTuple, asyncio.Lock] = {}
        self._listeners: list[AdmissionListener] = []
        self._learning: dict[ModelTuple, _Learned] = {}
        self._learner: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._releasing: set[asyncio.Task[None]] = set()
        self._closing = False
        self._left = False

    @property
    def ttl(self) -> float:
        return self._member.ttl

    # -- joining and leaving ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Join: read the settings, subscribe, start the heartbeat, attach to the coordinator.

        Raises:
            UsageError: entered twice, or under trio.
            UnsupportedServerError: the server is older than Redis 7.0.
            redis.exceptions.RedisError: the server could not be reached.
        """
        require_asyncio()
        if self._stack is not None:
            raise UsageError("a RedisFleet can be entered only once")
        member = self._member
        self._loop = asyncio.get_running_loop()
        self._stack = stack = contextlib.AsyncExitStack()
        try:
            await member.join()
            await stack.enter_async_context(member.subscriber.active())
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            tg.start_soon(member.run)
            stack.callback(_admission.attach(self.coordinator, self))
            stack.push_async_callback(self._leave)
        except BaseException:
            await stack.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._stack is not None
        self._closing = True
        try:
            await self._stack.aclose()
        finally:
            tasks = set(self._background)
            with anyio.CancelScope(shield=True):
                if tasks:  # settles and learnings still on their way: a moment to land
                    _, late = await asyncio.wait(tasks, timeout=1.0)
                    for task in late:
                        task.cancel()
                    if late:
                        await asyncio.wait(late)
            self._left = True

    async def _leave(self) -> None:
        await best_effort(self._member.leave, self.ttl, f"leaving fleet {self.name!r}")

    # -- settings --------------------------------------------------------------------------------

    async def set_budget(
        self,
        t: ModelTupleLike,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
    ) -> None:
        """The fleet's budget for ``t`` (same arithmetic as ``AgentCoordinator.set_budget``:
        full when first set, a change keeps what was spent, ``None`` removes a dimension).

        Raises:
            InvalidArgumentError: a bad tuple or amount; nothing changed.
        """
        model_tuple = as_model_tuple(t)
        requests, tokens = _budget(requests_per_minute), _budget(tokens_per_minute)
        await self._change("budget", model_tuple, requests, tokens)

    async def set_tuple_limit(self, t: ModelTupleLike, limit: int | None) -> None:
        """At most ``limit`` requests for ``t`` in flight fleet-wide (``None`` removes it).

        Raises:
            InvalidArgumentError: a bad tuple, or a limit that is not an int from 1 to 1e9.
        """
        model_tuple = as_model_tuple(t)
        value = None if limit is None else as_index(limit, _LIMIT_MESSAGE, maximum=10**9)
        await self._change("limit", model_tuple, value)

    async def close_tuple(self, t: ModelTupleLike, reopen_after: float) -> None:
        """Close ``t``'s fleet gate for ``reopen_after`` seconds (server clock); a closure is
        never shortened. Waiting requests keep their places; running ones are untouched.

        Raises:
            InvalidArgumentError: a bad tuple, or ``reopen_after`` not from 0 to 1e9 s.
        """
        model_tuple = as_model_tuple(t)
        after = check_seconds(reopen_after, "reopen_after")
        await self._change("close", model_tuple, math.ceil(after * 1000))

    async def open_tuple(self, t: ModelTupleLike) -> None:
        """Open ``t``'s fleet gate everywhere (fine on an open one)."""
        await self._change("open", as_model_tuple(t))

    async def _change(self, op: str, t: ModelTuple, *values: object) -> None:
        require_asyncio()
        self._entered()
        await self._member.change(op, t, *values)

    def _entered(self) -> None:
        if self._stack is None:
            raise UsageError("enter the RedisFleet (async with) before using it")

    async def statistics(self) -> FleetStatistics:
        """The fleet as the server sees it (members, and per governed tuple its limit, in
        flight, queued, budget available, gate), after this member's own releases and
        learnings have reached it; this member's view while Redis cannot be reached
        (``available=False``)."""
        require_asyncio()
        self._entered()
        pending = set(self._releasing)  # this member's own releases and learnings: the
        if self._learner is not None:  # view includes them
            pending.add(self._learner)
        if pending:
            await asyncio.wait(pending, timeout=self.ttl)
        try:
            return await self._member.refresh()
        except UNAVAILABLE_ERRORS as exc:
            self._member.unavailable(exc)
            return self._member.statistics_offline()

    # -- the admission hook (see _agents/admission.py) -------------------------------------

    def governs(self, t: ModelTuple) -> bool:
        return self._member.known.governs(t)

    def learn(
        self,
        t: ModelTuple,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        requests_remaining: float | None,
        tokens_remaining: float | None,
        *,
        answering: object | None = None,
    ) -> None:
        """Teach the fleet's budget what a provider reported (sent in the background; what
        arrives meanwhile is merged: the latest rates, the latest remaining amounts).

        ``answering``: the ``ModelRequest`` whose response reported the figures. Its
        admission's marks let the fleet take off what it admitted since, which the
        provider had not counted yet (see ``fleet_scripts.SET``).
        """
        marks: tuple[float | None, float | None, float | None] = (None, None, None)
        unit = getattr(answering, "_outer", None)
        if isinstance(unit, Unit) and unit.fleet is self and unit.admitted_ms is not None:
            marks = (*unit.marks, float(unit.admitted_ms))
        learned = (
            requests_per_minute,
            tokens_per_minute,
            requests_remaining,
            tokens_remaining,
            *marks,
        )
        loop = self._loop
        assert loop is not None
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._learn_soon(t, learned)
        else:
            loop.call_soon_threadsafe(self._learn_soon, t, learned)

    def _learn_soon(self, t: ModelTuple, learned: _Learned) -> None:
        pending = self._learning.get(t)
        if pending is not None:
            learned = _merge(pending, learned)
        self._learning[t] = learned
        if pending is None and self._learner is None and not self._closing:
            self._learner = self._in_background(self._send_learned())

    # -- observing (the endpoint, top, OpenTelemetry) ------------------------------------------

    def latest_statistics(self) -> FleetStatistics:
        """The latest view read (sync, from any thread, never waits): at most about a
        second old when asked for every second; a fresh one is read in the background
        whenever the latest is older than that. (``statistics()`` reads it now.)"""
        member = self._member
        loop = self._loop
        if loop is not None and self._stack is not None:
            stale = member.last_at < loop.time() - 1.0
            if stale and self._refresher is None:
                loop.call_soon_threadsafe(self._refresh_soon)
        return member.last if member.available else member.statistics_offline()

    def add_listener(self, listener: AdmissionListener) -> Callable[[], None]:
        """Call ``listener(tuple, waited, outcome)`` after each fleet admission (``outcome``
        is ``granted``, ``local``, ``rejected`` or ``cancelled``; ``waited`` in seconds),
        on the fleet's loop; what it raises is logged. Returns an idempotent remove."""
        if not callable(listener):
            raise InvalidArgumentTypeError("listener must be callable")
        entry = [listener]
        self._listeners.append(entry[0])

        def remove() -> None:
            if entry:
                self._listeners.remove(entry.pop())

        return remove

    def document(self) -> dict[str, object]:
        """:meth:`latest_statistics` as the statistics endpoint's ``fleet`` field."""
        view = self.latest_statistics()
        return fleet_document(view, time.time() + self._member.server_offset)

    def _refresh_soon(self) -> None:
        if self._refresher is None and not self._closing:
            self._refresher = self._in_background(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.statistics()
        finally:
            self._refresher = None

    async def _send_learned(self) -> None:
        try:
            while self._learning:
                t, learned = self._learning.popitem()
                try:
                    await self._member.change("learn", t, *learned)
                except UNAVAILABLE_ERRORS as exc:
                    self._member.unavailable(exc)
        finally:
            self._learner = None


_Learned = tuple[
    float | None, float | None, float | None, float | None, float | None, float | None, float | None
]


def _merge(old: _Learned, new: _Learned) -> _Learned:
    """Two learnings as one: the later rates, and the later remaining amounts (with their
    marks) where the later one reports any."""
    rates = (new[0] if new[0] is not None else old[0], new[1] if new[1] is not None else old[1])
    left = new[2:] if new[2] is not None or new[3] is not None else old[2:]
    return (*rates, *left)
