"""coordinate(): a LangChain chat model whose SDK clients send every call through the coordinator.

``ChatOpenAI`` takes its HTTP clients as public fields (``http_client``,
``http_async_client``), but builds its SDK clients from them when it is constructed;
``ChatAnthropic`` takes none and builds its SDK clients lazily (``_client``,
``_async_client``, cached properties). So :func:`coordinate` works on a model already
built, as the user configured it (key, base URL, headers, timeout): it copies the model and
gives the copy SDK clients derived from the model's own with ``with_options`` (the SDKs'
public way to change a client), over HTTP clients whose transports are coordinated, and
with the SDK's retries off. The model passed in is left as it was.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Generic, TypeVar, Unpack, final

import httpx2
from langchain_core.language_models import BaseChatModel
from lovely_coordinator_httpx import (
    CoordinatedSyncTransport,
    CoordinatedTransport,
    TransportOptions,
)
from lovely_coordinator_limits import ProviderLimitHandler

from lovely_coordinator import AgentCoordinator, InvalidArgumentTypeError

__all__ = ["CoordinatedChat", "coordinate"]

ChatModelT = TypeVar("ChatModelT", bound=BaseChatModel)

_UNSUPPORTED = "coordinate() takes a ChatOpenAI (or AzureChatOpenAI) or a ChatAnthropic model"


@final
class CoordinatedChat(Generic[ChatModelT]):
    """A coordinated copy of a chat model, and the HTTP clients it was given.

    Use it as a context manager (``async with coordinate(model) as llm:``, or ``with`` in
    sync code), or take :attr:`model` and call :meth:`aclose` (:meth:`close` in sync code)
    when done.
    """

    def __init__(
        self,
        model: ChatModelT,
        http_client: httpx2.Client,
        http_async_client: httpx2.AsyncClient,
        handler: ProviderLimitHandler,
    ) -> None:
        self._model = model
        self._sync = http_client
        self._async = http_async_client
        self._handler = handler

    @property
    def model(self) -> ChatModelT:
        """The coordinated copy: use it wherever the original model was used."""
        return self._model

    @property
    def handler(self) -> ProviderLimitHandler:
        """The limit handler the transports report to."""
        return self._handler

    @property
    def http_client(self) -> httpx2.Client:
        """The coordinated sync HTTP client the model's sync SDK client uses."""
        return self._sync

    @property
    def http_async_client(self) -> httpx2.AsyncClient:
        """The coordinated async HTTP client the model's async SDK client uses."""
        return self._async

    def close(self) -> None:
        """Close the sync HTTP client (the async one holds no connection unless used from
        an event loop: close it there with :meth:`aclose`). Idempotent."""
        self._sync.close()

    async def aclose(self) -> None:
        """Close both HTTP clients (their connections). Idempotent."""
        self._sync.close()
        await self._async.aclose()

    def __enter__(self) -> ChatModelT:
        return self._model

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> ChatModelT:
        return self._model

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


def coordinate(
    model: ChatModelT,
    coordinator: AgentCoordinator | None = None,
    **options: Unpack[TransportOptions],
) -> CoordinatedChat[ChatModelT]:
    """A copy of ``model`` whose every call is one ``coordinator.request()``.

    The copy's SDK clients keep the model's settings (key, base URL, headers, timeout)
    over HTTP clients with a :class:`~lovely_coordinator_httpx.CoordinatedTransport` (async)
    and a :class:`~lovely_coordinator_httpx.CoordinatedSyncTransport` (sync, from any
    number of threads without an event loop):
    each call is admitted in acceptance order within the caps and the tuple's budget
    (learned from the provider's rate-limit headers), runs on the current permit when the
    task holds one that covers no other call, is settled from the usage the response
    reports (streams included), and a 429 is parked until the gate reopens, holding no
    slot, and sent again (``max_attempts``). The SDK's own retries are turned off.

    Args:
        model: a ``ChatOpenAI`` / ``AzureChatOpenAI`` (langchain-openai) or a
            ``ChatAnthropic`` (langchain-anthropic); left unchanged.
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        handler: the limit handler; defaults to the coordinator's shared one.
        tuple_for: maps a request to its tuple; by default the provider from the host
            (``providers``), the model from the body.
        providers: host → provider names for the default mapping.
        reject_on_closed_tuple: fail at once with ``TupleSuspendedError`` while the
            tuple's gate is closed (for foreground work), rather than wait.
        max_attempts: sends of one request that 429s may take, an int ≥ 1.
        learn_budgets: whether the rate-limit headers set budgets.
        tokenizer: counts prompt tokens; by default characters / 4.

    Returns:
        The coordinated copy (:attr:`CoordinatedChat.model`) with its HTTP clients.

    Raises:
        InvalidArgumentTypeError: ``model`` is of another kind.
        InvalidArgumentError: ``max_attempts`` is not an int ≥ 1.
    """
    kind = _kind(model)
    sync = CoordinatedSyncTransport(coordinator, **options)
    # The SDKs send their own timeouts with each request; the clients add none.
    sync_http = httpx2.Client(transport=sync)
    async_http = httpx2.AsyncClient(transport=CoordinatedTransport(sync.coordinator, **options))
    build = _openai if kind == "openai" else _anthropic
    return CoordinatedChat(build(model, sync_http, async_http), sync_http, async_http, sync.handler)


def _kind(model: object) -> str:
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:  # pragma: no cover - the extra is not installed
        pass
    else:
        if isinstance(model, BaseChatOpenAI):
            return "openai"
    try:
        from langchain_anthropic import ChatAnthropic
    except ImportError:  # pragma: no cover - the extra is not installed
        pass
    else:
        if isinstance(model, ChatAnthropic):
            return "anthropic"
    raise InvalidArgumentTypeError(_UNSUPPORTED)


def _openai(
    model: ChatModelT, sync_http: httpx2.Client, async_http: httpx2.AsyncClient
) -> ChatModelT:
    # Public fields of BaseChatOpenAI; the SDK clients are derived from the ones the model
    # built, so every setting it resolved (key, base URL, organization, headers) stays.
    # A model without a sync key has no sync client: it stays without one.
    fields: dict[str, Any] = {
        "max_retries": 0,
        "http_client": sync_http,
        "http_async_client": async_http,
    }
    root = getattr(model, "root_client", None)
    if root is not None:
        root = root.with_options(http_client=sync_http, max_retries=0)
        fields["root_client"] = root
        fields["client"] = root.chat.completions
    root_async = getattr(model, "root_async_client", None)
    if root_async is not None:
        root_async = root_async.with_options(http_client=async_http, max_retries=0)
        fields["root_async_client"] = root_async
        fields["async_client"] = root_async.chat.completions
    return model.model_copy(update=fields)


def _anthropic(
    model: ChatModelT, sync_http: httpx2.Client, async_http: httpx2.AsyncClient
) -> ChatModelT:
    # ChatAnthropic has no client fields: its SDK clients are the cached properties
    # `_client` and `_async_client` (private names, the only way in). The copy's cache
    # slots hold coordinated clients derived from the model's own.
    copy = model.model_copy(update={"max_retries": 0})
    for name, http in (("_client", sync_http), ("_async_client", async_http)):
        client = getattr(model, name)
        vars(copy)[name] = client.with_options(http_client=http, max_retries=0)
    return copy
