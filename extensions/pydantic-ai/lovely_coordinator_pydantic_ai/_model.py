"""CoordinatedModel: a pydantic-ai model whose every request runs under a coordinator permit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from lovely_coordinator_limits import ModelTupleLike, ProviderLimitHandler, as_model_tuple
from pydantic_ai import RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import KnownModelName, Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from lovely_coordinator import AgentCoordinator, ModelTuple, get_agent_coordinator

__all__ = ["CoordinatedModel", "tuple_of"]


def tuple_of(model: Model) -> ModelTuple:
    """The default tuple of a pydantic-ai model: ``(model.system, model.model_name)``.

    ``system`` is pydantic-ai's provider name (``"openai"``, ``"anthropic"``, ...; ``"test"``
    and ``"function"`` for the offline models).
    """
    return ModelTuple(model.system, model.model_name)


class CoordinatedModel(WrapperModel):
    """Wraps a pydantic-ai model so that each request (streamed or not) holds a permit.

    The permit is for the model's ``(provider, model)`` tuple and is held from before the
    request is sent until its response is complete (for a stream: until the stream's
    context exits). For a plain request the permit is also the current permit
    (``current_permit()``), so a :class:`lovely_coordinator_httpx.CoordinatedTransport`
    underneath does not take a second one; a stream's is not (pydantic-ai may close the
    stream from another task), so do not stack the two for streamed requests.

    A request made while the task already holds a permit of the model's coordinator (an
    agent run under ``coordinator.permit(...)``, as
    :class:`~lovely_coordinator_pydantic_ai.AgentTree` runs them; see
    ``AgentCoordinator.current_permit()``) uses that one instead of queueing for a second
    slot behind itself. A permit of another coordinator (the Bash pool) does not count.

    Failures are reported to the limit handler, which closes the tuple on a provider limit;
    successes end a half-open probe.

    Args:
        wrapped: the model (or a model name pydantic-ai can infer).
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        tuple: the model tuple; defaults to :func:`tuple_of` the wrapped model.
        handler: the limit handler; defaults to the coordinator's shared one
            (``ProviderLimitHandler.for_coordinator``), which every extension uses.
        reject_on_closed_tuple: fail with ``TupleSuspendedError`` rather than wait while
            the tuple is closed.
    """

    coordinator: AgentCoordinator
    tuple: ModelTuple
    handler: ProviderLimitHandler
    reject_on_closed_tuple: bool

    def __init__(
        self,
        wrapped: Model | KnownModelName | str,
        *,
        coordinator: AgentCoordinator | None = None,
        tuple: ModelTupleLike | None = None,
        handler: ProviderLimitHandler | None = None,
        reject_on_closed_tuple: bool = False,
    ) -> None:
        super().__init__(wrapped)
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.tuple = as_model_tuple(tuple) if tuple is not None else tuple_of(self.wrapped)
        self.handler = (
            handler
            if handler is not None
            else ProviderLimitHandler.for_coordinator(self.coordinator)
        )
        self.reject_on_closed_tuple = reject_on_closed_tuple

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Send one request under a permit (see the class docstring)."""
        async with self._permitted(current=True):
            return await self.wrapped.request(messages, model_settings, model_request_parameters)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """Open one streamed request; the permit is held until the stream's context exits."""
        # pydantic-ai may leave this context in another task than it entered it in, so the
        # permit cannot be made current (a context variable must be reset where it was set).
        async with (
            self._permitted(current=False),
            self.wrapped.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as stream,
        ):
            yield stream

    @asynccontextmanager
    async def _permitted(self, *, current: bool) -> AsyncIterator[None]:
        t = self.tuple
        reject = self.reject_on_closed_tuple
        async with AsyncExitStack() as stack:
            inherited = self.coordinator.current_permit()  # of this coordinator only
            if inherited is None or not inherited.held:
                if current:
                    await stack.enter_async_context(
                        self.coordinator.permit(t, reject_on_closed_tuple=reject)
                    )
                else:
                    permit = await self.coordinator.acquire(t, reject_on_closed_tuple=reject)
                    # release() is synchronous and idempotent: safe on any exit path.
                    stack.callback(permit.release)
            started_at = anyio.current_time()
            try:
                yield
            except Exception as exc:
                self.handler.observe(t, exc, started_at=started_at)
                raise
            self.handler.report_success(t, started_at=started_at)
