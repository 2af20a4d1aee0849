"""A local fake model provider, for testing rate-limit handling against real SDK clients.

:class:`FakeProvider` is a plain ASGI app that speaks just enough of three HTTP APIs:

- OpenAI chat completions: ``POST /v1/chat/completions`` (JSON or SSE with ``stream``);
- Anthropic messages: ``POST /v1/messages`` (JSON or SSE with ``stream``);
- Gemini: ``POST /v1beta/models/{model}:generateContent``.

Each model answers with a script of refusals (:class:`Refuse`, e.g. a 429 with one style
of wait header), then with successes. :func:`serve` runs an app with uvicorn on a free
port of 127.0.0.1 in a background thread, so a test on any event loop (asyncio or trio)
can point ``base_url`` at it.

For pytest, three fixtures wrap this: ``fake_provider_server`` serves one provider per
test module, ``fake_provider`` is that provider with its scripts and records reset for the
test, and ``fake_provider_url`` its base URL. Import them into a ``conftest.py``::

    from lovely_coordinator_limits.testing import (
        fake_provider as fake_provider,
        fake_provider_server as fake_provider_server,
        fake_provider_url as fake_provider_url,
    )

Requires the ``testing`` extra (uvicorn, pytest).
"""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, final

import pytest

__all__ = [
    "Api",
    "FakeProvider",
    "Refuse",
    "Seen",
    "fake_provider",
    "fake_provider_server",
    "fake_provider_url",
    "serve",
]

Api = Literal["openai", "anthropic", "gemini"]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_GEMINI_PREFIX = "/v1beta/models/"
_ALL = "\0all"  # the in-flight key counting every model (no model name contains NUL)


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
    """A request the provider received (and what it answered)."""

    api: Api
    model: str
    stream: bool
    status: int


@final
class FakeProvider:
    """An ASGI app imitating model providers; scripts and records are thread-safe.

    Args:
        reply: the text every successful completion answers with.
    """

    def __init__(self, reply: str = "ok") -> None:
        self.reply = reply
        self._lock = threading.Lock()
        self._scripts: dict[str, deque[Refuse]] = {}
        self._seen: list[Seen] = []
        self._in_flight: Counter[str] = Counter()
        self._peak: Counter[str] = Counter()

    def script(self, model: str, *refusals: Refuse) -> None:
        """Queue ``refusals`` as the next answers for ``model``; then it succeeds again."""
        with self._lock:
            self._scripts.setdefault(model, deque()).extend(refusals)

    def seen(self, model: str | None = None) -> list[Seen]:
        """The requests received so far (for ``model`` only, if given), oldest first."""
        with self._lock:
            return [s for s in self._seen if model is None or s.model == model]

    def peak_in_flight(self, model: str | None = None) -> int:
        """The most requests (for ``model``, or in all) that were answered at the same time."""
        with self._lock:
            return self._peak[model if model is not None else _ALL]

    def forgive(self, model: str | None = None) -> None:
        """Drop the refusals still scripted (for ``model``, or for every model)."""
        with self._lock:
            if model is None:
                self._scripts.clear()
            else:
                self._scripts.pop(model, None)

    def reset(self) -> None:
        """Forget scripts and records."""
        with self._lock:
            self._scripts.clear()
            self._seen.clear()
            self._in_flight.clear()
            self._peak.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        route = _route(scope["method"], scope["path"], body)
        if route is None:
            await _send_json(send, 404, {"error": {"message": "not found"}})
            return
        api, model, stream = route
        with self._lock:
            queue = self._scripts.get(model)
            refusal = queue.popleft() if queue else None
            status = refusal.status if refusal is not None else 200
            self._seen.append(Seen(api, model, stream, status))
            for key in (model, _ALL):
                self._in_flight[key] += 1
                self._peak[key] = max(self._peak[key], self._in_flight[key])
        try:
            if refusal is not None:
                error = refusal.body if refusal.body is not None else _error_body(api, refusal)
                await _send_json(send, refusal.status, error, refusal.headers)
            elif stream:
                await _send_stream(send, _stream_events(api, model, self.reply))
            else:
                await _send_json(send, 200, _completion(api, model, self.reply))
        finally:
            with self._lock:
                self._in_flight[model] -= 1
                self._in_flight[_ALL] -= 1


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
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
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
def fake_provider(fake_provider_server: tuple[FakeProvider, str]) -> FakeProvider:
    """The module's served :class:`FakeProvider`, with no scripts or records left over."""
    provider = fake_provider_server[0]
    provider.reset()
    return provider


@pytest.fixture
def fake_provider_url(fake_provider_server: tuple[FakeProvider, str]) -> str:
    """The base URL of the module's served :class:`FakeProvider`."""
    return fake_provider_server[1]


def _route(method: str, path: str, body: bytes) -> tuple[Api, str, bool] | None:
    if method != "POST":
        return None
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    stream = payload.get("stream") is True
    if path == "/v1/chat/completions":
        return "openai", str(payload.get("model", "")), stream
    if path == "/v1/messages":
        return "anthropic", str(payload.get("model", "")), stream
    if path.startswith(_GEMINI_PREFIX) and path.endswith(":generateContent"):
        return "gemini", path[len(_GEMINI_PREFIX) : -len(":generateContent")], False
    return None


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_json(
    send: Send, status: int, payload: object, headers: Mapping[str, str] | None = None
) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _send_stream(send: Send, events: list[bytes]) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for event in events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _error_body(api: Api, refusal: Refuse) -> object:
    if api == "openai":
        return {
            "error": {
                "message": "Rate limit reached for requests",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }
        }
    if api == "anthropic":
        return {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"},
        }
    return {
        "error": {
            "code": refusal.status,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }
    }


def _completion(api: Api, model: str, text: str) -> object:
    if api == "openai":
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    if api == "anthropic":
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP"}
        ]
    }


def _stream_events(api: Api, model: str, text: str) -> list[bytes]:
    if api == "openai":
        chunks = [
            _openai_chunk(model, {"role": "assistant", "content": ""}, None),
            *(_openai_chunk(model, {"content": ch}, None) for ch in text),
            _openai_chunk(model, {}, "stop"),
        ]
        return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
    message: dict[str, object] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0},
    }
    events: list[tuple[str, object]] = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        *(
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": ch},
                },
            )
            for ch in text
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


def _openai_chunk(model: str, delta: object, finish: str | None) -> object:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
