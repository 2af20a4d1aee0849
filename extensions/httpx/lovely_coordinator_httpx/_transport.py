"""CoordinatedTransport: every model request holds a coordinator permit until its body is closed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import final

import anyio
import httpx2
from lovely_coordinator_limits import (
    ProviderLimitHandler,
    as_model_tuple,
    is_limit_status,
    retry_delay,
)

from lovely_coordinator import (
    AgentCoordinator,
    AgentPermit,
    ModelTuple,
    current_permit,
    get_agent_coordinator,
)

from ._tuples import DEFAULT_PROVIDERS, TupleFor, tuple_for_request

__all__ = ["CoordinatedTransport"]

# Error statuses whose body is read to tell a billing or quota refusal from other client
# errors. Server errors (5xx) are never limits, so their bodies are left to the caller.
_CLIENT_ERRORS = range(400, 500)


@final
class CoordinatedTransport(httpx2.AsyncBaseTransport):
    """An httpx transport that runs each model request under a coordinator permit.

    Each request is mapped to a ``(provider, model)`` tuple (by default: the provider from
    the host, the model from the JSON body's ``model``, see :func:`tuple_for_request`),
    waits for a permit on it, and keeps that permit until the response body is closed, so
    a streamed completion counts against the cap for as long as it streams, not just until
    its headers arrive. A request that names no model is sent without a permit, and so is
    a request made while the task already holds a permit (``current_permit()``), which
    would otherwise wait for a second slot behind itself.

    Responses feed the :class:`~lovely_coordinator_limits.ProviderLimitHandler`: a limit
    (429, or a client error whose body names a quota or billing limit) closes the tuple for
    the provider's requested wait; a success ends a half-open probe.

    Use it with the SDKs' own clients, e.g.
    ``openai.AsyncOpenAI(http_client=httpx2.AsyncClient(transport=CoordinatedTransport()))``.
    Turn the SDK's own retries down (``max_retries=0``) to let the closed gate, rather
    than each request, do the waiting.

    Args:
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        transport: the transport that does the I/O; defaults to a new
            ``httpx2.AsyncHTTPTransport()``, closed with this one.
        handler: the limit handler; defaults to a new one for ``coordinator``. Share one
            handler between transports that talk to the same providers.
        tuple_for: overrides the request → tuple mapping (return ``None`` to bypass).
        providers: host → provider names for the default mapping.
        reject_on_closed_tuple: fail at once with ``TupleSuspendedError`` rather than
            wait while the tuple's gate is closed (for foreground work).
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None = None,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
        handler: ProviderLimitHandler | None = None,
        tuple_for: TupleFor | None = None,
        providers: Mapping[str, str] = DEFAULT_PROVIDERS,
        reject_on_closed_tuple: bool = False,
    ) -> None:
        self._coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self._transport = transport if transport is not None else httpx2.AsyncHTTPTransport()
        self._handler = handler if handler is not None else ProviderLimitHandler(self._coordinator)
        self._providers = dict(providers)
        self._tuple_for = tuple_for
        self._reject = reject_on_closed_tuple

    @property
    def coordinator(self) -> AgentCoordinator:
        """The coordinator that grants this transport's permits."""
        return self._coordinator

    @property
    def handler(self) -> ProviderLimitHandler:
        """The handler that limit responses are reported to."""
        return self._handler

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request`` under a permit for its tuple (see the class docstring).

        Raises:
            TupleSuspendedError: the tuple is closed and ``reject_on_closed_tuple`` is set.
        """
        found = (
            self._tuple_for(request)
            if self._tuple_for is not None
            else tuple_for_request(request, self._providers)
        )
        if found is None:
            return await self._transport.handle_async_request(request)
        t = as_model_tuple(found)
        inherited = current_permit()
        permit: AgentPermit | None = None
        if inherited is None or not inherited.held:
            permit = await self._coordinator.acquire(t, reject_on_closed_tuple=self._reject)
        started_at = anyio.current_time()
        try:
            response = await self._transport.handle_async_request(request)
        except BaseException as exc:
            try:
                if isinstance(exc, Exception):
                    self._handler.observe(t, exc, started_at=started_at)
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
        if permit is not None:
            stream = response.stream
            if response.is_closed or not isinstance(stream, httpx2.AsyncByteStream):
                permit.release()  # nothing left to stream (or nothing we can watch)
            else:
                response.stream = _PermitStream(stream, permit)
        return response

    async def _inspect(self, t: ModelTuple, response: httpx2.Response, started_at: float) -> None:
        """Report the response's status to the limit handler."""
        status = response.status_code
        if status in _CLIENT_ERRORS:
            # Error bodies are small; reading one closes it (the permit then goes at once).
            await response.aread()
            if is_limit_status(status, response.text):
                delay = retry_delay(response)
                self._handler.report_limit(t, retry_after=delay, started_at=started_at)
        elif status < 400:
            self._handler.report_success(t, started_at=started_at)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._transport.aclose()


@final
class _PermitStream(httpx2.AsyncByteStream):
    """A response body that gives the permit back when it is closed, and only then."""

    def __init__(self, stream: httpx2.AsyncByteStream, permit: AgentPermit) -> None:
        self._stream = stream
        self._permit = permit

    def __aiter__(self) -> AsyncIterator[bytes]:
        # The wrapped stream's own iterator: no generator of ours in the chain, so nothing
        # extra to finalize when a reader abandons the body half-way.
        return self._stream.__aiter__()

    async def aclose(self) -> None:
        try:
            # Shielded so a cancelled reader still hands its connection back to the pool.
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
        finally:
            # Synchronous and idempotent: nothing can interrupt it or make it run twice.
            self._permit.release()
