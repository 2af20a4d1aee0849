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

A server that restarts without persistence forgets every closure, and a resync that
found the set empty would reopen them all early. So the set carries an epoch
(``P{gates}:epoch``, created with the set, and the server's generation, see
generation.py, which changes on a restart or a failover too): a replica that finds another
epoch than the one it saw before knows the server lost, or may have lost, the set, and
puts back every closure it knows, with the reopen time it had, before it looks at the
state again. Replicas resync within a few seconds of a reconnect, so the closures known to
any live replica are back by then.

A server clock that steps forward ends closures early (reopen times are server time), so a
resync also compares how far the server clock moved since the last one with how far the
replica's own monotonic clock did: more than :data:`STEP_TOLERANCE` ahead, and the replica
re-asserts the closures it knows, with the time it knows they have left, before it reads
the state again. A closure is therefore never shortened by a clock ahead, while a replica
that knows it is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from types import TracebackType
from typing import Any, Final, cast, final

import anyio
from redis.exceptions import RedisError

from .._agents.coordinator import AgentCoordinator
from .._base.errors import InvalidArgumentError, InvalidArgumentTypeError, UsageError
from .._base.types import ModelTuple, ModelTupleLike, as_model_tuple
from .._base.validate import as_seconds
from . import boot, cancellation, gate_scripts, generation
from .cluster import Client
from .evalsha import Script
from .keys import object_base
from .log import describe, log
from .subscriber import Subscriber, text
from .validation import (
    MAX_SECONDS,
    check_client,
    check_prefix,
    check_seconds,
    check_sendable,
    require_asyncio,
)

__all__ = ["RedisGates"]


OP_TIMEOUT: Final = 2.0  # seconds a gate call may wait for Redis before gating alone
RETRY_INTERVAL: Final = 1.0  # seconds between resync attempts while Redis is unreachable
STEP_TOLERANCE: Final = 1.0  # seconds the server clock may gain on ours between resyncs

# What a coordinator of another copy of the library must offer to be driven (it is then
# not an instance of this copy's class, see _agents/process_global.py).
_GATE_METHODS: Final = ("close_tuple", "open_tuple", "is_tuple_open", "tuple_reopens_at")


def _check_coordinator(coordinator: object) -> AgentCoordinator:
    if isinstance(coordinator, AgentCoordinator):
        return coordinator
    if type(coordinator).__name__ == "AgentCoordinator" and all(
        callable(getattr(coordinator, name, None)) for name in _GATE_METHODS
    ):
        return cast(AgentCoordinator, coordinator)
    raise InvalidArgumentTypeError(
        f"coordinator must be an AgentCoordinator, not {type(coordinator).__name__}"
    )


def _member(t: ModelTuple) -> str:
    return f"{t.provider}\x00{t.model}"


def _tuple(member: str) -> ModelTuple:
    provider, _, model = member.partition("\x00")
    return ModelTuple(provider, model)


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)  # rounded up: a closure is never shortened


