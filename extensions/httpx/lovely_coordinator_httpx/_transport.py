"""CoordinatedTransport and CoordinatedSyncTransport: every model request goes through
the coordinator, for ``httpx2`` clients (async and sync)."""

from __future__ import annotations

from typing import final

import httpx2

from ._bodies import generation
from ._gate import AsyncGated, Options, SyncGated

__all__ = ["CoordinatedSyncTransport", "CoordinatedTransport", "TransportOptions"]

TransportOptions = Options[httpx2.Request]
"""The keyword arguments of :class:`CoordinatedTransport` and :class:`CoordinatedSyncTransport`
but ``transport``, as a ``TypedDict``: a function that builds coordinated clients takes
them as ``**options: Unpack[TransportOptions]`` and passes them on."""

_GENERATION = generation(httpx2)


@final
class CoordinatedTransport(
    AsyncGated[httpx2.Request, httpx2.Response, httpx2.AsyncBaseTransport],
    httpx2.AsyncBaseTransport,
):
    """An httpx2 transport that sends each model request through the coordinator.

    Each model call is mapped to a ``(provider, model)`` tuple (by default: the provider
    from the host and path, the model from the JSON body's ``model``, see
    :func:`tuple_for_request`; other requests, such as model listings or token counts, are
    sent unscheduled) and sent as one ``coordinator.request(t, tokens=estimate)``:
    admitted in acceptance order once the tuple's gate is open, its budget holds the
    request and its estimated tokens (the prompt's characters / 4, or ``tokenizer``, plus
    the body's output limit) and a slot covers it — the task's current permit when that
    covers no other call at the moment, otherwise a slot of its own, so calls fanned out
    under one permit never exceed the caps. The wait for admission is bounded by the
    request's ``pool`` timeout (the client's ``timeout``): past it the call raises
    ``httpx2.PoolTimeout`` (the SDKs' ``APITimeoutError``), having drawn nothing. The
    request context lasts until the response body is closed (a streamed completion counts
    for as long as it streams), or until the response object is dropped unclosed; the usage
    the body reports (decoded from its ``content-encoding``) settles the charge.

    Responses teach the shared :class:`~lovely_coordinator_limits.ProviderLimitHandler`:
    their rate-limit headers set the tuple's budget (unless ``set_budget`` set one) and
    lower what is left to what the provider says remains; a limit (429, or a client error
    whose body names a quota or billing limit) closes the tuple for the provider's wait;
    a success moves a half-open tuple towards its full cap.

    A 429 is the transport's to retry: the call is given back (no charge, no slot held),
    waits for the gate to reopen keeping its acceptance order, and is sent again, up to
    ``max_attempts`` sends; then the 429 goes to the caller. Nothing else is retried.
    Turn the SDK's own retries off (``max_retries=0``) so that no retry waits holding a
    slot. For sync clients use :class:`CoordinatedSyncTransport`; for clients of the older
    ``httpx``, :mod:`lovely_coordinator_httpx.legacy`.

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

    _generation = _GENERATION
    _new_inner = httpx2.AsyncHTTPTransport
    _sync_name = "lovely_coordinator_httpx.CoordinatedSyncTransport"


@final
class CoordinatedSyncTransport(
    SyncGated[httpx2.Request, httpx2.Response, httpx2.BaseTransport], httpx2.BaseTransport
):
    """:class:`CoordinatedTransport` for sync clients (``httpx2.Client``, ``openai.OpenAI``,
    ``anthropic.Anthropic``), called from any number of threads.

    The same admission, 429 park-and-retry, header learning and settle, on the same
    coordinator and handler, in the same line as async callers: each call blocks its own
    thread while it waits (``coordinator.request_sync``), bounded by the request's
    ``pool`` timeout. Same arguments; ``transport`` defaults to ``httpx2.HTTPTransport()``.
    A call made from a thread that runs an event loop raises ``UsageError`` (blocking that
    loop could stop the very release it waits for): use the async client there.
    """

    _generation = _GENERATION
    _new_inner = httpx2.HTTPTransport
    _async_name = "lovely_coordinator_httpx.CoordinatedTransport"
