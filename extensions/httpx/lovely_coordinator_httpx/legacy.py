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

from collections.abc import Callable, Mapping
from typing import final

import httpx
from lovely_coordinator_limits import ModelTupleLike, ProviderLimitHandler, Tokenizer

from lovely_coordinator import AgentCoordinator

from ._gate import AsyncGated, Gate, SyncGated, watchers
from ._tuples import DEFAULT_PROVIDERS

__all__ = ["CoordinatedSyncTransport", "CoordinatedTransport", "LegacyTupleFor"]

LegacyTupleFor = Callable[[httpx.Request], ModelTupleLike | None]
"""Maps an ``httpx`` request to its model tuple, or ``None`` to send it unscheduled."""

_WATCH_ASYNC, _WATCH_SYNC = watchers(httpx)


@final
class CoordinatedTransport(AsyncGated[httpx.Request, httpx.Response], httpx.AsyncBaseTransport):
    """:class:`lovely_coordinator_httpx.CoordinatedTransport` for ``httpx`` clients.

    Same arguments and behaviour (``httpx.PoolTimeout`` past the pool timeout);
    ``transport`` defaults to ``httpx.AsyncHTTPTransport()``.
    """

    _pool_timeout = httpx.PoolTimeout
    _sync_name = "lovely_coordinator_httpx.legacy.CoordinatedSyncTransport"

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
        self._gate = Gate(
            coordinator,
            handler,
            tuple_for,
            providers,
            _WATCH_ASYNC,
            reject_on_closed_tuple=reject_on_closed_tuple,
            max_attempts=max_attempts,
            learn_budgets=learn_budgets,
            tokenizer=tokenizer,
        )
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()


@final
class CoordinatedSyncTransport(SyncGated[httpx.Request, httpx.Response], httpx.BaseTransport):
    """:class:`lovely_coordinator_httpx.CoordinatedSyncTransport` for ``httpx`` clients.

    Same arguments and behaviour; ``transport`` defaults to ``httpx.HTTPTransport()``.
    """

    _pool_timeout = httpx.PoolTimeout
    _async_name = "lovely_coordinator_httpx.legacy.CoordinatedTransport"

    def __init__(
        self,
        coordinator: AgentCoordinator | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        handler: ProviderLimitHandler | None = None,
        tuple_for: LegacyTupleFor | None = None,
        providers: Mapping[str, str] = DEFAULT_PROVIDERS,
        reject_on_closed_tuple: bool = False,
        max_attempts: int = 5,
        learn_budgets: bool = True,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self._gate = Gate(
            coordinator,
            handler,
            tuple_for,
            providers,
            _WATCH_SYNC,
            reject_on_closed_tuple=reject_on_closed_tuple,
            max_attempts=max_attempts,
            learn_budgets=learn_budgets,
            tokenizer=tokenizer,
        )
        self._inner = transport if transport is not None else httpx.HTTPTransport()
