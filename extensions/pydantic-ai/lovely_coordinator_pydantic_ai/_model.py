"""CoordinatedModel: a pydantic-ai model whose every request is one ``coordinator.request()``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, final

import anyio
from lovely_coordinator_limits import (
    Draw,
    ModelTupleLike,
    ProviderLimitHandler,
    Tokenizer,
    as_model_tuple,
    text_tokens,
)
from pydantic_ai import RunContext
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models import KnownModelName, Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    ModelTuple,
    get_agent_coordinator,
)

__all__ = ["CoordinatedModel", "estimate_request", "tuple_of"]

_log = logging.getLogger("lovely_coordinator.pydantic_ai")


def tuple_of(model: Model) -> ModelTuple:
    """The default tuple of a pydantic-ai model: ``(model.system, model.model_name)``.

    ``system`` is pydantic-ai's provider name (``"openai"``, ``"anthropic"``, ...; ``"test"``
    and ``"function"`` for the offline models).
    """
    return ModelTuple(model.system, model.model_name)


def estimate_request(
    messages: list[ModelMessage],
    model_settings: ModelSettings | None,
    parameters: ModelRequestParameters | None = None,
    tokenizer: Tokenizer | None = None,
) -> int:
    """The tokens a request will be charged: its prompt (characters / 4, or ``tokenizer``)
    — every text part, tool call and tool result of ``messages``, the instructions and
    the tools' definitions — plus ``max_tokens`` from ``model_settings``."""
    text = "\n".join(_texts(messages, parameters))
    limit = (model_settings or {}).get("max_tokens")
    output = limit if type(limit) is int and limit > 0 else 0
    return (text_tokens(text, tokenizer) if text else 0) + output


