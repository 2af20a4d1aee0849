"""What a coordinated transport does around one request, for either httpx generation.

``httpx2`` (what current openai / anthropic SDKs ship with) and the older ``httpx`` have
the same request and response shapes but separate classes. Everything that decides
something lives here, written against those shapes; the transports in ``_transport`` and
``legacy`` only adapt their library's classes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar, final

import anyio
from lovely_coordinator_limits import (
    ModelTupleLike,
    ProviderLimitHandler,
    as_model_tuple,
    is_limit_status,
    retry_delay,
)

from lovely_coordinator import (
    AgentCoordinator,
    AgentPermit,
    ModelTuple,
    get_agent_coordinator,
)

from ._tuples import RequestLike, tuple_for_request

__all__ = ["Gate", "GatedTransport", "ResponseLike", "close_then_release"]

# Error statuses whose body is read to tell a billing or quota refusal from other client
# errors. Server errors (5xx) are never limits, so their bodies are left to the caller.
_CLIENT_ERRORS = range(400, 500)


class ResponseLike(Protocol):
    """The part of an httpx / httpx2 ``Response`` the gate uses."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

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
class Gate(Generic[RequestT, ResponseT]):
    """Holds a permit around each request and reports responses to the limit handler.

    Args:
        coordinator: grants the permits (default: the process-global one).
        handler: receives limits and successes (default: a new one for ``coordinator``).
        tuple_for: request → tuple, or ``None`` to send it without a permit (default:
            :func:`tuple_for_request` with ``providers``).
        providers: host → provider names for the default mapping.
        watch: attaches the permit to a response whose body is still open, so that
            closing the body releases it; returns ``False`` when it cannot (the permit is
            then released at once).
        reject_on_closed_tuple: passed to ``acquire``.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None,
        handler: ProviderLimitHandler | None,
        tuple_for: Callable[[RequestT], ModelTupleLike | None] | None,
        providers: Mapping[str, str],
        watch: Callable[[ResponseT, AgentPermit], bool],
        *,
        reject_on_closed_tuple: bool,
    ) -> None:
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.handler = handler if handler is not None else ProviderLimitHandler(self.coordinator)
        if tuple_for is None:
            known = dict(providers)

            def tuple_for(request: RequestT) -> ModelTupleLike | None:
                return tuple_for_request(request, known)

        self._tuple_for = tuple_for
        self._watch = watch
        self._reject = reject_on_closed_tuple

    async def send(
        self, request: RequestT, send: Callable[[RequestT], Awaitable[ResponseT]]
    ) -> ResponseT:
        """``send(request)`` under a permit for the request's tuple."""
        found = self._tuple_for(request)
        if found is None:
            return await send(request)
        t = as_model_tuple(found)
        inherited = self.coordinator.current_permit()  # a Bash-pool permit is no model slot
        permit: AgentPermit | None = None
        if inherited is None or not inherited.held:
            permit = await self.coordinator.acquire(t, reject_on_closed_tuple=self._reject)
        started_at = anyio.current_time()
        try:
            response = await send(request)
        except BaseException as exc:
            try:
                if isinstance(exc, Exception):
                    self.handler.observe(t, exc, started_at=started_at)
            finally:
                if permit is not None:
                    permit.release()
            raise
        try:
            await self._inspect(t, response, started_at)
        except BaseException:
            try:
                # Shielded: a cancelled caller still hands the connection back to the pool.
                with anyio.CancelScope(shield=True):
                    await response.aclose()
            finally:
                if permit is not None:
                    permit.release()
            raise
        if permit is not None and (response.is_closed or not self._watch(response, permit)):
            permit.release()  # nothing left to stream (or nothing we can watch)
        return response

    async def _inspect(self, t: ModelTuple, response: ResponseT, started_at: float) -> None:
        status = response.status_code
        if status in _CLIENT_ERRORS:
            # Error bodies are small; reading one closes it (the permit then goes at once).
            await response.aread()
            if is_limit_status(status, response.text):
                delay = retry_delay(response)
                self.handler.report_limit(t, retry_after=delay, started_at=started_at)
        elif status < 400:
            self.handler.report_success(t, started_at=started_at)


class GatedTransport(Generic[RequestT, ResponseT]):
    """The transport methods both generations share; subclasses set ``_gate``, ``_inner``."""

    _gate: Gate[RequestT, ResponseT]
    _inner: _Inner[RequestT, ResponseT]

    @property
    def coordinator(self) -> AgentCoordinator:
        """The coordinator that grants this transport's permits."""
        return self._gate.coordinator

    @property
    def handler(self) -> ProviderLimitHandler:
        """The handler that limit responses are reported to."""
        return self._gate.handler

    async def handle_async_request(self, request: RequestT) -> ResponseT:
        """Send ``request`` under a permit for its tuple (see ``CoordinatedTransport``).

        Raises:
            TupleSuspendedError: the tuple is closed and ``reject_on_closed_tuple`` is set.
        """
        return await self._gate.send(request, self._inner.handle_async_request)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._inner.aclose()


async def close_then_release(stream: Any, permit: AgentPermit) -> None:
    """Close a response body, shielded, and give its permit back whatever happens."""
    try:
        # Shielded so a cancelled reader still hands its connection back to the pool.
        with anyio.CancelScope(shield=True):
            await stream.aclose()
    finally:
        # Synchronous and idempotent: nothing can interrupt it or make it run twice.
        permit.release()
