"""A local fake model provider, for testing rate-limit handling against real SDK clients.

:class:`FakeProvider` is a plain ASGI app speaking just enough of the OpenAI chat
completions and responses, Anthropic messages and Gemini APIs (see ``_fake_wire``), JSON or
streamed, with ``usage`` in every answer, and calling tools when asked to
(``use_tools``, see ``_fake_tools``). Per model it can:

- enforce rate limits (:meth:`FakeProvider.limit` with a :class:`Quota`): token buckets of
  a short window of the announced per-minute rates, as providers enforce them, with the
  ``x-ratelimit-*`` / ``anthropic-ratelimit-*`` headers of that enforcement on every
  answer and 429s (with ``retry-after``) when a bucket is short;
- answer with a script of refusals first (:meth:`FakeProvider.script`, :class:`Refuse`);
- hold requests until released (:meth:`FakeProvider.pause`), so a test can look at what
  is in flight (:meth:`FakeProvider.in_flight`, :meth:`FakeProvider.wait_for_in_flight`,
  :meth:`FakeProvider.peak_in_flight`).

Like a real provider it compresses its answers (gzip, else deflate) when the request's
``Accept-Encoding`` allows it, as the SDKs' clients ask by default; set
``compress=False`` to answer uncompressed.

:func:`serve` runs an app with uvicorn (``h11``) on a free port of 127.0.0.1 in a
background thread, so a test on any event loop (asyncio or trio) can point ``base_url``
at it. For pytest, three fixtures wrap this: ``fake_provider_server`` serves one provider
per test module, ``fake_provider`` is that provider with its scripts, limits and records
reset for the test, and ``fake_provider_url`` its base URL. Import them into a
``conftest.py``::

    from lovely_coordinator_limits.testing import (
        fake_provider as fake_provider,
        fake_provider_server as fake_provider_server,
        fake_provider_url as fake_provider_url,
    )

Requires the ``testing`` extra (uvicorn, pytest).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, final

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from ._fake_quota import Buckets, Quota
from ._fake_wire import Api, Ask, answer_text, completion, error_body, parse_ask, stream_events

__all__ = [
    "Api",
    "FakeProvider",
    "Quota",
    "Refuse",
    "Seen",
    "fake_provider",
    "fake_provider_server",
    "fake_provider_url",
    "openai_sse_on_trio",
    "serve",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ALL = "\0all"  # the in-flight key counting every model (no model name contains NUL)

openai_sse_on_trio = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <async_generator object "
    r"(SSEDecoder|AsyncStream|Response|AsyncHTTP11Connection|HTTP11ConnectionByteStream"
    r"|PoolByteStream|AsyncResponseStream|BoundAsyncStream|_MeteredIterator)\.:"
    "pytest.PytestUnraisableExceptionWarning"
)
"""Filters the warnings of the openai SDK's unfinished stream generators (a test mark).

