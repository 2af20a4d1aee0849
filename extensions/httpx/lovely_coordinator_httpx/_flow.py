"""What a coordinated transport does around one request, once, for every kind of client.

The transports come in four kinds: async and sync, for ``httpx2`` and for the older
``httpx``. Everything they decide lives here, as one *sans-I/O* flow: a generator that
yields the I/O it needs (:class:`Admit`, :class:`Send`, :class:`Read`, :class:`Discard`)
and is sent back each result (or has each failure thrown in). The shells in ``_gate``
perform the steps: with ``await`` for async clients, blocking for sync ones. So the retry
rules, the settling and the learning are written once, and the kinds cannot drift apart.

One request, from the top:

1. Its tuple (``tuple_for``; ``None``: sent unscheduled) and token estimate.
2. :class:`Admit`: ``coordinator.request(t, tokens=estimate)`` (or its blocking twin
   ``request_sync``): admitted in acceptance order once the gate is open, the budget holds
   it and a slot covers it, within the request's ``pool`` timeout (else httpx's
   ``PoolTimeout``, nothing drawn).
3. :class:`Send`. The response's rate-limit headers teach the handler the budget.
4. A 429: the gate closes (the handler), the call is given back (``settle(0)``, the slot
   released), and the request is admitted again with its first acceptance order, so it
   waits for the reopen at the head of the line, holding no slot, and is sent again;
   after ``max_attempts`` the 429 goes to the caller. No other status is retried. A
   request that joined an enclosing one of the same task (a ``CoordinatedModel`` above
   it) leaves the retry to that layer.
5. Otherwise the response goes to the caller with its body watched: the usage it reports
   (decoded from its ``content-encoding``) settles the charge, and the call ends when the
   body is closed, from whichever task or thread closes it — or when the response object
   is dropped unclosed (a finalizer: the slot comes back, with a warning once).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, final

from lovely_coordinator_limits import (
    Draw,
    ModelRequestLike,
    ProviderLimitHandler,
    UsageMeter,
    is_limit_status,
    retry_delay,
)

from lovely_coordinator import ModelTuple

__all__ = [
    "Admit",
    "Admitted",
    "Call",
    "Discard",
    "Read",
    "ResponseLike",
    "Send",
    "Step",
    "exchange",
    "pool_timeout",
]

_log = logging.getLogger("lovely_coordinator.httpx")

# Error statuses whose body is read to tell a billing or quota refusal from other client
# errors. Server errors (5xx) are never limits, so their bodies are left to the caller.
_CLIENT_ERRORS = range(400, 500)


class ResponseLike(Protocol):
    """The part of an httpx / httpx2 ``Response`` the flow reads."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def is_closed(self) -> bool: ...


ResponseT = TypeVar("ResponseT", bound=ResponseLike)
_ResponseIn = TypeVar("_ResponseIn", bound=ResponseLike, contravariant=True)


# -- the steps ---------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Admit:
    """Enter ``coordinator.request(t, ...)``; the result is an :class:`Admitted`.

    Past ``timeout`` seconds (``None``: no bound) the shell raises httpx's ``PoolTimeout``.
    """

    t: ModelTuple
    tokens: int
    order: int | None
    timeout: float | None


@final
@dataclass(frozen=True, slots=True)
class Admitted:
    """An entered request: the coordinator's model request, and how to leave it (sync:
    the exit of a request context never waits)."""

    request: ModelRequestLike
    leave: Callable[[], None]


@final
@dataclass(frozen=True, slots=True)
class Send:
    """Send the request through the wrapped transport; the result is the response."""


@final
@dataclass(frozen=True, slots=True)
class Read:
    """Read ``response``'s whole body (an error's: small); reading closes it."""

    response: Any


@final
@dataclass(frozen=True, slots=True)
class Discard:
    """Close ``response`` unread (shielded from cancellation)."""

    response: Any


Step = Admit | Send | Read | Discard


def pool_timeout(request: object) -> float | None:
    """The request's ``pool`` timeout (httpx's ``request.extensions["timeout"]``)."""
    extensions = getattr(request, "extensions", None)
    timeouts = extensions.get("timeout") if isinstance(extensions, Mapping) else None
    pool = timeouts.get("pool") if isinstance(timeouts, Mapping) else None
    if isinstance(pool, int | float) and not isinstance(pool, bool) and pool >= 0:
        return float(pool)
    return None


# -- one admitted attempt ------------------------------------------------------------------------


