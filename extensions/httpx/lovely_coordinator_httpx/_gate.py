"""What a coordinated transport does around one request, for either httpx generation.

``httpx2`` (what current openai / anthropic SDKs ship with) and the older ``httpx`` have
the same request and response shapes but separate classes. Everything that decides
something lives here, written against those shapes; the transports in ``_transport`` and
``legacy`` only adapt their library's classes (how to wrap a response body).

One request, from the top:

1. Its tuple (``tuple_for``) and token estimate (``estimate_tokens`` of its JSON body).
2. ``coordinator.request(t, tokens=estimate)``: admitted in acceptance order once the
   gate is open, the budget holds it and a slot covers it.
3. Sent. The response's rate-limit headers teach the handler the tuple's budget.
4. A 429: the gate closes (the handler), the call is given back (``settle(0)``; the slot
   goes back as the request context exits), and the request is admitted again with its
   first acceptance order, so it waits for the reopen at the head of the line, holding no
   slot, and is sent again; after ``max_attempts`` the 429 goes to the caller. No other
   status is ever retried. A request whose ``request()`` joined an enclosing one of the
   same task (a ``CoordinatedModel`` above it) leaves the retry to that layer.
5. Otherwise the response goes to the caller with its body wrapped: the usage it reports
   (``UsageMeter``, fed as the caller reads) settles the charge, and the request context
   exits when the body is closed, whichever task closes it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar, final

import anyio
from lovely_coordinator_limits import (
    Draw,
    ModelTupleLike,
    ProviderLimitHandler,
    Tokenizer,
    UsageMeter,
    as_model_tuple,
    estimate_tokens,
    is_limit_status,
    retry_delay,
)

from lovely_coordinator import AgentCoordinator, InvalidArgumentError, get_agent_coordinator
from lovely_coordinator._requests import current_request_var

from ._tuples import RequestLike, tuple_for_request

__all__ = ["Call", "Chunks", "Gate", "GatedTransport", "ResponseLike"]

_log = logging.getLogger("lovely_coordinator.httpx")

# Error statuses whose body is read to tell a billing or quota refusal from other client
# errors. Server errors (5xx) are never limits, so their bodies are left to the caller.
_CLIENT_ERRORS = range(400, 500)
_ATTEMPTS_MESSAGE = "max_attempts must be a positive integer"


class ResponseLike(Protocol):
    """The part of an httpx / httpx2 ``Response`` the gate uses."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def is_closed(self) -> bool: ...

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


RequestT = TypeVar("RequestT", bound=RequestLike)
ResponseT = TypeVar("ResponseT", bound=ResponseLike)
_RequestIn = TypeVar("_RequestIn", bound=RequestLike, contravariant=True)
_ResponseOut = TypeVar("_ResponseOut", bound=ResponseLike, covariant=True)


class _Inner(Protocol[_RequestIn, _ResponseOut]):
    """The wrapped transport."""

    async def handle_async_request(self, request: _RequestIn, /) -> _ResponseOut: ...

    async def aclose(self) -> None: ...


@final
class Call:
    """One admitted attempt: its request context, its draw, the usage of its body.

    :meth:`close` runs once, from whichever task ends the attempt (the one that closes a
    streamed body, say): it settles the charge from the usage read, stops tracking the
    draw if this layer owns it, and exits the request context (shielded).
    """

    def __init__(
        self, context: Any, draw: Draw, owner: bool, handler: ProviderLimitHandler
    ) -> None:
        self._context = context
        self.draw = draw
        self.owner = owner
        self._handler = handler
        self._meter: UsageMeter | None = None
        self._closed = False

    def meter(self, content_type: str) -> UsageMeter:
        """Start reading the body's usage (for a response of ``content_type``)."""
        self._meter = UsageMeter(content_type)
        return self._meter

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            usage = self._meter.usage() if self._meter is not None else None
            if usage is not None:
                self.draw.settle(usage.total)
        finally:
            if self.owner:
                self._handler.finish(self.draw)
            with anyio.CancelScope(shield=True):
                await self._context.__aexit__(None, None, None)


