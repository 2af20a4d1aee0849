"""CoordinatedTransport: every model request goes through ``coordinator.request()``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import final

import anyio
import httpx2
from lovely_coordinator_limits import ProviderLimitHandler, Tokenizer, UsageMeter

from lovely_coordinator import AgentCoordinator

from ._gate import Call, Chunks, Gate, GatedTransport
from ._tuples import DEFAULT_PROVIDERS, TupleFor

__all__ = ["CoordinatedTransport"]


@final
class CoordinatedTransport(
    GatedTransport[httpx2.Request, httpx2.Response], httpx2.AsyncBaseTransport
):
    """An httpx2 transport that sends each model request through the coordinator.

    Each request is mapped to a ``(provider, model)`` tuple (by default: the provider from
    the host, the model from the JSON body's ``model``, see :func:`tuple_for_request`) and
    sent as one ``coordinator.request(t, tokens=estimate)``: admitted in acceptance order
    once the tuple's gate is open, its budget holds the request and its estimated tokens
    (the prompt's characters / 4, or ``tokenizer``, plus the body's output limit) and a
    slot covers it — the task's current permit when that covers no other call at the
    moment, otherwise a slot of its own, so calls fanned out under one permit never exceed
    the caps. The request context lasts until the response body is closed (a streamed
    completion counts for as long as it streams), and the usage the body reports settles
    the charge. A request that names no model is sent unscheduled.

    Responses teach the shared :class:`~lovely_coordinator_limits.ProviderLimitHandler`:
    their rate-limit headers set the tuple's budget (unless ``set_budget`` set one) and
    lower what is left to what the provider says remains; a limit (429, or a client error
    whose body names a quota or billing limit) closes the tuple for the provider's wait;
    a success moves a half-open tuple towards its full cap.

    A 429 is the transport's to retry: the call is given back (no charge, no slot held),
    waits for the gate to reopen keeping its acceptance order, and is sent again, up to
    ``max_attempts`` sends; then the 429 goes to the caller. Nothing else is retried.
    Turn the SDK's own retries off (``max_retries=0``) so that no retry waits holding a
    slot. For a client of the older ``httpx`` use
    :class:`lovely_coordinator_httpx.legacy.CoordinatedTransport`.

    Args:
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        transport: the transport that does the I/O; defaults to a new
            ``httpx2.AsyncHTTPTransport()``, closed with this one.
        handler: the limit handler; defaults to the coordinator's shared one
            (``ProviderLimitHandler.for_coordinator``), which every extension uses.
        tuple_for: overrides the request → tuple mapping (return ``None`` to bypass).
        providers: host → provider names for the default mapping.
        reject_on_closed_tuple: fail at once with ``TupleSuspendedError`` rather than
            wait while the tuple's gate is closed (for foreground work; a 429 then goes
            to the caller at once).
        max_attempts: sends of one request that 429s may take (default 5), an int ≥ 1.
        learn_budgets: whether the responses' rate-limit headers set budgets.
        tokenizer: counts prompt tokens (e.g. ``tiktoken_tokenizer()``); by default
            characters / 4.

    Raises:
        InvalidArgumentError: ``max_attempts`` is not an int ≥ 1.
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
        self._inner = transport if transport is not None else httpx2.AsyncHTTPTransport()


def _watch(response: httpx2.Response, call: Call) -> bool:
    stream = response.stream
    if not isinstance(stream, httpx2.AsyncByteStream):
        return False
    meter = call.meter(response.headers.get("content-type", ""))
    response.stream = _MeteredStream(stream, meter, call)
    return True


@final
class _MeteredStream(httpx2.AsyncByteStream):
    """A response body whose chunks feed the call's meter; closing it ends the call."""

    def __init__(self, stream: httpx2.AsyncByteStream, meter: UsageMeter, call: Call) -> None:
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
