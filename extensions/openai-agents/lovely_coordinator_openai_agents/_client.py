"""coordinated_client(): an ``AsyncOpenAI`` whose every model call goes through the coordinator.

The Agents SDK calls models through an ``openai.AsyncOpenAI``: the default one
(``set_default_openai_client``) or the one a model was given
(``OpenAIResponsesModel(model, openai_client)``, ``OpenAIChatCompletionsModel(...)``). Both
APIs it speaks, the Responses API (its default) and chat completions, are model calls the
coordinated transport schedules, so one client covers them.
"""

from __future__ import annotations

from typing import Unpack

import httpx2
import openai
from lovely_coordinator_httpx import CoordinatedTransport, TransportOptions

from lovely_coordinator import AgentCoordinator, InvalidArgumentTypeError

__all__ = ["coordinated_client"]


def coordinated_client(
    client: openai.AsyncOpenAI | None = None,
    coordinator: AgentCoordinator | None = None,
    **options: Unpack[TransportOptions],
) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` whose every model call is one ``coordinator.request()``.

    Derived from ``client`` (its key, base URL, organization, headers and timeout; by
    default a new ``AsyncOpenAI()`` configured from the environment) with ``with_options``,
    over an HTTP client whose transport is a
    :class:`~lovely_coordinator_httpx.CoordinatedTransport`: chat completions and Responses
    API calls alike are admitted in acceptance order within the caps and the tuple's
    budget (learned from the rate-limit headers), run on the current permit when the task
    holds one that covers no other call, are settled from the usage they report (streams
    included), and a 429 is parked until the gate reopens, holding no slot, and sent again.
    The SDK's own retries are off. Close it (``await client.close()``, or ``async with``)
    when done; ``client`` is left as it was.

    Args:
        client: the client to derive from; ``None`` builds ``openai.AsyncOpenAI()``.
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        handler: the limit handler; defaults to the coordinator's shared one.
        tuple_for: maps a request to its tuple; by default the provider from the host
            (``providers``), the model from the body.
        providers: host → provider names for the default mapping.
        reject_on_closed_tuple: fail at once with ``TupleSuspendedError`` while the tuple's
            gate is closed, rather than wait.
        max_attempts: sends of one request that 429s may take, an int ≥ 1.
        learn_budgets: whether the rate-limit headers set budgets.
        tokenizer: counts prompt tokens; by default characters / 4.

    Raises:
        InvalidArgumentTypeError: ``client`` is not an ``openai.AsyncOpenAI``.
        InvalidArgumentError: ``max_attempts`` is not an int ≥ 1.
    """
    if client is not None and not isinstance(client, openai.AsyncOpenAI):
        raise InvalidArgumentTypeError("coordinated_client() takes an openai.AsyncOpenAI client")
    http = httpx2.AsyncClient(transport=CoordinatedTransport(coordinator, **options))
    base = client if client is not None else openai.AsyncOpenAI()
    return base.with_options(http_client=http, max_retries=0)
