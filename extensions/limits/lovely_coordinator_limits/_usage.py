"""The tokens a response actually used, read from its body as it passes.

Providers report usage in the response: a ``usage`` object in a JSON body (OpenAI chat
completions and responses, Anthropic messages), ``usageMetadata`` (Gemini), and in
server-sent-event streams in the events that carry it:

- OpenAI chat completions: the final chunk, when the request asked for it with
  ``stream_options={"include_usage": true}``;
- OpenAI responses: ``response.completed`` (its ``response.usage``);
- Anthropic messages: ``message_start`` (input tokens) and ``message_delta`` (output tokens
  so far; the last one counts).

:class:`UsageMeter` is fed the body's chunks as the caller reads them and never holds the
stream: for an event stream it keeps only the current, incomplete line; for a JSON body
(small by nature) it keeps up to :data:`MAX_JSON_BODY` bytes and parses them at the end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, final

from ._decode import Decoder, decoder_for

__all__ = ["MAX_JSON_BODY", "Usage", "UsageMeter", "usage_from_body", "usage_from_json"]

MAX_JSON_BODY = 4 * 1024 * 1024
"""A JSON body larger than this is passed on without being parsed for usage."""

# An event line longer than this cannot be a usage event: it is skipped, not buffered.
_MAX_EVENT_LINE = 1024 * 1024


@final
@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a response used.

    Attributes:
        input_tokens: prompt tokens (Anthropic's cache writes included).
        output_tokens: generated tokens.
    """

    input_tokens: int
    output_tokens: int

    @property
    def total(self) -> int:
        """Input plus output: what a tokens-per-minute limit counts."""
        return self.input_tokens + self.output_tokens


def usage_from_json(payload: object) -> Usage | None:
    """The usage in a decoded response body or stream event, or ``None`` when it has none."""
    if not isinstance(payload, Mapping):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, Mapping):
        # A responses-API event wraps the response; Anthropic's message_start the message.
        for holder in ("response", "message"):
            inner = payload.get(holder)
            if isinstance(inner, Mapping) and isinstance(inner.get("usage"), Mapping):
                usage = inner["usage"]
                break
    if isinstance(usage, Mapping):
        return _from_usage(usage)
    metadata = payload.get("usageMetadata")
    if isinstance(metadata, Mapping):
        prompt = _count(metadata, "promptTokenCount")
        output = _count(metadata, "candidatesTokenCount")
        if prompt is None and output is None:
            return None
        return Usage(prompt or 0, output or 0)
    return None


def usage_from_body(body: bytes | str) -> Usage | None:
    """The usage in a JSON response body, or ``None`` (not JSON, or no usage)."""
    try:
        return usage_from_json(json.loads(body))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None


@final
class UsageMeter:
    """Reads the usage of one response body from the chunks the caller reads.

    Args:
        content_type: the response's ``content-type``; ``text/event-stream`` is scanned
            event by event, anything else is treated as one JSON document.
        content_encoding: the response's ``content-encoding``: the chunks fed are the
            body as sent (compressed), and are decoded here (gzip, deflate; br and zstd
            when ``brotli`` / ``zstandard`` are installed). A body in an encoding it
            cannot decode reports no usage.
    """

    def __init__(self, content_type: str, content_encoding: str = "") -> None:
        self._events = content_type.split(";", 1)[0].strip().lower() == "text/event-stream"
        self._decoder: Decoder | None = decoder_for(content_encoding)
        self._blind = self._decoder is None  # an encoding it cannot decode
        self._pending = bytearray()
        self._skipping = False  # inside an overlong event line, dropped up to its end
        self._input: int | None = None
        self._output: int | None = None

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the body (as sent: still encoded)."""
        if self._blind:
            return
        decoder = self._decoder
        assert decoder is not None
        # A JSON body is decoded no further than the most it would keep (a small
        # compressed body may inflate enormously); events are decoded as they come.
        limit = 0 if self._events else MAX_JSON_BODY - len(self._pending) + 1
        try:
            chunk = decoder.decode(chunk, limit)
        except ValueError:
            self._blind = True
            self._pending.clear()
            return
        if not self._events:
            if len(self._pending) + len(chunk) > MAX_JSON_BODY:
                self._blind = True  # too big to be parsed for usage
                self._pending.clear()
            else:
                self._pending += chunk
            return
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._keep(chunk[start:])
                return
            if self._skipping:
                self._skipping = False
            else:
                self._pending += chunk[start:end]
                self._line(bytes(self._pending))
            self._pending.clear()
            start = end + 1

    def usage(self) -> Usage | None:
        """The usage seen so far (for a JSON body: parsed now, from the whole body)."""
        if self._blind:
            return None
        if not self._events and self._pending and self._input is None and self._output is None:
            found = usage_from_body(bytes(self._pending))
            self._pending.clear()
            if found is not None:
                self._input, self._output = found.input_tokens, found.output_tokens
        if self._input is None and self._output is None:
            return None
        return Usage(self._input or 0, self._output or 0)

    def _keep(self, tail: bytes) -> None:
        if self._skipping:
            return
        if len(self._pending) + len(tail) > _MAX_EVENT_LINE:
            self._pending.clear()
            self._skipping = True
        else:
            self._pending += tail

    def _line(self, line: bytes) -> None:
        # Only data lines that mention usage are decoded: content deltas are passed over
        # without parsing.
        if not line.startswith(b"data:") or (b"usage" not in line and b"Usage" not in line):
            return
        try:
            event = json.loads(line[5:])
        except (ValueError, RecursionError):
            return
        found = usage_from_json(event)
        if found is None:
            return
        usage = event.get("usage") if isinstance(event, Mapping) else None
        has = _has_counts(usage) if isinstance(usage, Mapping) else None
        # Anthropic's message_delta carries only output tokens (input came in
        # message_start): keep what an event does not restate.
        if has is None or has[0]:
            self._input = found.input_tokens
        if has is None or has[1]:
            self._output = found.output_tokens


def _from_usage(usage: Mapping[str, Any]) -> Usage | None:
    prompt = _count(usage, "prompt_tokens")
    if prompt is None:
        prompt = _count(usage, "input_tokens")
        cache_writes = _count(usage, "cache_creation_input_tokens")
        if prompt is not None and cache_writes is not None:
            prompt += cache_writes
    output = _count(usage, "completion_tokens")
    if output is None:
        output = _count(usage, "output_tokens")
    if prompt is None and output is None:
        return None
    return Usage(prompt or 0, output or 0)


def _has_counts(usage: Mapping[str, Any]) -> tuple[bool, bool]:
    has_input = (
        _count(usage, "prompt_tokens") is not None or _count(usage, "input_tokens") is not None
    )
    has_output = (
        _count(usage, "completion_tokens") is not None or _count(usage, "output_tokens") is not None
    )
    return has_input, has_output


def _count(mapping: Mapping[str, Any], key: str) -> int | None:
    value = mapping.get(key)
    return value if type(value) is int and value >= 0 else None
