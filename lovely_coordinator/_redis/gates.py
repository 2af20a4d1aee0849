"""Provider/model gates shared by every replica: :class:`RedisGates`.

One replica that sees a 429 closes ``(provider, model)`` for all of them. State lives in
one sorted set, member ``provider NUL model`` scored by its reopen time on the *Redis*
clock (``P{gates}:closed``), changed only by scripts: a close keeps the later of the two
reopen times, so no replica can shorten a closure. Each change is published on
``P{gates}:events`` as the *remaining* time, which a replica adds to its own clock, so no
two clocks are ever compared (delivery delay can only lengthen a local closure).

Pub/sub loses messages while a connection is down, so each replica also resyncs: on
start (inside ``__aenter__``), after every resubscription, and every ``resync_interval``
seconds. Gates only make the scheduler efficient (the provider enforces its own limit),
so when Redis is unreachable a replica keeps gating on its own: ``close_tuple`` still
closes the local coordinator, and pushes the closure to Redis at the next resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from types import TracebackType
from typing import Any, Final, Protocol, final

import anyio
from redis.exceptions import RedisError

from .._errors import InvalidArgumentError, InvalidArgumentTypeError
from .._types import ModelTuple, ModelTupleLike, as_model_tuple
from . import scripts
from .subscriber import Subscriber, text
from .validation import check_prefix

__all__ = ["GateTarget", "RedisGates"]

_log = logging.getLogger("lovely_coordinator.redis")

OP_TIMEOUT: Final = 2.0  # seconds a gate call may wait for Redis before gating alone
RETRY_INTERVAL: Final = 1.0  # seconds between resync attempts while Redis is unreachable


class GateTarget(Protocol):
    """The part of :class:`~lovely_coordinator.AgentCoordinator` that gates drive."""

    def close_tuple(self, t: ModelTupleLike, *, reopen_after: float | None = None) -> None: ...

    def open_tuple(self, t: ModelTupleLike) -> None: ...

    def is_tuple_open(self, t: ModelTupleLike) -> bool: ...

    def tuple_reopens_at(self, t: ModelTupleLike) -> float | None: ...


def _member(t: ModelTuple) -> str:
    return f"{t.provider}\x00{t.model}"


def _tuple(member: str) -> ModelTuple:
    provider, _, model = member.partition("\x00")
    return ModelTuple(provider, model)


@final
class RedisGates:
    """Keeps every replica's coordinator gates in step through Redis.

    Args:
        client: a ``redis.asyncio.Redis``.
        coordinator: this replica's coordinator.
        prefix: namespace of the keys and channel.
        resync_interval: seconds between periodic full resyncs.

    Use it as an async context manager; the first resync completes inside
    ``__aenter__`` (which raises the client's error if Redis cannot be reached then).

    Raises:
        InvalidArgumentError: ``resync_interval`` is not a finite number > 0, or
            ``prefix`` not a string.
    """

    def __init__(
        self,
        client: Any,
        coordinator: GateTarget,
        *,
        prefix: str = "lovely:",
        resync_interval: float = 10.0,
    ) -> None:
        if isinstance(resync_interval, bool) or not isinstance(resync_interval, int | float):
            raise InvalidArgumentTypeError("resync_interval must be a positive number of seconds")
        if not (math.isfinite(resync_interval) and resync_interval > 0):
            raise InvalidArgumentError("resync_interval must be a positive number of seconds")
        self._client = client
        self._coordinator = coordinator
        prefix = check_prefix(prefix)
        self._key = f"{prefix}{{gates}}:closed"
        self._channel = f"{prefix}{{gates}}:events"
        self._resync_interval = float(resync_interval)
        self._close_script = client.register_script(scripts.GATE_CLOSE)
        self._open_script = client.register_script(scripts.GATE_OPEN)
        self._state_script = client.register_script(scripts.GATE_STATE)
        self._subscriber = Subscriber(client, self._channel, self._on_message, self._on_reset)
        # Local reopen times (anyio clock) this object set from Redis, so a resync can tell
        # its own stale closures from closures made locally by someone else.
        self._applied: dict[ModelTuple, float] = {}
        # Closures that could not reach Redis, pushed at the next resync.
        self._unsynced: dict[ModelTuple, float] = {}
        self._resync_requested = anyio.Event()
        self._stack: contextlib.AsyncExitStack | None = None
        self.resyncs = 0  # completed resyncs, for tests and monitoring

    async def __aenter__(self) -> RedisGates:
        if self._stack is not None:
            raise RuntimeError("this RedisGates is already entered")
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self._subscriber.active())
            await self._resync()
            # A task of its own rather than a task group, so that entering and leaving may
            # happen in different tasks (as in a framework's lifespan hooks).
            scope = anyio.CancelScope()
            task = asyncio.create_task(self._resync_loop(scope))

            async def stop() -> None:
                scope.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.wait([task])

            stack.push_async_callback(stop)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def close_tuple(self, t: ModelTupleLike, reopen_after: float) -> None:
        """Close ``t`` on every replica for ``reopen_after`` seconds (never shortening).

        The local coordinator is closed before this returns; the others follow within a
        fraction of a second. If Redis cannot be reached, the closure stays local and is
        shared at the next resync.

        Raises:
            InvalidArgumentError: a bad tuple, or ``reopen_after`` not a finite number >= 0.
        """
        model_tuple = as_model_tuple(t)
        self._coordinator.close_tuple(model_tuple, reopen_after=reopen_after)  # validates
        local_until = anyio.current_time() + reopen_after
        try:
            with anyio.fail_after(OP_TIMEOUT):
                remaining_ms = await self._close_script(
                    [self._key],
                    [_member(model_tuple), math.ceil(reopen_after * 1000), self._channel],
                )
        except (RedisError, OSError, TimeoutError) as exc:
            _log.warning("closing %s: Redis unreachable (%r); gating locally", model_tuple, exc)
            self._unsynced[model_tuple] = max(self._unsynced.get(model_tuple, 0.0), local_until)
            return
        self._apply_close(model_tuple, int(remaining_ms) / 1000)

    async def open_tuple(self, t: ModelTupleLike) -> None:
        """Open ``t`` on every replica (the local coordinator before this returns).

        Raises:
            InvalidArgumentError: a bad tuple.
        """
        model_tuple = as_model_tuple(t)
        self._coordinator.open_tuple(model_tuple)
        self._applied.pop(model_tuple, None)
        self._unsynced.pop(model_tuple, None)
        try:
            with anyio.fail_after(OP_TIMEOUT):
                await self._open_script([self._key], [_member(model_tuple), self._channel])
        except (RedisError, OSError, TimeoutError) as exc:
            _log.warning("opening %s: Redis unreachable (%r); opened locally", model_tuple, exc)

    def _apply_close(self, t: ModelTuple, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self._coordinator.close_tuple(t, reopen_after=seconds)
        # What was asked for (read after the call, so never below the coordinator's own
        # deadline for it), not what the coordinator kept: a longer closure made locally
        # by someone else must not be mistaken for this object's.
        until = anyio.current_time() + seconds
        self._applied[t] = max(self._applied.get(t, until), until)

    def _on_message(self, message: str) -> None:
        kind, _, rest = message.partition(" ")
        if kind == "c":
            remaining_ms, _, member = rest.partition(" ")
            self._apply_close(_tuple(member), int(remaining_ms) / 1000)
        elif kind == "o":
            t = _tuple(rest)
            self._coordinator.open_tuple(t)
            self._applied.pop(t, None)

    def _on_reset(self) -> None:
        self._resync_requested.set()

    async def _resync_loop(self, scope: anyio.CancelScope) -> None:
        with scope:
            await self._resync_forever()

    async def _resync_forever(self) -> None:
        interval = self._resync_interval
        while True:
            with anyio.move_on_after(interval):
                await self._resync_requested.wait()
            self._resync_requested = anyio.Event()
            try:
                with anyio.fail_after(OP_TIMEOUT):
                    await self._resync()
            except (RedisError, OSError, TimeoutError) as exc:
                _log.debug("gate resync failed: %r", exc)
                interval = min(RETRY_INTERVAL, self._resync_interval)
            except Exception:  # a background loop must never die quietly
                _log.exception("gate resync failed")
                interval = self._resync_interval
            else:
                interval = self._resync_interval

    async def _resync(self) -> None:
        """Push closures that could not be shared, then make the local gates match Redis."""
        now = anyio.current_time()
        for t, until in list(self._unsynced.items()):
            if until > now:
                await self._close_script(
                    [self._key], [_member(t), math.ceil((until - now) * 1000), self._channel]
                )
            del self._unsynced[t]
        flat = await self._state_script([self._key], [])
        closed: dict[ModelTuple, float] = {}
        for i in range(0, len(flat), 2):
            try:
                closed[_tuple(text(flat[i]))] = int(text(flat[i + 1])) / 1000
            except InvalidArgumentError:
                _log.warning("ignoring a malformed gate %r in %s", flat[i], self._key)
        for t, seconds in closed.items():
            self._apply_close(t, seconds)
        for t, applied_until in list(self._applied.items()):
            if t in closed:
                continue
            # Redis has no closure: it was opened elsewhere (the message was lost) or it
            # ran out. Reopen only a closure this object set; a longer local one stays.
            reopens_at = self._coordinator.tuple_reopens_at(t)
            if reopens_at is not None and reopens_at <= applied_until:
                self._coordinator.open_tuple(t)
            del self._applied[t]
        self.resyncs += 1
