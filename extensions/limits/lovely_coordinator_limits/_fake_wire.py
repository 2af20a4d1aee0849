"""The fake provider's wire formats: what a request asks for, and the answers' bodies.

Four APIs, just enough of each for the SDKs to parse the answers:

- OpenAI chat completions, ``POST /v1/chat/completions``: JSON, or server-sent events
  when ``stream`` is true, ending with a usage chunk when the request set
  ``stream_options.include_usage``;
- Anthropic messages, ``POST /v1/messages``: JSON, or the ``message_start`` …
  ``message_delta`` (with the output usage) … ``message_stop`` event stream;
- Gemini, ``POST /v1beta/models/{model}:generateContent``: JSON with ``usageMetadata``;
- OpenAI responses, ``POST /v1/responses`` (see ``_fake_responses``).

A request that offers tools carries the call the provider would answer with (see
``_fake_tools``); the provider makes it when its tools are in use.

Prompt tokens are counted the way the estimate does (characters / 4), plus three tokens of
framing for every message, as real tokenizers add: the client's estimate is close to what
the provider counts, but not equal, so settlement has something to correct.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal, final

from ._estimate import CHARS_PER_TOKEN, output_limit, prompt_text
from ._fake_responses import response_body, response_events
from ._fake_tools import (
    ToolCall,
    anthropic_tool_block,
    anthropic_tool_events,
    openai_tool_chunks,
    openai_tool_message,
    tool_call_for,
)

__all__ = [
    "Api",
    "Ask",
    "answer_text",
    "completion",
    "error_body",
    "parse_ask",
    "stream_events",
]

Api = Literal["openai", "anthropic", "gemini", "responses"]

_GEMINI_PREFIX = "/v1beta/models/"
_GEMINI_SUFFIX = ":generateContent"
_FRAMING = 3  # tokens per message around its content
_DEFAULT_OUTPUT = 16  # OpenAI's old default output limit, for requests that set none


@final
@dataclass(frozen=True, slots=True)
class Ask:
    """What one request asks for."""

    api: Api
    model: str
    stream: bool
    include_usage: bool
    prompt_tokens: int
    output_limit: int
    tool_call: ToolCall | None = None


def parse_ask(method: str, path: str, body: bytes) -> Ask | None:
    """Read a request; ``None`` when it is not one of the three APIs."""
    if method != "POST":
        return None
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    stream = payload.get("stream") is True
    api: Api
    if path == "/v1/chat/completions":
        api, model = "openai", str(payload.get("model", ""))
    elif path == "/v1/messages":
        api, model = "anthropic", str(payload.get("model", ""))
    elif path == "/v1/responses":
        api, model = "responses", str(payload.get("model", ""))
    elif path.startswith(_GEMINI_PREFIX) and path.endswith(_GEMINI_SUFFIX):
        api, model, stream = "gemini", path[len(_GEMINI_PREFIX) : -len(_GEMINI_SUFFIX)], False
    else:
        return None
    options = payload.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    messages = payload.get("messages") or payload.get("contents") or payload.get("input") or []
    framing = _FRAMING * len(messages) if isinstance(messages, list) else 0
    prompt = math.ceil(len(prompt_text(payload)) / CHARS_PER_TOKEN) + framing
    limit = output_limit(payload) or _DEFAULT_OUTPUT
    call = tool_call_for(path, payload)
    return Ask(api, model, stream, include_usage, prompt, limit, call)


def answer_text(reply: str | None, limit: int) -> tuple[str, int, bool]:
    """The text a completion answers with, its tokens, and whether the limit cut it.

    ``reply=None`` answers with as many tokens as the limit allows.
    """
    text = "abc " * limit if reply is None else reply
    cut = len(text) > limit * CHARS_PER_TOKEN
    if cut:
        text = text[: limit * CHARS_PER_TOKEN]
    return text, math.ceil(len(text) / CHARS_PER_TOKEN), cut


def completion(ask: Ask, text: str, output: int, cut: bool) -> dict[str, Any]:
    """A non-streamed answer in ``ask.api``'s format, with its usage."""
    call = ask.tool_call
    if ask.api == "responses":
        return response_body(ask.model, text, ask.prompt_tokens, output, cut, call)
    if ask.api == "openai":
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": ask.model,
            "choices": [
                {
                    "index": 0,
                    "message": (
                        openai_tool_message(call)
                        if call is not None
                        else {"role": "assistant", "content": text}
                    ),
                    "finish_reason": _finish(call, cut, "tool_calls", "length", "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": ask.prompt_tokens,
                "completion_tokens": output,
                "total_tokens": ask.prompt_tokens + output,
            },
        }
    if ask.api == "anthropic":
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": ask.model,
            "content": (
                [anthropic_tool_block(call)]
                if call is not None
                else [{"type": "text", "text": text}]
            ),
            "stop_reason": _finish(call, cut, "tool_use", "max_tokens", "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": ask.prompt_tokens, "output_tokens": output},
        }
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": text}]},
                "finishReason": "MAX_TOKENS" if cut else "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": ask.prompt_tokens,
            "candidatesTokenCount": output,
            "totalTokenCount": ask.prompt_tokens + output,
        },
    }


