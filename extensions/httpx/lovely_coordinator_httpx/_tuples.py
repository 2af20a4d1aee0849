"""Which ``(provider, model)`` an HTTP request is for."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Protocol

import httpx2
from lovely_coordinator_limits import ModelTupleLike

from lovely_coordinator import ModelTuple

__all__ = ["DEFAULT_PROVIDERS", "RequestLike", "TupleFor", "tuple_for_request"]

TupleFor = Callable[[httpx2.Request], ModelTupleLike | None]
"""Maps a request to its model tuple, or ``None`` to send it unscheduled."""


class _URLLike(Protocol):
    @property
    def host(self) -> str: ...

    @property
    def path(self) -> str: ...


class RequestLike(Protocol):
    """What the default mapping reads of a request (an ``httpx2`` or ``httpx`` ``Request``)."""

    @property
    def method(self) -> str: ...

    @property
    def url(self) -> _URLLike: ...

    @property
    def content(self) -> bytes: ...


DEFAULT_PROVIDERS: Mapping[str, str] = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "google",
    "api.mistral.ai": "mistral",
    "api.groq.com": "groq",
    "api.deepseek.com": "deepseek",
    "api.x.ai": "xai",
    "openrouter.ai": "openrouter",
}
"""Known API hosts and the provider names they map to.

A host not listed is named by the API its path has when that API is one provider's own
(``/v1/messages`` is Anthropic's, ``:generateContent`` Gemini's), and otherwise by itself
(OpenAI's paths are served by many providers). A key may also be a host with a path
prefix (``"127.0.0.1/v1/messages"``), the longest match winning, for one server that
serves several providers' APIs.
"""

_JSON_OBJECT_STARTS = frozenset({b"{", b" ", b"\t", b"\r", b"\n"})
# Gemini puts the model in the path: /v1beta/models/{model}:generateContent.
_MODELS_SEGMENT = "/models/"
# Gemini's actions that are model calls (``:countTokens`` and the like are not).
_GEMINI_CALLS = frozenset(
    {"generateContent", "streamGenerateContent", "embedContent", "batchEmbedContents", "predict"}
)
# Endpoints whose body names a model but that are no model call: Anthropic's
# /v1/messages/count_tokens, OpenAI's /v1/responses/input_tokens.
_NOT_CALLS = frozenset({"count_tokens", "input_tokens"})
_ANTHROPIC_PATH = "/v1/messages"


def tuple_for_request(
    request: RequestLike, providers: Mapping[str, str] = DEFAULT_PROVIDERS
) -> ModelTuple | None:
    """The default mapping: provider from the host and path, model from the body or path.

    Only model calls are scheduled: a ``POST`` whose JSON body (or Gemini path) names a
    model, except endpoints that only count tokens (Anthropic's
    ``/v1/messages/count_tokens``, OpenAI's ``/v1/responses/input_tokens``, Gemini's
    ``:countTokens``).

    Args:
        request: the outgoing request.
        providers: host (or host + path prefix) → provider name; see
            :data:`DEFAULT_PROVIDERS` for hosts not listed.

    Returns:
        The tuple, or ``None`` when the request is no model call (listing models,
        uploading files, counting tokens, ...): such requests are sent unscheduled.
    """
    host = request.url.host
    if not host or request.method != "POST":
        return None
    path = request.url.path
    action = path.rpartition("/")[2]
    if ":" in action:
        if action.partition(":")[2] not in _GEMINI_CALLS:
            return None
    elif action in _NOT_CALLS:
        return None
    model = _model_from_body(request) or _model_from_path(path)
    if not model:
        return None
    provider = _provider(host, path, providers)
    try:
        return ModelTuple(provider, model)
    except ValueError:  # a NUL byte in a model name: not ours to schedule
        return None


def _provider(host: str, path: str, providers: Mapping[str, str]) -> str:
    best, best_length = None, -1
    for key, name in providers.items():
        key_host, slash, prefix = key.partition("/")
        if key_host != host:
            continue
        prefix = slash + prefix
        if path.startswith(prefix) and len(prefix) > best_length:
            best, best_length = name, len(prefix)
    if best is not None:
        return best
    if path == _ANTHROPIC_PATH or path.endswith(_ANTHROPIC_PATH):
        return "anthropic"
    if _MODELS_SEGMENT in path and ":" in path.rpartition("/")[2]:
        return "google"
    return host


def _model_from_body(request: RequestLike) -> str | None:
    try:
        content = request.content
    except Exception:  # RequestNotRead (of either httpx): a streaming upload, no JSON
        return None
    # Cheap rejection of uploads and other non-JSON bodies before parsing.
    if content[:1] not in _JSON_OBJECT_STARTS:
        return None
    try:
        payload = json.loads(content)
    except ValueError:
        return None
    model = payload.get("model") if isinstance(payload, dict) else None
    return model if isinstance(model, str) else None


def _model_from_path(path: str) -> str | None:
    start = path.find(_MODELS_SEGMENT)
    if start < 0:
        return None
    model, colon, _action = path[start + len(_MODELS_SEGMENT) :].partition(":")
    return model if colon and model and "/" not in model else None
