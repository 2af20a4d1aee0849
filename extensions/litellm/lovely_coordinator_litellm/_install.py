"""install(): every httpx-based litellm provider sends its requests through the coordinator.

litellm builds its HTTP clients itself, per provider and per event loop, and caches them.
There are two ways in:

- the public ``litellm.aclient_session`` / ``litellm.client_session``: one client for the
  whole process, used by the OpenAI-compatible providers only (``openai/``, ``azure/``);
  Anthropic and the other providers ignore them, and an async client made once is bound to
  the event loop it first ran on;
- the factory of the async transports (``AsyncHTTPHandler.create_async_transport``, a
  static method of litellm's HTTP handler module, not a documented API), which every
  async httpx client of litellm is built with, the OpenAI SDK's included; and
  ``litellm.sync_transport`` (an undocumented module attribute the sync handler reads).

So the async side replaces the factory: each client litellm builds gets the transport
litellm would have built, wrapped in a :class:`~lovely_coordinator_httpx.legacy.
CoordinatedTransport` (litellm's clients are of the older ``httpx``); litellm keeps
caching and closing its clients per event loop as before. The sync side needs no event
loop, so one :class:`~lovely_coordinator_httpx.legacy.CoordinatedSyncTransport` serves
every thread: through the public ``litellm.client_session`` (a client over it, for the
OpenAI-compatible providers, unless one is set already) and ``litellm.sync_transport``
(the others). What was replaced is put back by :meth:`Installation.uninstall`. The tested
litellm release is pinned in the distribution's requirements, since a private hook may
move in any release.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Unpack, final

import anyio
import httpx
import litellm
from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler
from lovely_coordinator_httpx.legacy import (
    CoordinatedSyncTransport,
    CoordinatedTransport,
    LegacyTransportOptions,
)
from lovely_coordinator_limits import ProviderLimitHandler

from lovely_coordinator import AgentCoordinator, UsageError

__all__ = ["Installation", "install"]

_FACTORIES = ("create_async_transport", "_create_async_transport")
_lock = threading.Lock()
_installed: Installation | None = None


@final
class Installation:
    """litellm routed through the coordinator, until :meth:`uninstall` puts litellm's own
    transports back. Made by :func:`install`.

    Also a context manager: ``with`` uninstalls at the block's end; ``async with`` first
    closes the HTTP clients litellm cached (:meth:`aclose`), so no connection outlives
    the block's event loop.
    """

    def __init__(
        self,
        coordinator: AgentCoordinator,
        handler: ProviderLimitHandler,
        sync: CoordinatedSyncTransport,
    ) -> None:
        self._coordinator = coordinator
        self._handler = handler
        self._sync = sync
        self._saved: dict[str, Any] = {}
        self._saved_module: dict[str, Any] = {}
        self._active = False

    @property
    def coordinator(self) -> AgentCoordinator:
        """The coordinator every routed request goes through."""
        return self._coordinator

    @property
    def handler(self) -> ProviderLimitHandler:
        """The limit handler the transports report to."""
        return self._handler

    @property
    def active(self) -> bool:
        """Whether litellm's requests are routed through the coordinator now."""
        return self._active

    def uninstall(self) -> None:
        """Put litellm's own transport factories back and drop the clients built with
        ours (their requests in flight finish as they are). Idempotent."""
        global _installed
        with _lock:
            if not self._active:
                return
            for name, value in self._saved.items():
                setattr(AsyncHTTPHandler, name, value)
            for name, value in self._saved_module.items():
                setattr(litellm, name, value)
            self._saved.clear()
            self._saved_module.clear()
            self._active = False
            _installed = None
        _forget_clients()
        self._sync.close()

    async def aclose(self) -> None:
        """Close litellm's cached async clients (litellm's public
        ``close_litellm_async_clients``), then :meth:`uninstall`. Idempotent."""
        try:
            with anyio.CancelScope(shield=True):
                await _close_litellm_async_clients()
        finally:
            self.uninstall()

    async def __aenter__(self) -> Installation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> Installation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.uninstall()