class CoordinatedModel(WrapperModel):
    """Wraps a pydantic-ai model so that each request (streamed or not) is one model request.

    Each request goes through ``coordinator.request(tuple, tokens=estimate)``: admitted in
    acceptance order once the tuple's gate is open, its budget holds it and a slot covers
    it (the task's current permit — an agent run under ``coordinator.permit``, as
    :class:`~lovely_coordinator_pydantic_ai.AgentTree` runs them — when that covers no
    other call at the moment, otherwise a slot of its own). It lasts until the response
    is complete (for a stream: until the stream's context exits, in whichever task), and
    the response's usage settles the charge.

    A :class:`lovely_coordinator_httpx.CoordinatedTransport` under the model's client
    joins the same request (one slot, one draw), settles it from the HTTP usage and teaches
    the handler the budget from the headers; the model owns the call and its retries.

    A provider limit closes the tuple (the shared handler); a 429 is retried by the model
    itself: the call is given back (no charge, no slot held), waits for the reopen keeping
    its acceptance order, and is sent again, up to ``max_attempts`` times, so turn the SDK
    client's own retries off (``max_retries=0``). A 429 inside a stream that already
    produced output is not retried. Successes move a half-open tuple towards its cap.

    Args:
        wrapped: the model (or a model name pydantic-ai can infer).
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        tuple: the model tuple; defaults to :func:`tuple_of` the wrapped model.
        handler: the limit handler; defaults to the coordinator's shared one
            (``ProviderLimitHandler.for_coordinator``), which every extension uses.
        reject_on_closed_tuple: fail with ``TupleSuspendedError`` rather than wait while
            the tuple is closed (a 429 is then not retried).
        max_attempts: sends of one request that 429s may take (default 5), an int ≥ 1.
        tokenizer: counts prompt tokens for the estimate; by default characters / 4.

    Raises:
        InvalidArgumentError: ``max_attempts`` is not an int ≥ 1, or a bad ``tuple``.
    """

    coordinator: AgentCoordinator
    tuple: ModelTuple
    handler: ProviderLimitHandler
    reject_on_closed_tuple: bool
    max_attempts: int

    def __init__(
        self,
        wrapped: Model | KnownModelName | str,
        *,
        coordinator: AgentCoordinator | None = None,
        tuple: ModelTupleLike | None = None,
        handler: ProviderLimitHandler | None = None,
        reject_on_closed_tuple: bool = False,
        max_attempts: int = 5,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgumentError("max_attempts must be a positive integer")
        super().__init__(wrapped)
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.tuple = as_model_tuple(tuple) if tuple is not None else tuple_of(self.wrapped)
        self.handler = (
            handler
            if handler is not None
            else ProviderLimitHandler.for_coordinator(self.coordinator)
        )
        self.reject_on_closed_tuple = reject_on_closed_tuple
        self.max_attempts = max_attempts
        self._tokenizer = tokenizer

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Send one request through the coordinator (see the class docstring)."""
        estimate = estimate_request(
            messages, model_settings, model_request_parameters, self._tokenizer
        )
        order: int | None = None
        for attempt in range(1, self.max_attempts + 1):
            async with self._attempt(estimate, order, attempt) as trial:
                response = await self.wrapped.request(
                    messages, model_settings, model_request_parameters
                )
                _settle(trial.draw, response.usage)
                return response
            order = trial.order  # reached only when the attempt met a 429 to retry
        raise AssertionError("unreachable: the last attempt raises")  # pragma: no cover

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """Open one streamed request; it lasts until the stream's context exits."""
        estimate = estimate_request(
            messages, model_settings, model_request_parameters, self._tokenizer
        )
        order: int | None = None
        for attempt in range(1, self.max_attempts + 1):
            async with (
                self._attempt(estimate, order, attempt) as trial,
                self.wrapped.request_stream(
                    messages, model_settings, model_request_parameters, run_context
                ) as stream,
            ):
                # Open: a 429 from here on is not retried (output may have reached the
                # caller already, and a context manager yields only once).
                trial.opened = True
                try:
                    yield stream
                finally:
                    _settle(trial.draw, stream.usage)
                return
            order = trial.order
        raise AssertionError("unreachable: the last attempt raises")  # pragma: no cover

    def _attempt(self, estimate: int, order: int | None, attempt: int) -> _Attempt:
        return _Attempt(self, estimate, order, attempt)


@final
class _Attempt:
    """One attempt: a model request of the coordinator around the body.

    A provider limit the body raises closes the gate (the shared handler) and gives the
    call back; a 429 of a call this layer owns, before a stream opened and while attempts
    remain, is then swallowed (``__aexit__`` returns ``True``), with ``order`` set for the
    next attempt, which waits for the reopen at the head of the line. Anything else
    propagates.
    """

    def __init__(self, model: CoordinatedModel, estimate: int, order: int | None, attempt: int):
        self._model = model
        self._attempt = attempt
        self._context = model.coordinator.request(
            model.tuple,
            tokens=estimate,
            acceptance_order=order,
            reject_on_closed_tuple=model.reject_on_closed_tuple,
        )
        self._owner = False
        self.draw: Draw | None = None
        self.opened = False
        self.order: int | None = None

    async def __aenter__(self) -> _Attempt:
        call = await self._context.__aenter__()
        self.draw, self._owner = self._model.handler.track(call)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        model, draw = self._model, self.draw
        assert draw is not None
        t, handler = model.tuple, model.handler
        retry = False
        try:
            if exc is None:
                handler.report_success(t, started_at=draw.started_at)
            elif isinstance(exc, Exception):
                limited = handler.observe(t, exc, started_at=draw.started_at)
                if limited:
                    draw.refused()
                retry = (
                    limited
                    and self._owner
                    and not self.opened
                    and not model.reject_on_closed_tuple
                    and self._attempt < model.max_attempts
                    and _is_429(exc)
                )
        finally:
            if self._owner:
                handler.finish(draw)
            with anyio.CancelScope(shield=True):
                await self._context.__aexit__(None, None, None)
        if retry:
            self.order = draw.request.acceptance_order
            _log.debug(
                "%s/%s: HTTP 429, sending again after the reopen (attempt %d of %d)",
                t.provider,
                t.model,
                self._attempt + 1,
                model.max_attempts,
            )
        return retry


def _is_429(error: BaseException) -> bool:
    return (
        isinstance(error, ModelHTTPError)
        and error.status_code == 429
        and not getattr(error, "in_stream", False)
    )


def _settle(draw: Draw | None, usage: RequestUsage) -> None:
    assert draw is not None
    used = usage.input_tokens + usage.output_tokens
    if used > 0:
        draw.settle(used)


def _texts(
    messages: list[ModelMessage], parameters: ModelRequestParameters | None
) -> Iterator[str]:
    for message in messages:
        instructions = getattr(message, "instructions", None)
        if isinstance(instructions, str):
            yield instructions
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                yield part.args_as_json_str()
            elif isinstance(part, ToolReturnPart):
                yield part.model_response_str()
            else:
                content = getattr(part, "content", None)
                if isinstance(content, str):
                    yield content
                elif isinstance(content, list | tuple):
                    yield from (item for item in content if isinstance(item, str))
    if parameters is not None:
        for tool in parameters.function_tools:
            yield tool.name
            yield tool.description or ""
            yield json.dumps(tool.parameters_json_schema)
