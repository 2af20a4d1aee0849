"""One fleet: budgets, tuple limits and gates shared by every process (CONTRACT §10).

:class:`RedisFleet` is a thin async shell: the decisions are the scripts'
(``fleet_scripts.py``, one atomic step on the server per attempt), the member's life is
``fleet_member.py``, the local fallback is ``fleet_state.Share``, and the composition with
the local coordinator is the admission hook (``lovely_coordinator._admission``, whose
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
import functools
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, Self, final

import anyio

from .. import _admission
from .._controls import _budget
from .._coordinator import AgentCoordinator
from .._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    TupleSuspendedError,
    UsageError,
)
from .._settings import SUSPENDED_MESSAGE
from .._types import ModelTuple, ModelTupleLike, as_model_tuple
from .._validate import as_index
from . import boot, cancellation, fleet_scripts, scripts
from .fleet_member import UNAVAILABLE_ERRORS, Member
from .fleet_state import FleetStatistics, Setting, tag_of
from .grant import MAX_RECHECK
from .log import log
from .renewal import best_effort, local_deadline
from .subscriber import Watch, text
from .validation import (
    check_client,
    check_key,
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
class RedisFleet:
    """Budgets, tuple limits and gates shared across processes (an async context manager).

    While entered, ``coordinator.request()`` for a tuple the fleet governs (one with a
    fleet budget, a fleet tuple limit, or a closed fleet gate) is admitted fleet-wide
    first (see the module docstring and ``CONTRACT §10``); the coordinator's own caps,
    budgets and gates still apply afterwards.

    Args:
        client: a ``redis.asyncio.Redis`` (Redis >= 7 or Valkey >= 7.2).
        coordinator: the process's :class:`~lovely_coordinator.AgentCoordinator`.
        name: the fleet's name; members with the same name and prefix are one fleet.
        ttl: seconds a member's units (requests in flight) survive it; renewed every ttl/3.
        prefix: namespace of the keys and channel.
        on_unavailable: while Redis cannot be reached, ``"local"`` admits at this member's
            last known share of each budget and limit, ``"wait"`` makes requests wait.

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
        self.name = name
        self.coordinator = coordinator
        self._member = Member(
            client, name=name, prefix=prefix, ttl=ttl, on_unavailable=on_unavailable
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lines: dict[ModelTuple, asyncio.Lock] = {}
        self._learning: dict[ModelTuple, _Learned] = {}
        self._learner: asyncio.Task[None] | None = None

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
        await self._stack.aclose()
        if self._learner is not None:
            self._learner.cancel()

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
        flight, queued, budget available, gate); this member's view while Redis cannot
        be reached (``available=False``)."""
        require_asyncio()
        self._entered()
        try:
            return await self._member.refresh()
        except UNAVAILABLE_ERRORS as exc:
            self._member.unavailable(exc)
            return self._member.statistics_offline()

    # -- the admission hook (see _admission.py) --------------------------------------------------

    def governs(self, t: ModelTuple) -> bool:
        return self._member.known.governs(t)

    def learn(
        self,
        t: ModelTuple,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        requests_remaining: float | None,
        tokens_remaining: float | None,
    ) -> None:
        """Teach the fleet's budget what a provider reported (sent in the background; what
        arrives meanwhile is merged: the latest rates, the least remaining)."""
        learned = (requests_per_minute, tokens_per_minute, requests_remaining, tokens_remaining)
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
        if pending is None and self._learner is None:
            self._learner = asyncio.get_running_loop().create_task(self._send_learned())

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

    async def admit(self, t: ModelTuple, tokens: int, *, reject: bool) -> _Unit | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise UsageError(
                "a RedisFleet admits requests only on the asyncio event loop it was entered on"
            )
        member = self._member
        tag = tag_of(t)
        unit = _Unit(self, t, tag, uuid.uuid4().hex, tokens)
        line = self._lines.get(t)
        if line is None:
            line = self._lines[t] = asyncio.Lock()
        async with line:  # the first attempts of one tuple leave in the order they came
            reply = await self._attempt(unit, reject)
        if isinstance(reply, _Offline):
            if reply.wait == 0:
                return unit.granted()
        elif int(reply[0]) == scripts.GRANTED:
            return unit.granted()
        elif int(reply[0]) == fleet_scripts.UNGOVERNED:
            member.known.put(t, Setting())
            return None
        permit = self.coordinator.current_permit()
        wait = functools.partial(self._wait, unit, reject, reply)
        if permit is None or permit.state != "held":
            return await wait()
        got: list[_Unit | None] = []

        async def lent() -> None:
            got.append(await wait())

        try:
            await permit.lend(lent)
        except BaseException:
            if got and got[0] is not None:
                await _admission.give_back(got[0], used=False)
            raise
        return got[0]

    async def _attempt(self, unit: _Unit, reject: bool) -> Sequence[Any] | _Offline:
        """One admission attempt: the script's reply, or what to do while Redis is
        unreachable."""
        member = self._member
        if not member.available:
            return self._locally(unit, reject)
        keys = member.keys(unit.tag)
        unit.sent = anyio.current_time()
        try:
            return await cancellation.call(
                member.admit(
                    [member.epoch_key, keys["cfg"], keys["bucket"], keys["quiet"], keys["holders"],
                     keys["charges"], keys["queue"], keys["waiters"], keys["needs"], keys["ticket"],
                     member.tombstone(unit.tag, unit.id)],
                    [unit.id, unit.tokens, member.ttl_ms, member.ttl_ms, member.channel, unit.tag,
                     boot.fresh_run_id(member.client)],
                )
            )  # fmt: skip
        except UNAVAILABLE_ERRORS as exc:
            member.unavailable(exc)
            return self._locally(unit, reject)

    def _locally(self, unit: _Unit, reject: bool) -> _Offline:
        member = self._member
        if member.on_unavailable == "wait":
            return _Offline(None)
        setting = member.known.get(unit.t)
        if setting.closed_until_ms is not None:
            left = setting.closed_until_ms / 1000 - (time.time() + member.server_offset)
            if left > 0:
                if reject:
                    raise TupleSuspendedError(SUSPENDED_MESSAGE)
                return _Offline(left)
        wait = member.share.try_admit(unit.t, setting, unit.tokens, anyio.current_time())
        if wait == 0:
            unit.local = True
        return _Offline(wait)

    async def _wait(
        self, unit: _Unit, reject: bool, reply: Sequence[Any] | _Offline
    ) -> _Unit | None:
        member = self._member
        watch = Watch(ticket=-math.inf)
        member.watches.setdefault(unit.tag, set()).add(watch)
        recheck = min(member.ttl / 3, MAX_RECHECK)
        try:
            while True:
                if isinstance(reply, _Offline):
                    if reply.wait is None:  # "wait" mode: until Redis is back
                        with anyio.move_on_after(recheck):
                            await member.back.wait()
                    elif reply.wait == 0:
                        return unit.granted()
                    else:
                        with anyio.move_on_after(min(reply.wait, recheck)):
                            await watch.event.wait()
                else:
                    tag = int(reply[0])
                    if tag == scripts.GRANTED:
                        if anyio.current_time() < local_deadline(unit.sent, member.ttl):
                            return unit.granted()
                        log.warning(
                            "fleet %r: a grant arrived after its ttl; given back", self.name
                        )
                        await best_effort(
                            functools.partial(unit.give_back, used=False), member.ttl, "giving back"
                        )
                        unit.reset()
                        wait = 0.0
                    elif tag == fleet_scripts.UNGOVERNED:
                        member.known.put(unit.t, Setting())
                        return None
                    elif tag == fleet_scripts.LOST:
                        await member.restore(member.epoch)
                        if not member.known.governs(unit.t):
                            return None
                        wait = 0.0
                    elif tag == scripts.QUIET:
                        if await boot.on_quiet(
                            member.client, f"fleet {self.name!r}", int(reply[1]), text(reply[2])
                        ):
                            wait = 0.0
                        else:
                            wait = min(int(reply[1]) / 1000, recheck)
                    else:
                        if int(reply[3]) and reject:
                            raise TupleSuspendedError(SUSPENDED_MESSAGE)
                        watch.ticket = int(reply[2])
                        ms = int(reply[1])
                        wait = recheck if ms < 0 else min(ms / 1000, recheck)
                    if wait > 0:
                        with anyio.move_on_after(wait + 0.001):
                            await watch.event.wait()
                watch.reset()
                reply = await self._attempt(unit, reject)
        except BaseException:
            if not unit.local:
                await best_effort(
                    functools.partial(unit.give_back, used=False, abandon=True),
                    member.ttl,
                    f"cleaning up a request of fleet {self.name!r}",
                )
            raise
        finally:
            watches = member.watches.get(unit.tag)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del member.watches[unit.tag]

    def _wake_local(self, tag: str) -> None:
        for watch in self._member.watches.get(tag, ()):
            watch.event.set()


_Learned = tuple[float | None, float | None, float | None, float | None]


def _merge(old: _Learned, new: _Learned) -> _Learned:
    """Two learnings as one: the later rates, the lesser remaining amounts."""

    def least(a: float | None, b: float | None) -> float | None:
        return b if a is None else a if b is None else min(a, b)

    return (
        new[0] if new[0] is not None else old[0],
        new[1] if new[1] is not None else old[1],
        least(old[2], new[2]),
        least(old[3], new[3]),
    )


@dataclass(frozen=True, slots=True)
class _Offline:
    """What an attempt comes to while Redis is unreachable: admitted locally (``wait`` 0),
    wait that many seconds (or until a local unit is released), or (None, "wait" mode)
    wait for Redis."""

    wait: float | None


@final
class _Unit:
    """One request's fleet admission (``_admission.Admitted``): a unit of the tuple, held
    until released; settle() is sent in the background (the latest value wins)."""

    def __init__(
        self, fleet: RedisFleet, t: ModelTuple, tag: str, unit_id: str, tokens: int
    ) -> None:
        self.fleet = fleet
        self.t = t
        self.tag = tag
        self.id = unit_id
        self.tokens = tokens  # the current charge
        self.sent = 0.0
        self.local = False
        self._sending: asyncio.Task[None] | None = None
        self._settled = tokens
        self._done = False

    def reset(self) -> None:
        self.id = uuid.uuid4().hex

    def granted(self) -> _Unit:
        member = self.fleet._member
        if not self.local:
            member.units[self.id] = (self.t, member.keys(self.tag)["holders"])
        return self

    def settle(self, tokens: int) -> None:
        delta = tokens - self.tokens
        self.tokens = tokens
        if self.local:
            self.fleet._member.share.settle(self.t, delta)
            return
        loop = self.fleet._loop
        assert loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._send_soon()
        else:
            loop.call_soon_threadsafe(self._send_soon)

    def _send_soon(self) -> None:
        if self._sending is None and not self._done:
            self._sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        member = self.fleet._member
        keys = member.keys(self.tag)
        try:
            while self._settled != self.tokens and not self._done:
                value = self.tokens
                await member.settle(
                    [keys["cfg"], keys["bucket"], keys["holders"], keys["charges"], keys["queue"]],
                    [self.id, value, member.channel, self.tag],
                )
                self._settled = value
        except UNAVAILABLE_ERRORS as exc:
            log.warning("fleet %r: settling a request failed: %s", self.fleet.name, exc)
        finally:
            self._sending = None

    async def release(self, *, used: bool) -> None:
        await self.give_back(used=used)

    async def give_back(self, *, used: bool, abandon: bool = False) -> None:
        self._done = True
        member = self.fleet._member
        if self.local:
            member.share.release(self.t)
            self.fleet._wake_local(self.tag)
            return
        member.units.pop(self.id, None)
        keys = member.keys(self.tag)
        await best_effort(
            lambda: member.release(
                [keys["cfg"], keys["bucket"], keys["holders"], keys["charges"], keys["queue"],
                 keys["waiters"], keys["needs"], member.tombstone(self.tag, self.id)],
                [self.id, self.tokens, 1 if used else 0, f"{member.channel}\n{self.tag}",
                 member.ttl_ms if abandon else 0],
            ),
            member.ttl,
            f"releasing a request of fleet {self.fleet.name!r}",
        )  # fmt: skip