def stream_events(ask: Ask, text: str, output: int, cut: bool) -> list[bytes]:
    """A streamed answer: server-sent events, a few characters each."""
    pieces = [text[i : i + 8] for i in range(0, len(text), 8)] or [""]
    call = ask.tool_call
    if ask.api == "responses":
        return response_events(ask.model, text, ask.prompt_tokens, output, cut, call)
    if ask.api == "openai":
        nulls = ask.include_usage  # asked for usage: every chunk says "usage": null
        if call is not None:
            chunks = openai_tool_chunks(ask.model, call)
            if nulls:
                for chunk in chunks:
                    chunk["usage"] = None
        else:
            chunks = [
                _openai_chunk(ask.model, {"role": "assistant", "content": ""}, None, nulls),
                *(_openai_chunk(ask.model, {"content": piece}, None, nulls) for piece in pieces),
                _openai_chunk(ask.model, {}, "length" if cut else "stop", nulls),
            ]
        if ask.include_usage:
            final = _openai_chunk(ask.model, {}, None, nulls)
            final["choices"] = []
            final["usage"] = {
                "prompt_tokens": ask.prompt_tokens,
                "completion_tokens": output,
                "total_tokens": ask.prompt_tokens + output,
            }
            chunks.append(final)
        return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
    message: dict[str, object] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": ask.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": ask.prompt_tokens, "output_tokens": 1},
    }
    block = {"type": "text", "text": ""}
    content: list[tuple[str, object]] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        *(
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": p},
                },
            )
            for p in pieces
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]
    events: list[tuple[str, object]] = [
        ("message_start", {"type": "message_start", "message": message}),
        *(anthropic_tool_events(call) if call is not None else content),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": _finish(call, cut, "tool_use", "max_tokens", "end_turn"),
                    "stop_sequence": None,
                },
                "usage": {"output_tokens": output},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


def error_body(api: Api, status: int, message: str) -> object:
    """The API's usual error body for a refusal."""
    if api in ("openai", "responses"):
        kind = "requests" if status == 429 else "server_error"
        return {"error": {"message": message, "type": kind, "code": "rate_limit_exceeded"}}
    if api == "anthropic":
        return {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
    return {"error": {"code": status, "message": message, "status": "RESOURCE_EXHAUSTED"}}


def _finish(call: ToolCall | None, cut: bool, called: str, long: str, done: str) -> str:
    return called if call is not None else long if cut else done


def _openai_chunk(model: str, delta: object, finish: str | None, nulls: bool) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if nulls:
        chunk["usage"] = None
    return chunk