@final
class Gate(Generic[RequestT, ResponseT]):
    """Sends each request through ``coordinator.request()`` (see the module docstring).

    Args:
        coordinator: admits the requests (default: the process-global one).
        handler: closes gates and learns budgets (default: the coordinator's shared one).
        tuple_for: request → tuple, or ``None`` to send it unscheduled.
        providers: host → provider names for the default mapping.
        watch: wraps a response's body so that reading it feeds the call's meter and
            closing it closes the call; returns ``False`` when it cannot.
        reject_on_closed_tuple: passed to ``request()``; such requests are never retried.
        max_attempts: sends of one request that a 429 may take, an int ≥ 1.
        learn_budgets: whether responses' rate-limit headers set budgets.
        tokenizer: counts prompt tokens for the estimate (default: characters / 4).

    Raises:
        InvalidArgumentError: ``max_attempts`` is not an int ≥ 1.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None,
        handler: ProviderLimitHandler | None,
        tuple_for: Callable[[RequestT], ModelTupleLike | None] | None,
        providers: Mapping[str, str],
        watch: Callable[[ResponseT, Call], bool],
        *,
        reject_on_closed_tuple: bool,
        max_attempts: int,
        learn_budgets: bool,
        tokenizer: Tokenizer | None,
    ) -> None:
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgumentError(_ATTEMPTS_MESSAGE)
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.handler = (
            handler
            if handler is not None
            else ProviderLimitHandler.for_coordinator(self.coordinator)
        )
        if tuple_for is None:
            known = dict(providers)

            def tuple_for(request: RequestT) -> ModelTupleLike | None:
                return tuple_for_request(request, known)

        self._tuple_for = tuple_for
        self._watch = watch
        self._reject = reject_on_closed_tuple
        self.max_attempts = max_attempts
        self._learn = learn_budgets
        self._tokenizer = tokenizer

    async def send(
        self, request: RequestT, send: Callable[[RequestT], Awaitable[ResponseT]]
    ) -> ResponseT:
        """``send(request)`` through ``coordinator.request()``, retrying 429s."""
        found = self._tuple_for(request)
        if found is None:
            return await send(request)
        t = as_model_tuple(found)
        estimate = self._estimate(request)
        order: int | None = None
        previous: object = None
        refused: ResponseT | None = None
        for attempt in range(1, self.max_attempts + 1):
            context = self.coordinator.request(
                t, tokens=estimate, acceptance_order=order, reject_on_closed_tuple=self._reject
            )
            outside = current_request_var.get()
            model_request = await context.__aenter__()
            # The request context stays open after this returns (a streamed body), but the
            # caller's code is not inside it: left current, it would make the task's next
            # call of this tuple join this one (two calls, one slot, one draw). Its exit,
            # later, restores this same value.
            current_request_var.set(outside)
            try:
                draw, owner = self.handler.track(model_request)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await context.__aexit__(None, None, None)
                raise
            call = Call(context, draw, owner, self.handler)
            if model_request is previous:
                # Joined an enclosing request of this task: the layer above owns it, and
                # retries it (another handler than ours did not tell us so earlier).
                await call.close()
                assert refused is not None
                return refused
            response, limited = await self._attempt(t, request, send, call)
            if response.status_code != 429 or not limited or not owner or self._reject:
                return response
            refused, previous, order = response, model_request, model_request.acceptance_order
            await call.close()  # the slot goes back; waiting for the reopen holds none
            if attempt < self.max_attempts:
                _log.debug(
                    "%s/%s: HTTP 429, sending again after the reopen (attempt %d of %d)",
                    t.provider,
                    t.model,
                    attempt + 1,
                    self.max_attempts,
                )
        _log.info(
            "%s/%s: HTTP 429 after %d attempts, passed to the caller",
            t.provider,
            t.model,
            self.max_attempts,
        )
        assert refused is not None
        return refused

    async def _attempt(
        self,
        t: Any,
        request: RequestT,
        send: Callable[[RequestT], Awaitable[ResponseT]],
        call: Call,
    ) -> tuple[ResponseT, bool]:
        """Send once: the response with its body watched (or read, if an error), and
        whether it was a provider limit (its tuple's gate is closed now)."""
        draw, handler = call.draw, self.handler
        try:
            response = await send(request)
        except BaseException as exc:
            try:
                if isinstance(exc, Exception):
                    handler.observe(t, exc, started_at=draw.started_at)
            finally:
                # The provider may have processed it: the estimate stays charged.
                await call.close()
            raise
        try:
            if self._learn:
                handler.learn(draw, response.headers)
            limited = await self._inspect(t, response, draw)
        except BaseException:
            try:
                # Shielded: a cancelled caller still hands the connection back to the pool.
                with anyio.CancelScope(shield=True):
                    await response.aclose()
            finally:
                await call.close()
            raise
        if response.is_closed or not self._watch(response, call):
            await call.close()  # nothing left to stream (or nothing we can watch)
        return response, limited

    async def _inspect(self, t: Any, response: ResponseT, draw: Draw) -> bool:
        status = response.status_code
        if status in _CLIENT_ERRORS:
            # Error bodies are small; reading one closes it (the call then ends at once).
            await response.aread()
            if is_limit_status(status, response.text):
                draw.refused()
                self.handler.report_limit(
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
            self.handler.report_success(t, started_at=draw.started_at)
        return False

    def _estimate(self, request: RequestT) -> int:
        try:
            content = request.content
        except Exception:  # RequestNotRead (of either httpx): a streaming upload
            return 0
        return estimate_tokens(content, self._tokenizer)


@final
class Chunks:
    """The wrapped body's iterator, feeding the meter (a class, not an async generator:
    nothing of ours is left to finalize when a reader abandons the body half-way)."""

    def __init__(self, chunks: AsyncIterator[bytes], meter: UsageMeter) -> None:
        self._chunks = chunks
        self._meter = meter

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._chunks.__anext__()
        self._meter.feed(chunk)
        return chunk


class GatedTransport(Generic[RequestT, ResponseT]):
    """The transport methods both generations share; subclasses set ``_gate``, ``_inner``."""

    _gate: Gate[RequestT, ResponseT]
    _inner: _Inner[RequestT, ResponseT]

    @property
    def coordinator(self) -> AgentCoordinator:
        """The coordinator that admits this transport's requests."""
        return self._gate.coordinator

    @property
    def handler(self) -> ProviderLimitHandler:
        """The handler that limits and budgets are reported to."""
        return self._gate.handler

    @property
    def max_attempts(self) -> int:
        """How many times one request may be sent when the provider answers 429."""
        return self._gate.max_attempts

    async def handle_async_request(self, request: RequestT) -> ResponseT:
        """Send ``request`` through the coordinator (see ``CoordinatedTransport``).

        Raises:
            TupleSuspendedError: the tuple is closed and ``reject_on_closed_tuple`` is set.
            CoordinatorBusyError: the coordinator's ``max_queued`` waiters already wait.
        """
        return await self._gate.send(request, self._inner.handle_async_request)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._inner.aclose()
