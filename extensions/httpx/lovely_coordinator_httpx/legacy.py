"""The same transport for clients of the older ``httpx`` (0.x) package.

The openai and anthropic SDKs accept an ``httpx.AsyncClient`` as well as an
``httpx2.AsyncClient``; this module serves the former. It needs ``httpx`` installed (the
``legacy`` extra)::

    import httpx, openai
    from lovely_coordinator_httpx.legacy import CoordinatedTransport

    client = openai.AsyncOpenAI(
        http_client=httpx.AsyncClient(transport=CoordinatedTransport()), max_retries=0
    )
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import final

import httpx
from lovely_coordinator_limits import ModelTupleLike, ProviderLimitHandler

from lovely_coordinator import AgentCoordinator, AgentPermit

from ._gate import Gate, GatedTransport, close_then_release
from ._tuples import DEFAULT_PROVIDERS

__all__ = ["CoordinatedTransport", "LegacyTupleFor"]

LegacyTupleFor = Callable[[httpx.Request], ModelTupleLike | None]
"""Maps an ``httpx`` request to its model tuple, or ``None`` to send it without a permit."""


@final
class CoordinatedTransport(GatedTransport[httpx.Request, httpx.Response], httpx.AsyncBaseTransport):
    """:class:`lovely_coordinator_httpx.CoordinatedTransport` for ``httpx`` clients.

    Same arguments and behaviour; ``transport`` defaults to ``httpx.AsyncHTTPTransport()``.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        handler: ProviderLimitHandler | None = None,
        tuple_for: LegacyTupleFor | None = None,
        providers: Mapping[str, str] = DEFAULT_PROVIDERS,
        reject_on_closed_tuple: bool = False,
    ) -> None:
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        self._gate = Gate(
            coordinator,
            handler,
            tuple_for,
            providers,
            _watch,
            reject_on_closed_tuple=reject_on_closed_tuple,
        )


def _watch(response: httpx.Response, permit: AgentPermit) -> bool:
    stream = response.stream
    if not isinstance(stream, httpx.AsyncByteStream):
        return False
    response.stream = _PermitStream(stream, permit)
    return True


@final
class _PermitStream(httpx.AsyncByteStream):
    """A response body that gives the permit back when it is closed, and only then."""

    def __init__(self, stream: httpx.AsyncByteStream, permit: AgentPermit) -> None:
        self._stream = stream
        self._permit = permit

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream.__aiter__()

    async def aclose(self) -> None:
        await close_then_release(self._stream, self._permit)
