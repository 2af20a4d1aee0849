"""CoordinatedTransport: every model request holds a coordinator permit until its body is closed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import final

import httpx2
from lovely_coordinator_limits import ProviderLimitHandler

from lovely_coordinator import AgentCoordinator, AgentPermit

from ._gate import Gate, GatedTransport, close_then_release
from ._tuples import DEFAULT_PROVIDERS, TupleFor

__all__ = ["CoordinatedTransport"]


@final
class CoordinatedTransport(
    GatedTransport[httpx2.Request, httpx2.Response], httpx2.AsyncBaseTransport
):
    """An httpx2 transport that runs each model request under a coordinator permit.

    Each request is mapped to a ``(provider, model)`` tuple (by default: the provider from
    the host, the model from the JSON body's ``model``, see :func:`tuple_for_request`),
    waits for a permit on it, and keeps that permit until the response body is closed, so
    a streamed completion counts against the cap for as long as it streams, not just until
    its headers arrive. A request that names no model is sent without a permit, and so is
    a request made while the task already holds a permit of the transport's own
    coordinator (``coordinator.current_permit()``), which would otherwise wait for a
    second slot behind itself; a permit of another coordinator (the Bash pool) does not
    count.

    Responses feed the :class:`~lovely_coordinator_limits.ProviderLimitHandler`: a limit
    (429, or a client error whose body names a quota or billing limit) closes the tuple for
    the provider's requested wait; a success ends a half-open probe.

    Use it with the SDKs' own clients, e.g.
    ``openai.AsyncOpenAI(http_client=httpx2.AsyncClient(transport=CoordinatedTransport()))``.
    Turn the SDK's own retries down (``max_retries=0``) to let the closed gate, rather
    than each request, do the waiting. For a client of the older ``httpx`` use
    :class:`lovely_coordinator_httpx.legacy.CoordinatedTransport`.

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
        self._inner = transport if transport is not None else httpx2.AsyncHTTPTransport()
        self._gate = Gate(
            coordinator,
            handler,
            tuple_for,
            providers,
            _watch,
            reject_on_closed_tuple=reject_on_closed_tuple,
        )


def _watch(response: httpx2.Response, permit: AgentPermit) -> bool:
    stream = response.stream
    if not isinstance(stream, httpx2.AsyncByteStream):
        return False
    response.stream = _PermitStream(stream, permit)
    return True


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
        await close_then_release(self._stream, self._permit)