@final
class RedisGates:
    """Keeps every replica's coordinator gates in step through Redis.

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``.
        coordinator: this replica's :class:`~lovely_coordinator.AgentCoordinator`.
        prefix: namespace of the keys and channel.
        resync_interval: seconds between periodic full resyncs.

    Use it as an async context manager; the first resync completes inside
    ``__aenter__`` (which raises the client's error if Redis cannot be reached then).

    Raises:
        InvalidArgumentError: ``client`` is not an asyncio redis client or
            ``coordinator`` not an ``AgentCoordinator`` (``TypeError`` ones),
            ``resync_interval`` is not a positive number of seconds up to 1e9, or
            ``prefix`` not a string.
        UsageError: constructed under trio (this module is asyncio-only).
    """

    def __init__(
        self,
        client: Client,
        coordinator: AgentCoordinator,
        *,
        prefix: str = "lovely:",
        resync_interval: float = 10.0,
    ) -> None:
        self._client = check_client(client)
        self._coordinator = _check_coordinator(coordinator)
        message = "resync_interval must be a positive number of seconds"
        interval = as_seconds(resync_interval, message, positive=True)
        if interval > MAX_SECONDS:
            raise InvalidArgumentError(message)
        check_sendable(client, "prefix", check_prefix(prefix))
        base = object_base(prefix, "gates")
        self._key = f"{base}:closed"
        self._epoch_key = f"{base}:epoch"
        self._marker = generation.marker_key(client, base)
        self._channel = f"{base}:events"
        self._resync_interval = interval
        self._close_script = Script(client, gate_scripts.GATE_CLOSE)
        self._open_script = Script(client, gate_scripts.GATE_OPEN)
        self._state_script = Script(client, gate_scripts.GATE_STATE)
        self._subscriber = Subscriber(
            client, self._channel, self._on_message, self._on_reset, sharded=True
        )
        # Local reopen times (anyio clock) this object set from Redis, so a resync can tell
        # its own stale closures from closures made locally by someone else, and put them
        # back if the server loses them.
        self._applied: dict[ModelTuple, float] = {}
        # Closures that could not reach Redis, pushed at the next resync.
        self._unsynced: dict[ModelTuple, float] = {}
        self._epoch: str | None = None  # of the gate set, as last read
        # (server time ms, our time s when the request was sent) at the last read of the
        # state: to notice a forward step of the server clock.
        self._clock: tuple[int, float] | None = None
        # While a resync reads the state: the tuples changed meanwhile (by a message or a
        # call), whose news may be newer than the state read, so the resync leaves them be.
        self._touched: set[ModelTuple] | None = None
        self._resync_wanted = False  # messages may have been lost: resync at once
        self._wake: anyio.Event | None = None  # made on the loop (anyio needs one)
        self._stack: contextlib.AsyncExitStack | None = None
        self.resyncs = 0  # completed resyncs, for tests and monitoring

    async def __aenter__(self) -> RedisGates:
        if self._stack is not None:
            raise UsageError("this RedisGates is already entered")
        require_asyncio()
        await boot.ensure_supported(self._client)
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
            InvalidArgumentError: a bad tuple, or ``reopen_after`` not a number of seconds
                from 0 to 1e9 (nothing is closed, locally or in Redis).
            UsageError: called with no asyncio event loop running (under trio).
        """
        model_tuple = as_model_tuple(t)
        check_sendable(self._client, "the model tuple", *model_tuple)
        seconds = check_seconds(reopen_after, "reopen_after")
        require_asyncio()
        self._coordinator.close_tuple(model_tuple, reopen_after=seconds)
        local_until = anyio.current_time() + seconds
        try:
            with anyio.fail_after(OP_TIMEOUT):
                remaining_ms = await self._close_script(
                    [self._key], [_member(model_tuple), _ms(seconds), self._channel]
                )
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning(
                "closing %s: Redis unreachable (%s); gating locally", model_tuple, describe(exc)
            )
            self._keep_for_later(model_tuple, local_until)
            return
        except BaseException:
            # Cancelled (or worse) with the script maybe sent, maybe not: share it at the
            # next resync all the same (a closure that did arrive is kept, not lengthened).
            self._keep_for_later(model_tuple, local_until)
            raise
        self._apply_close(model_tuple, int(remaining_ms) / 1000)

    def _keep_for_later(self, t: ModelTuple, until: float) -> None:
        """Push the closure of ``t`` until ``until`` at the next resync, which is due now."""
        self._unsynced[t] = max(self._unsynced.get(t, 0.0), until)
        self._on_reset()

    async def open_tuple(self, t: ModelTupleLike) -> None:
        """Open ``t`` on every replica (the local coordinator before this returns).

        Raises:
            InvalidArgumentError: a bad tuple.
            UsageError: called with no asyncio event loop running (under trio).
        """
        model_tuple = as_model_tuple(t)
        check_sendable(self._client, "the model tuple", *model_tuple)
        require_asyncio()
        self._coordinator.open_tuple(model_tuple)
        self._touch(model_tuple)
        self._applied.pop(model_tuple, None)
        self._unsynced.pop(model_tuple, None)
        try:
            with anyio.fail_after(OP_TIMEOUT):
                await self._open_script([self._key], [_member(model_tuple), self._channel])
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning(
                "opening %s: Redis unreachable (%s); opened locally", model_tuple, describe(exc)
            )

    def _touch(self, t: ModelTuple) -> None:
        if self._touched is not None:
            self._touched.add(t)

    def _apply_close(self, t: ModelTuple, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self._touch(t)
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
            self._touch(t)
            self._applied.pop(t, None)

    def _on_reset(self) -> None:
        self._resync_wanted = True
        if self._wake is not None:
            self._wake.set()

    async def _resync_loop(self, scope: anyio.CancelScope) -> None:
        with scope:
            await self._resync_forever()

    async def _resync_forever(self) -> None:
        interval = self._resync_interval
        while True:
            if not self._resync_wanted:
                self._wake = anyio.Event()
                with anyio.move_on_after(interval):
                    await self._wake.wait()
            self._resync_wanted = False
            try:
                with anyio.fail_after(OP_TIMEOUT):
                    await cancellation.call(self._resync())
            except (RedisError, OSError, TimeoutError) as exc:
                log.debug("gate resync failed: %s", describe(exc))
                interval = min(RETRY_INTERVAL, self._resync_interval)
            except Exception:  # a background loop must never die quietly
                log.exception("gate resync failed")
                interval = self._resync_interval
            else:
                interval = self._resync_interval

    async def _push(self, closures: dict[ModelTuple, float]) -> None:
        now = anyio.current_time()
        for t, until in closures.items():
            if until > now:
                await self._close_script([self._key], [_member(t), _ms(until - now), self._channel])

    async def _read_state(self) -> tuple[str, float, dict[ModelTuple, float], set[ModelTuple]]:
        """The state, and the tuples changed locally while it was read (see ``_touched``).

        Also how many seconds the server clock gained on ours since the previous read (0
        the first time; negative when it lost).
        """
        touched: set[ModelTuple] = set()
        self._touched = touched
        sent = anyio.current_time()
        try:
            epoch, server_ms, closed = await self._state()
        finally:
            self._touched = None
        gained = 0.0
        if self._clock is not None:
            # The server read its clock after the previous request was sent and before
            # this reply arrived: at most that long passed between its two readings.
            last_server_ms, last_sent = self._clock
            gained = (server_ms - last_server_ms) / 1000 - (anyio.current_time() - last_sent)
        self._clock = (server_ms, sent)
        return epoch, gained, closed, touched

    async def _state(self) -> tuple[str, int, dict[ModelTuple, float]]:
        keys = [self._key, self._epoch_key, self._marker]
        flat: list[Any] = await self._state_script(keys, [])
        closed: dict[ModelTuple, float] = {}
        for i in range(2, len(flat), 2):
            try:
                closed[_tuple(text(flat[i]))] = int(text(flat[i + 1])) / 1000
            except InvalidArgumentError:
                log.warning("ignoring a malformed gate %r in %s", flat[i], self._key)
        return text(flat[0]), int(flat[1]), closed

    async def _resync(self) -> None:
        """Push closures that could not be shared, then make the local gates match Redis."""
        # A copy: a close that fails meanwhile adds to it, and is kept for the next push.
        pending = dict(self._unsynced)
        await self._push(pending)
        for t, until in pending.items():
            if self._unsynced.get(t) == until:
                del self._unsynced[t]
        epoch, gained, closed, touched = await self._read_state()
        lost = self._epoch is not None and epoch != self._epoch
        if lost or gained > STEP_TOLERANCE:
            # The server lost the gate set since the last resync (a restart, a failover),
            # or its clock jumped ahead and ended closures early: put back what this
            # replica knows, never shorter than it was.
            now = anyio.current_time()
            known = {t: until for t, until in self._applied.items() if until > now}
            log.warning(
                "%s; restoring the %d closure(s) this replica knows",
                "the gates in Redis may have been lost (a restart or a failover)"
                if lost
                else f"the Redis server's clock jumped {gained:.1f} s ahead",
                len(known),
            )
            await self._push(known)
            epoch, _, closed, later = await self._read_state()
            touched |= later
        self._epoch = epoch
        # A tuple closed or opened while the state was read was told of news at least as
        # new as the read's (a close after the read would otherwise be reopened here, an
        # open closed again, until the next resync).
        for t, seconds in closed.items():
            if t not in touched:
                self._apply_close(t, seconds)
        for t, applied_until in list(self._applied.items()):
            if t in closed or t in touched:
                continue
            # Redis has no closure: it was opened elsewhere (the message was lost) or it
            # ran out. Reopen only a closure this object set; a longer local one stays.
            reopens_at = self._coordinator.tuple_reopens_at(t)
            if reopens_at is not None and reopens_at <= applied_until:
                self._coordinator.open_tuple(t)
            del self._applied[t]
        self.resyncs += 1
        log.debug("gates resynced: %d closure(s) in Redis", len(closed))