def install(
    coordinator: AgentCoordinator | None = None,
    **options: Unpack[LegacyTransportOptions],
) -> Installation:
    """Route every httpx-based litellm provider through ``coordinator``, sync and async.

    From now on every HTTP client litellm builds for ``acompletion``, ``aembedding``, ...
    (OpenAI-compatible providers through the OpenAI SDK, Anthropic and the others through
    litellm's own handler), and for their sync twins (``completion``, ... from any number
    of threads without an event loop), sends each model request through a coordinated
    transport: in
    acceptance order within the caps and budgets, 429s parked until the gate reopens and
    sent again (up to ``max_attempts``), budgets learned from the rate-limit headers, the
    usage settled. Clients litellm cached before are dropped, so they are built again.

    Pass ``max_retries=0`` (and no ``num_retries``) to litellm's calls, so that no retry of
    litellm's or the SDK's waits while holding a slot: the transport retries the 429s.

    Not covered: a client you pass yourself (``client=``, ``litellm.aclient_session``, a
    ``litellm.client_session`` set before), HTTP(S) proxies from the environment
    (bypassed by a coordinated client), ``litellm.force_ipv4`` (its own sync transport),
    and providers that do not use httpx (boto3 for Bedrock's SDK paths, websockets).

    Args:
        coordinator: defaults to the process-global ``get_agent_coordinator()``.
        handler: the limit handler; defaults to the coordinator's shared one.
        tuple_for: maps an ``httpx`` request to its tuple (``None``: unscheduled); by
            default the provider from the host (``providers``), the model from the body.
        providers: host → provider names for the default mapping.
        reject_on_closed_tuple: fail at once with ``TupleSuspendedError`` while a tuple's
            gate is closed, rather than wait.
        max_attempts: sends of one request that 429s may take, an int ≥ 1.
        learn_budgets: whether the rate-limit headers set budgets.
        tokenizer: counts prompt tokens; by default characters / 4.

    Returns:
        The installation; :meth:`Installation.uninstall` (or leaving it as a context
        manager) puts litellm's own transports back.

    Raises:
        UsageError: already installed (uninstall the other installation first).
        InvalidArgumentError: ``max_attempts`` is not an int ≥ 1.
    """
    global _installed
    # Validates the options now (InvalidArgumentError), not at litellm's first request.
    sync = CoordinatedSyncTransport(coordinator, **options)
    # The async transports, built later, on the coordinator and handler it resolved.
    coordinator, options["handler"] = sync.coordinator, sync.handler
    installation = Installation(coordinator, sync.handler, sync)
    with _lock:
        if _installed is not None:
            sync.close()
            raise UsageError(
                "lovely-coordinator is already installed in litellm; uninstall it first"
            )
        # litellm closes the clients it built when it drops them: the shared transport
        # must outlive them all, so they get it behind a close that does nothing.
        kept = _Kept(sync)
        module: dict[str, Any] = {"sync_transport": kept}
        if litellm.client_session is None:
            module["client_session"] = httpx.Client(transport=kept)
        for name, value in module.items():
            installation._saved_module[name] = getattr(litellm, name, None)
            setattr(litellm, name, value)
        original = AsyncHTTPHandler.__dict__["create_async_transport"]
        factory = staticmethod(_coordinated(original.__func__, coordinator, options))
        for name in _FACTORIES:
            installation._saved[name] = AsyncHTTPHandler.__dict__.get(name, original)
            setattr(AsyncHTTPHandler, name, factory)
        installation._active = True
        _installed = installation
    _forget_clients()
    return installation


# Public (exported at litellm's top level), though not typed there.
_close_litellm_async_clients: Callable[[], Awaitable[None]] = litellm.close_litellm_async_clients  # type: ignore[attr-defined]


def _coordinated(
    create: Callable[..., httpx.AsyncBaseTransport | None],
    coordinator: AgentCoordinator,
    options: LegacyTransportOptions,
) -> Callable[..., httpx.AsyncBaseTransport]:
    def create_async_transport(*args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        inner = create(*args, **kwargs)
        if inner is None:
            # litellm lets httpx build the default transport from the client's settings;
            # built here from the same ones, since the client now gets ours instead.
            ssl_context, ssl_verify = kwargs.get("ssl_context"), kwargs.get("ssl_verify")
            verify = ssl_context if ssl_context is not None else ssl_verify is not False
            limits = kwargs.get("limits") or httpx.Limits(max_connections=100)
            inner = httpx.AsyncHTTPTransport(verify=verify, cert=kwargs.get("cert"), limits=limits)
        return CoordinatedTransport(coordinator, transport=inner, **options)

    return create_async_transport


@final
class _Kept(httpx.BaseTransport):
    """The shared sync transport, as each litellm client sees it: closing it does nothing
    (the installation closes the real one when uninstalled)."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self._transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._transport.handle_request(request)

    def close(self) -> None:
        pass


def _forget_clients() -> None:
    # litellm caches its clients (per provider, per event loop); the ones built before a
    # change of factory would keep the transports they were built with.
    cache = getattr(litellm, "in_memory_llm_clients_cache", None)
    flush = getattr(cache, "flush_cache", None)
    if callable(flush):
        flush()
