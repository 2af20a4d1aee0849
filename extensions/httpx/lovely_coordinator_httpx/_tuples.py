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
"""Known API hosts and the provider names they map to; other hosts name themselves."""

_JSON_OBJECT_STARTS = frozenset({b"{", b" ", b"\t", b"\r", b"\n"})
# Gemini puts the model in the path: /v1beta/models/{model}:generateContent.
_MODELS_SEGMENT = "/models/"


def tuple_for_request(
    request: RequestLike, providers: Mapping[str, str] = DEFAULT_PROVIDERS
) -> ModelTuple | None:
    """The default mapping: provider from the host, model from the JSON body or the path.

    Args:
        request: the outgoing request.
        providers: host → provider name; a host not listed is its own provider name.

    Returns:
        The tuple, or ``None`` when the request names no model (listing models, uploading
        files, ...): such requests are sent unscheduled.
    """
    host = request.url.host
    if not host or request.method != "POST":
        return None
    model = _model_from_body(request) or _model_from_path(request.url.path)
    if not model:
        return None
    provider = providers.get(host, host)
    try:
        return ModelTuple(provider, model)
    except ValueError:  # a NUL byte in a model name: not ours to schedule
        return None


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
