"""The shells around the flow: a gate's settings, and how each kind of transport performs
the flow's steps (``_flow``) — with ``await`` for async clients, blocking for sync ones.

One constructor and one loop serve all four transports (async and sync, ``httpx2`` and the
older ``httpx``): a public transport only names its library's pieces (``_bodies``) and its
default wrapped transport.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any, Generic, Protocol, TypedDict, TypeVar, final

import anyio
from lovely_coordinator_limits import (
    ModelTupleLike,
    ProviderLimitHandler,
    Tokenizer,
    as_model_tuple,
    estimate_tokens,
)

from lovely_coordinator import (
    AdmissionTimeoutError,
    AgentCoordinator,
    InvalidArgumentError,
    UsageError,
    get_agent_coordinator,
)

from ._bodies import Generation, Watch
from ._flow import Admit, Admitted, Call, Discard, Read, ResponseLike, Send, Step, exchange
from ._flow import pool_timeout as pool_timeout_of
from ._tuples import DEFAULT_PROVIDERS, RequestLike, tuple_for_request

__all__ = ["AsyncGated", "Gate", "Options", "SyncGated"]

_ATTEMPTS_MESSAGE = "max_attempts must be a positive integer"

RequestT = TypeVar("RequestT", bound=RequestLike)
ResponseT = TypeVar("ResponseT", bound=ResponseLike)
_RequestIn = TypeVar("_RequestIn", bound=RequestLike, contravariant=True)
_ResponseOut = TypeVar("_ResponseOut", bound=ResponseLike, covariant=True)
_T = TypeVar("_T")


@final
class Gate(Generic[RequestT, ResponseT]):
    """A transport's settings, and the flow of each of its requests.

    Args:
        coordinator: admits the requests (default: the process-global one).
        handler: closes gates and learns budgets (default: the coordinator's shared one).
        tuple_for: request → tuple, or ``None`` to send it unscheduled.
        providers: host → provider names for the default mapping.
        watch: the transport kind's body wrapper (see :data:`Watch`).
        reject_on_closed_tuple: passed to ``request()``; such requests are never retried.
        max_attempts: sends of one request that a 429 may take, an int ≥ 1.
        learn_budgets: whether responses' rate-limit headers set budgets.
        tokenizer: counts prompt tokens for the estimate (default: characters / 4).

    Raises:
        InvalidArgumentError: ``max_attempts`` is not an int ≥ 1.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator | None,
        handler: ProviderLimitHandler | None,
        tuple_for: Callable[[RequestT], ModelTupleLike | None] | None,
        providers: Mapping[str, str],
        watch: Watch,
        *,
        reject_on_closed_tuple: bool,
        max_attempts: int,
        learn_budgets: bool,
        tokenizer: Tokenizer | None,
    ) -> None:
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgumentError(_ATTEMPTS_MESSAGE)
        self.coordinator = coordinator if coordinator is not None else get_agent_coordinator()
        self.handler = (
            handler
            if handler is not None
            else ProviderLimitHandler.for_coordinator(self.coordinator)
        )
        if tuple_for is None:
            known = dict(providers)

            def tuple_for(request: RequestT) -> ModelTupleLike | None:
                return tuple_for_request(request, known)

        self._tuple_for = tuple_for
        self._watch = watch
        self.reject = reject_on_closed_tuple
        self.max_attempts = max_attempts
        self.learn = learn_budgets
        self._tokenizer = tokenizer

    def watch(self, response: ResponseT, call: Call) -> bool:
        return self._watch(response, call)

    def flow(self, request: RequestT) -> Generator[Step, Any, ResponseT]:
        """The steps of sending ``request`` (see ``_flow``)."""
        found = self._tuple_for(request)
        if found is None:
            return exchange(self, None, 0, None)
        t = as_model_tuple(found)
        try:
            content = request.content
        except Exception:  # RequestNotRead (of either httpx): a streaming upload
            estimate = 0
        else:
            estimate = estimate_tokens(content, self._tokenizer)
        return exchange(self, t, estimate, pool_timeout_of(request))


class Options(TypedDict, Generic[RequestT], total=False):
    """The transports' keyword arguments but ``transport``, for code that builds
    transports with the caller's settings (``**options: Unpack[TransportOptions]``);
    what each means is said on ``CoordinatedTransport``."""

    handler: ProviderLimitHandler | None
    tuple_for: Callable[[RequestT], ModelTupleLike | None] | None
    providers: Mapping[str, str]
    reject_on_closed_tuple: bool
    max_attempts: int
    learn_budgets: bool
    tokenizer: Tokenizer | None


