"""The same transports for clients of the older ``httpx`` (0.x) package.

The openai and anthropic SDKs accept an ``httpx.AsyncClient`` (``httpx.Client``) as well
as the ``httpx2`` ones; this module serves the former. It needs ``httpx`` installed (the
``legacy`` extra)::

    import httpx, openai
    from lovely_coordinator_httpx.legacy import CoordinatedTransport

    client = openai.AsyncOpenAI(
        http_client=httpx.AsyncClient(transport=CoordinatedTransport()), max_retries=0
    )

Everything but the classes they wrap is shared with the ``httpx2`` transports.
(``httpx`` keeps a response and its stream in a reference cycle, so a legacy response
dropped unclosed gives its slot back when the garbage collector runs; a call waiting
behind it is bounded by its pool timeout meanwhile.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import httpx
from lovely_coordinator_limits import ModelTupleLike

from ._bodies import generation
from ._gate import AsyncGated, Options, SyncGated

__all__ = [
    "CoordinatedSyncTransport",
    "CoordinatedTransport",
    "LegacyTransportOptions",
    "LegacyTupleFor",
]

LegacyTupleFor = Callable[[httpx.Request], ModelTupleLike | None]
"""Maps an ``httpx`` request to its model tuple, or ``None`` to send it unscheduled."""

LegacyTransportOptions = Options[httpx.Request]
""":data:`lovely_coordinator_httpx.TransportOptions` for the ``httpx`` transports."""

_GENERATION = generation(httpx)


@final
class CoordinatedTransport(
    AsyncGated[httpx.Request, httpx.Response, httpx.AsyncBaseTransport], httpx.AsyncBaseTransport
):
    """:class:`lovely_coordinator_httpx.CoordinatedTransport` for ``httpx`` clients.

    Same arguments and behaviour (``httpx.PoolTimeout`` past the pool timeout);
    ``transport`` defaults to ``httpx.AsyncHTTPTransport()``.
    """

    _generation = _GENERATION
    _new_inner = httpx.AsyncHTTPTransport
    _sync_name = "lovely_coordinator_httpx.legacy.CoordinatedSyncTransport"


@final
class CoordinatedSyncTransport(
    SyncGated[httpx.Request, httpx.Response, httpx.BaseTransport], httpx.BaseTransport
):
    """:class:`lovely_coordinator_httpx.CoordinatedSyncTransport` for ``httpx`` clients.

    Same arguments and behaviour; ``transport`` defaults to ``httpx.HTTPTransport()``.
    """

    _generation = _GENERATION
    _new_inner = httpx.HTTPTransport
    _async_name = "lovely_coordinator_httpx.legacy.CoordinatedTransport"