The openai SDK iterates its server-sent events through a chain of async generators (its
own, httpx2's, httpcore2's) and stops at ``[DONE]``, or on cancellation, without closing
them; on trio their finalizer then warns (asyncio stays silent). Mark such tests with it,
and collect garbage (``gc.collect()``) before they end, so the warnings land in the test
that is filtered and not in a later one.
"""


@final
@dataclass(frozen=True, slots=True)
class Refuse:
    """One scripted error response.

    Attributes:
        status: the HTTP status (429 by default).
        headers: extra response headers, e.g. ``{"retry-after": "2"}``.
        body: the JSON error body; ``None`` for the API's usual rate-limit body.
    """

    status: int = 429
    headers: Mapping[str, str] = field(default_factory=dict)
    body: object = None


@final
@dataclass(frozen=True, slots=True)
class Seen:
    """A request the provider received, and what it answered.

    Attributes:
        api: which API it was sent to.
        model: the model it named.
        stream: whether it asked for a stream.
        status: the answer's status (429 for a quota's refusal or a scripted one).
        at: when it arrived (``time.monotonic()``).
        input_tokens: the prompt's tokens as the provider counted them (0 when refused).
        output_tokens: the tokens the answer generated (0 when refused).
    """

    api: Api
    model: str
    stream: bool
    status: int
    at: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0


@final
class FakeProvider:
    """An ASGI app imitating model providers; configuration and records are thread-safe.

    Args:
        reply: the text every completion answers with (cut to the request's output
            limit); ``None`` answers with as many tokens as the output limit allows.
        latency: seconds each answer takes before its first byte.
        compress: whether answers are compressed when the request accepts it.
        use_tools: whether a request that offers tools, and holds no tool result yet, is
            answered with a call of its first tool (so an agent delegates once, then
            answers); otherwise every answer is text.
    """

    def __init__(
        self,
        reply: str | None = "ok",
        *,
        latency: float = 0.0,
        compress: bool = True,
        use_tools: bool = False,
    ) -> None:
        self.reply = reply
        self.latency = latency
        self.compress = compress
        self.use_tools = use_tools
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._scripts: dict[str, deque[Refuse]] = {}
        self._quotas: dict[str, Quota] = {}
        self._buckets: dict[str, Buckets] = {}
        self._seen: list[Seen] = []
        self._in_flight: Counter[str] = Counter()
        self._peak: Counter[str] = Counter()
        self._paused: dict[str, anyio.Event | None] = {}
        self._token: anyio.lowlevel.EventLoopToken | None = None

    def script(self, model: str, *refusals: Refuse) -> None:
        """Queue ``refusals`` as the next answers for ``model``; then it answers again."""
        with self._lock:
            self._scripts.setdefault(model, deque()).extend(refusals)

    def limit(self, model: str, quota: Quota | None) -> None:
        """Enforce ``quota`` for ``model`` from now on, its buckets full (``None``: no limits)."""
        with self._lock:
            self._buckets.pop(model, None)
            if quota is None:
                self._quotas.pop(model, None)
            else:
                self._quotas[model] = quota
                self._buckets[model] = Buckets(quota, time.monotonic())

    def pause(self, model: str) -> None:
        """Hold every request for ``model`` (once counted in flight) until :meth:`resume`."""
        with self._lock:
            self._paused.setdefault(model, None)

    def resume(self, model: str) -> None:
        """Let ``model``'s held requests, and later ones, through."""
        with self._lock:
            event = self._paused.pop(model, None)
            token = self._token
        if event is not None and token is not None:
            anyio.from_thread.run_sync(event.set, token=token)

    def seen(self, model: str | None = None) -> list[Seen]:
        """The requests received so far (for ``model`` only, if given), oldest first."""
        with self._lock:
            return [s for s in self._seen if model is None or s.model == model]

    def in_flight(self, model: str | None = None) -> int:
        """The requests (for ``model``, or in all) being answered right now."""
        with self._lock:
            return self._in_flight[model if model is not None else _ALL]

    def peak_in_flight(self, model: str | None = None) -> int:
        """The most requests (for ``model``, or in all) that were answered at the same time."""
        with self._lock:
            return self._peak[model if model is not None else _ALL]

    def wait_for_in_flight(self, model: str | None, count: int, timeout: float = 10.0) -> bool:
        """Block this thread until ``count`` requests are in flight; ``False`` on timeout.

        From async code: ``await anyio.to_thread.run_sync(provider.wait_for_in_flight, ...)``.
        """
        key = model if model is not None else _ALL
        with self._changed:
            return self._changed.wait_for(lambda: self._in_flight[key] >= count, timeout)

    def forgive(self, model: str | None = None) -> None:
        """Drop the refusals still scripted (for ``model``, or for every model)."""
        with self._lock:
            if model is None:
                self._scripts.clear()
            else:
                self._scripts.pop(model, None)

    def reset(self) -> None:
        """Forget scripts, limits, pauses and records (held requests are let through)."""
        for model in list(self._paused):
            self.resume(model)
        with self._lock:
            self._scripts.clear()
            self._quotas.clear()
            self._buckets.clear()
            self._seen.clear()
            self._in_flight.clear()
            self._peak.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        encoding = _encoding(scope) if self.compress else None
        ask = parse_ask(scope["method"], scope["path"], body)
        if ask is None:
            await _send_json(send, 404, {"error": {"message": "not found"}})
            return
        if not self.use_tools:
            ask = dataclasses.replace(ask, tool_call=None)
        now, wall = time.monotonic(), datetime.now(UTC)
        with self._changed:
            self._token = anyio.lowlevel.current_token()
            queue = self._scripts.get(ask.model)
            refusal = queue.popleft() if queue else None
            buckets = self._buckets.get(ask.model)
            admission = None
            if refusal is None and buckets is not None:
                admission = buckets.admit(
                    prompt=ask.prompt_tokens, output_limit=ask.output_limit, now=now
                )
            headers = _limit_headers(ask.api, buckets, wall)
            refused = refusal is not None or (admission is not None and not admission.admitted)
            text, output, cut = answer_text(self.reply, ask.output_limit)
            if ask.tool_call is not None:
                text, output, cut = "", ask.tool_call.tokens, False
            status = refusal.status if refusal is not None else 429 if refused else 200
            served = (ask.prompt_tokens, output) if not refused else (0, 0)
            self._seen.append(Seen(ask.api, ask.model, ask.stream, status, now, *served))
            for key in (ask.model, _ALL):
                self._in_flight[key] += 1
                self._peak[key] = max(self._peak[key], self._in_flight[key])
            self._changed.notify_all()
            held = self._hold(ask.model)
        try:
            if held is not None:
                await held.wait()
            if refusal is not None:
                error = refusal.body
                if error is None:
                    error = error_body(ask.api, refusal.status, "Rate limit reached for requests")
                await _send_json(
                    send, refusal.status, error, {**headers, **refusal.headers}, encoding
                )
                return
            if admission is not None and not admission.admitted:
                wait = admission.retry_after
                headers["retry-after"] = str(max(1, round(wait + 0.5)))
                headers["retry-after-ms"] = str(max(1, round(wait * 1000)))
                message = f"Rate limit reached for {ask.model}; try again in {wait:.3f}s"
                await _send_json(send, 429, error_body(ask.api, 429, message), headers, encoding)
                return
            if self.latency > 0:
                await anyio.sleep(self.latency)
            if buckets is not None:
                with self._lock:
                    buckets.give_back(ask.output_limit - output, time.monotonic())
            await self._answer(send, ask, text, output, cut, headers, encoding)
        finally:
            with self._changed:
                self._in_flight[ask.model] -= 1
                self._in_flight[_ALL] -= 1
                self._changed.notify_all()

    def _hold(self, model: str) -> anyio.Event | None:
        # Called under the lock, in the server's event loop.
        if model not in self._paused:
            return None
        event = self._paused[model]
        if event is None:
            event = self._paused[model] = anyio.Event()
        return event

    async def _answer(
        self,
        send: Send,
        ask: Ask,
        text: str,
        output: int,
        cut: bool,
        headers: dict[str, str],
        encoding: str | None,
    ) -> None:
        if ask.stream:
            await _send_stream(send, stream_events(ask, text, output, cut), headers, encoding)
        else:
            await _send_json(send, 200, completion(ask, text, output, cut), headers, encoding)


