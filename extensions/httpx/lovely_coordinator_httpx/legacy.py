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

import anyio
import httpx
from lovely_coordinator_limits import ModelTupleLike, ProviderLimitHandler, Tokenizer, UsageMeter

from lovely_coordinator import AgentCoordinator

from ._gate import Call, Chunks, Gate, GatedTransport
from ._tuples import DEFAULT_PROVIDERS

__all__ = ["CoordinatedTransport", "LegacyTupleFor"]

LegacyTupleFor = Callable[[httpx.Request], ModelTupleLike | None]
"""Maps an ``httpx`` request to its model tuple, or ``None`` to send it unscheduled."""


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
        max_attempts: int = 5,
        learn_budgets: bool = True,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        gate = Gate(
            coordinator,
            handler,
            tuple_for,
            providers,
            _watch,
            reject_on_closed_tuple=reject_on_closed_tuple,
            max_attempts=max_attempts,
            learn_budgets=learn_budgets,
            tokenizer=tokenizer,
        )
        self._gate = gate
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()


def _watch(response: httpx.Response, call: Call) -> bool:
    stream = response.stream
    if not isinstance(stream, httpx.AsyncByteStream):
        return False
    meter = call.meter(response.headers.get("content-type", ""))
    response.stream = _MeteredStream(stream, meter, call)
    return True


@final
class _MeteredStream(httpx.AsyncByteStream):
    """A response body whose chunks feed the call's meter; closing it ends the call."""

    def __init__(self, stream: httpx.AsyncByteStream, meter: UsageMeter, call: Call) -> None:
        self._stream = stream
        self._meter = meter
        self._call = call

    def __aiter__(self) -> AsyncIterator[bytes]:
        return Chunks(self._stream.__aiter__(), self._meter)

    async def aclose(self) -> None:
        try:
            # Shielded so a cancelled reader still hands its connection back to the pool.
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
        finally:
            await self._call.close()