class _AsyncInner(Protocol[_RequestIn, _ResponseOut]):
    async def handle_async_request(self, request: _RequestIn, /) -> _ResponseOut: ...

    async def aclose(self) -> None: ...


class _SyncInner(Protocol[_RequestIn, _ResponseOut]):
    def handle_request(self, request: _RequestIn, /) -> _ResponseOut: ...

    def close(self) -> None: ...


InnerT = TypeVar("InnerT")
_AsyncInnerT = TypeVar("_AsyncInnerT", bound="_AsyncInner[Any, Any]")
_SyncInnerT = TypeVar("_SyncInnerT", bound="_SyncInner[Any, Any]")


class _Shared(Generic[RequestT, ResponseT, InnerT]):
    """The constructor of every transport, and what every kind exposes.

    A public transport names its library's pieces: ``_generation`` (``_bodies.generation``)
    and ``_new_inner``, which builds the wrapped transport when none is passed.
    """

    _generation: Generation
    _new_inner: Callable[[], InnerT]

    def __init__(
        self,
        coordinator: AgentCoordinator | None = None,
        *,
        transport: InnerT | None = None,
        handler: ProviderLimitHandler | None = None,
        tuple_for: Callable[[RequestT], ModelTupleLike | None] | None = None,
        providers: Mapping[str, str] = DEFAULT_PROVIDERS,
        reject_on_closed_tuple: bool = False,
        max_attempts: int = 5,
        learn_budgets: bool = True,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        """The arguments are documented on the class (``CoordinatedTransport``)."""
        self._gate: Gate[RequestT, ResponseT] = Gate(
            coordinator,
            handler,
            tuple_for,
            providers,
            self._watch(),
            reject_on_closed_tuple=reject_on_closed_tuple,
            max_attempts=max_attempts,
            learn_budgets=learn_budgets,
            tokenizer=tokenizer,
        )
        self._inner = transport if transport is not None else self._new_inner()

    def _watch(self) -> Watch:
        raise NotImplementedError  # pragma: no cover - each kind says

    @property
    def coordinator(self) -> AgentCoordinator:
        """The coordinator that admits this transport's requests."""
        return self._gate.coordinator

    @property
    def handler(self) -> ProviderLimitHandler:
        """The handler that limits and budgets are reported to."""
        return self._gate.handler

    @property
    def max_attempts(self) -> int:
        """How many times one request may be sent when the provider answers 429."""
        return self._gate.max_attempts

    def _timed_out(self, step: Admit, request: RequestT) -> Exception:
        message = (
            f"{step.t.provider}/{step.t.model}: not admitted by the coordinator within the "
            f"pool timeout ({step.timeout:g} s)"
        )
        return self._generation.pool_timeout(message, request=request)  # type: ignore[call-arg]


class AsyncGated(_Shared[RequestT, ResponseT, _AsyncInnerT]):
    """The async transports: each step awaited."""

    _sync_name: str  # the sync transport to use instead, for the error message

    def _watch(self) -> Watch:
        return self._generation.watch_async

    async def handle_async_request(self, request: RequestT) -> ResponseT:
        """Send ``request`` through the coordinator (see ``CoordinatedTransport``).

        Raises:
            PoolTimeout: not admitted within the request's ``pool`` timeout.
            TupleSuspendedError: the tuple is closed and ``reject_on_closed_tuple`` is set.
            CoordinatorBusyError: the coordinator's ``max_queued`` waiters already wait.
        """
        return await _drive(self._gate.flow(request), lambda step: self._perform(step, request))

    async def _perform(self, step: Step, request: RequestT) -> Any:
        if isinstance(step, Send):
            return await self._inner.handle_async_request(request)
        if isinstance(step, Admit):
            return await self._admit(step, request)
        if isinstance(step, Read):
            return await step.response.aread()
        assert isinstance(step, Discard)
        # Shielded: a cancelled caller still hands the connection back to the pool.
        with anyio.CancelScope(shield=True):
            await step.response.aclose()
        return None

    async def _admit(self, step: Admit, request: RequestT) -> Admitted:
        gate = self._gate
        context = gate.coordinator.request(
            step.t,
            tokens=step.tokens,
            acceptance_order=step.order,
            reject_on_closed_tuple=gate.reject,
            # The request context stays open after this returns (a streamed body), but
            # the caller's code is not inside it: were it current, the task's next call
            # of this tuple would join this one (two calls, one slot, one draw).
            current=False,
        )
        try:
            with anyio.fail_after(step.timeout):
                model_request = await context.__aenter__()
        except TimeoutError:
            raise self._timed_out(step, request) from None
        # A request context's exit never waits (it releases under the coordinator's
        # lock), so it can run where nothing may be awaited: a sync close, a finalizer.
        return Admitted(model_request, lambda: _finish(context.__aexit__(None, None, None)))

    def handle_request(self, request: object) -> Any:
        """A sync client called this async transport: it says which one to use."""
        raise self._wrong_client()

    def __enter__(self) -> Any:
        """A sync client entered this async transport: it says which one to use."""
        raise self._wrong_client()

    def close(self) -> None:
        """A sync client closes what it could never use: nothing to do."""

    def _wrong_client(self) -> UsageError:
        name = type(self).__name__
        return UsageError(
            f"{name} serves async clients (httpx2.AsyncClient, openai.AsyncOpenAI, "
            f"anthropic.AsyncAnthropic); a sync client needs {self._sync_name}"
        )

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._inner.aclose()


class SyncGated(_Shared[RequestT, ResponseT, _SyncInnerT]):
    """The sync transports: each step blocks its thread (admission: ``request_sync``)."""

    _async_name: str  # the async transport to use instead, for the error message

    def _watch(self) -> Watch:
        return self._generation.watch_sync

    def handle_request(self, request: RequestT) -> ResponseT:
        """Send ``request`` through the coordinator (see ``CoordinatedSyncTransport``).

        Raises:
            PoolTimeout: not admitted within the request's ``pool`` timeout.
            TupleSuspendedError: the tuple is closed and ``reject_on_closed_tuple`` is set.
            CoordinatorBusyError: the coordinator's ``max_queued`` waiters already wait.
            UsageError: called in a thread that runs an event loop (blocking it could
                stop the very release the call waits for): use the async transport.
        """

        # The async shell's loop, driving steps that block instead of suspending: the
        # coroutine runs to its end in one send, with no event loop.
        async def perform(step: Step) -> Any:
            return self._perform(step, request)

        return _finish(_drive(self._gate.flow(request), perform))

    def _perform(self, step: Step, request: RequestT) -> Any:
        if isinstance(step, Send):
            return self._inner.handle_request(request)
        if isinstance(step, Admit):
            gate = self._gate
            context = gate.coordinator.request_sync(
                step.t,
                tokens=step.tokens,
                acceptance_order=step.order,
                reject_on_closed_tuple=gate.reject,
                timeout=step.timeout,
            )
            try:
                model_request = context.__enter__()
            except AdmissionTimeoutError:
                raise self._timed_out(step, request) from None
            return Admitted(model_request, lambda: context.__exit__(None, None, None))
        if isinstance(step, Read):
            return step.response.read()
        assert isinstance(step, Discard)
        step.response.close()
        return None

    async def handle_async_request(self, request: object) -> Any:
        """An async client called this sync transport: it says which one to use."""
        raise self._wrong_client()

    async def __aenter__(self) -> Any:
        """An async client entered this sync transport: it says which one to use."""
        raise self._wrong_client()

    async def aclose(self) -> None:
        """An async client closes it: the wrapped transport is closed (that never waits)."""
        self._inner.close()

    def _wrong_client(self) -> UsageError:
        name = type(self).__name__
        return UsageError(
            f"{name} serves sync clients (httpx2.Client, openai.OpenAI, anthropic.Anthropic); "
            f"an async client needs {self._async_name}"
        )

    def close(self) -> None:
        """Close the wrapped transport."""
        self._inner.close()


async def _drive(
    flow: Generator[Step, Any, ResponseT], perform: Callable[[Step], Awaitable[Any]]
) -> ResponseT:
    """Run ``flow``: perform each step it yields and send the result back, or throw the
    failure in (the flow cleans up); its return value is the response."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = flow.send(value) if error is None else flow.throw(error)
        except StopIteration as stop:
            result: ResponseT = stop.value
            return result
        value = error = None
        try:
            value = await perform(step)
        except BaseException as exc:  # thrown into the flow, which cleans up
            error = exc


def _finish(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that never suspends to its end, where nothing may be awaited."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        result: _T = stop.value
        return result
    coroutine.close()  # pragma: no cover - callers pass coroutines that never suspend
    raise AssertionError("a coroutine that never suspends suspended")  # pragma: no cover