@final
class Call:
    """One admitted attempt: its request context, its draw, the usage of its body.

    :meth:`close` runs once, from whichever task or thread ends the attempt (the one that
    closes a streamed body, or the finalizer of a response dropped unclosed): it settles
    the charge from the usage read, stops tracking the draw if this layer owns it, and
    leaves the request context. It never waits.
    """

    __slots__ = ("_closed", "_finalizer", "_handler", "_leave", "_meter", "draw")
    _warned = False  # the warning about dropped responses is logged once per process

    def __init__(
        self, leave: Callable[[], None], draw: Draw, owner: bool, handler: ProviderLimitHandler
    ) -> None:
        self._leave = leave
        self.draw = draw
        self._handler = handler if owner else None
        self._meter: UsageMeter | None = None
        self._closed = False
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def meter(self, headers: Mapping[str, str]) -> UsageMeter:
        """Start reading the body's usage, for a response with these headers."""
        self._meter = UsageMeter(
            headers.get("content-type", ""), headers.get("content-encoding", "")
        )
        return self._meter

    def guard(self, response: object) -> None:
        """End the call if ``response`` is freed before its body was closed."""
        self._finalizer = weakref.finalize(response, _abandoned, self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()
        try:
            usage = self._meter.usage() if self._meter is not None else None
            if usage is not None:
                self.draw.settle(usage.total)
        finally:
            try:
                if self._handler is not None:
                    self._handler.finish(self.draw)
            finally:
                self._leave()


def _abandoned(call: Call) -> None:
    if call._closed:
        return
    if not Call._warned:
        Call._warned = True
        _log.warning(
            "a coordinated response was dropped without being closed; its slot is given "
            "back now. Close responses (`with` / `async with`, or .close()) so slots "
            "come back at once: a dropped stream kept alive by a reference cycle holds "
            "its slot until the garbage collector runs"
        )
    call.close()


# -- the flow ----------------------------------------------------------------------------------


class Gatekeeper(Protocol[_ResponseIn]):
    """What the flow needs of its gate (see ``_gate.Gate``)."""

    handler: ProviderLimitHandler
    max_attempts: int
    learn: bool
    reject: bool

    def watch(self, response: _ResponseIn, call: Call) -> bool: ...


@final
class _Attempt(Generic[ResponseT]):
    __slots__ = ("limited", "response")

    def __init__(self, response: ResponseT, limited: bool) -> None:
        self.response = response
        self.limited = limited


def exchange(
    gate: Gatekeeper[ResponseT], t: ModelTuple | None, estimate: int, timeout: float | None
) -> Generator[Step, Any, ResponseT]:
    """The flow of one request (see the module docstring); returns the caller's response."""
    if t is None:
        unscheduled: ResponseT = yield Send()
        return unscheduled
    order: int | None = None
    previous: object = None
    refused: ResponseT | None = None
    handler = gate.handler
    for attempt in range(1, gate.max_attempts + 1):
        admitted: Admitted = yield Admit(t, estimate, order, timeout)
        model_request = admitted.request
        try:
            draw, owner = handler.track(model_request)
        except BaseException:
            admitted.leave()
            raise
        call = Call(admitted.leave, draw, owner, handler)
        if model_request is previous:
            # Joined an enclosing request of this task: the layer above owns it, and
            # retries it (another handler than ours did not tell us so earlier).
            call.close()
            assert refused is not None
            return refused
        outcome = yield from _attempt(gate, t, call)
        response = outcome.response
        if response.status_code != 429 or not outcome.limited or not owner or gate.reject:
            return response
        refused, previous, order = response, model_request, model_request.acceptance_order
        call.close()  # the slot goes back; waiting for the reopen holds none
        if attempt < gate.max_attempts:
            _log.debug(
                "%s/%s: HTTP 429, sending again after the reopen (attempt %d of %d)",
                t.provider,
                t.model,
                attempt + 1,
                gate.max_attempts,
            )
    _log.info(
        "%s/%s: HTTP 429 after %d attempts, passed to the caller",
        t.provider,
        t.model,
        gate.max_attempts,
    )
    assert refused is not None
    return refused


def _attempt(
    gate: Gatekeeper[ResponseT], t: ModelTuple, call: Call
) -> Generator[Step, Any, _Attempt[ResponseT]]:
    """Send once: the response with its body watched (or read, if an error), and whether
    it was a provider limit (its tuple's gate is closed now)."""
    draw, handler = call.draw, gate.handler
    try:
        response: ResponseT = yield Send()
    except BaseException as exc:
        try:
            if isinstance(exc, Exception):
                handler.observe(t, exc, started_at=draw.started_at)
        finally:
            # The provider may have processed it: the estimate stays charged.
            call.close()
        raise
    try:
        if gate.learn:
            handler.learn(draw, response.headers)
        limited = yield from _inspect(handler, t, response, draw)
    except BaseException:
        try:
            yield Discard(response)  # the connection goes back to the pool
        finally:
            call.close()
        raise
    if response.is_closed or not gate.watch(response, call):
        call.close()  # nothing left to stream (or nothing we can watch)
    else:
        call.guard(response)
    return _Attempt(response, limited)


def _inspect(
    handler: ProviderLimitHandler, t: ModelTuple, response: ResponseLike, draw: Draw
) -> Generator[Step, Any, bool]:
    status = response.status_code
    if status in _CLIENT_ERRORS:
        # Error bodies are small; reading one closes it (the call then ends at once).
        yield Read(response)
        if is_limit_status(status, response.text):
            draw.refused()
            handler.report_limit(
                t,
                retry_after=retry_delay(response),
                started_at=draw.started_at,
                reason=f"HTTP {status}",
            )
            return True
        draw.settle(0)  # refused as malformed or unauthorized: nothing generated
    elif status >= 400:
        draw.settle(0)  # a server error: nothing generated, and never retried
    else:
        handler.report_success(t, started_at=draw.started_at)
    return False