def _limit_headers(api: Api, buckets: Buckets | None, wall: datetime) -> dict[str, str]:
    if buckets is None or api == "gemini":
        return {}
    return (
        buckets.openai_headers()
        if api in ("openai", "responses")
        else buckets.anthropic_headers(wall)
    )


@contextmanager
def serve(app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> Iterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1 in a background thread.

    Yields:
        The base URL, like ``http://127.0.0.1:54321``. The socket listens before this
        yields, so requests may be sent at once.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="off", log_level="warning", access_log=False, http="h11", backlog=1024
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="fake-provider", daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def fake_provider_server() -> Iterator[tuple[FakeProvider, str]]:
    """A :class:`FakeProvider` served on loopback for one test module, and its base URL."""
    provider = FakeProvider()
    with serve(provider) as url:
        yield provider, url


@pytest.fixture
def fake_provider(fake_provider_server: tuple[FakeProvider, str]) -> Iterator[FakeProvider]:
    """The module's served :class:`FakeProvider`, with nothing left over from other tests."""
    provider = fake_provider_server[0]
    provider.reset()
    provider.reply, provider.latency, provider.use_tools = "ok", 0.0, False
    yield provider
    provider.reset()  # lets requests a failed test left held go


@pytest.fixture
def fake_provider_url(fake_provider_server: tuple[FakeProvider, str]) -> str:
    """The base URL of the module's served :class:`FakeProvider`."""
    return fake_provider_server[1]


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _encoding(scope: Scope) -> str | None:
    """The compression the request accepts that the provider uses: gzip, else deflate."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"accept-encoding":
            offered = {part.split(b";")[0].strip().lower() for part in value.split(b",")}
            for encoding in (b"gzip", b"deflate"):
                if encoding in offered:
                    return encoding.decode()
    return None


def _compressor(encoding: str) -> Any:
    # gzip: zlib's gzip wrapper; deflate: the zlib-wrapped form most servers send.
    return zlib.compressobj(wbits=zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)


async def _send_json(
    send: Send,
    status: int,
    payload: object,
    headers: Mapping[str, str] | None = None,
    encoding: str | None = None,
) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json")]
    if encoding is not None:
        compressor = _compressor(encoding)
        body = compressor.compress(body) + compressor.flush()
        raw.append((b"content-encoding", encoding.encode()))
    raw.append((b"content-length", str(len(body)).encode()))
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _send_stream(
    send: Send, events: list[bytes], headers: Mapping[str, str], encoding: str | None = None
) -> None:
    raw = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    compressor = None
    if encoding is not None:
        compressor = _compressor(encoding)
        raw.append((b"content-encoding", encoding.encode()))
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    for event in events:
        if compressor is not None:  # each event flushed, so it arrives as it is sent
            event = compressor.compress(event) + compressor.flush(zlib.Z_SYNC_FLUSH)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    tail = compressor.flush() if compressor is not None else b""
    await send({"type": "http.response.body", "body": tail})
