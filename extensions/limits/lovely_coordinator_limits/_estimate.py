"""How many tokens a model request will cost, estimated before it is sent.

A provider counts a request against its tokens-per-minute limit when it *admits* it, before
any output exists: OpenAI charges the prompt plus the requested output limit
(``max_tokens`` or its successors), which is what :func:`estimate_tokens` returns. The
actual usage, known once the response is complete, replaces the estimate later (see
``_usage``).

The prompt is measured by characters: every string of the prompt-carrying fields
(messages, system prompts, instructions, tool definitions), four characters a token,
rounded up. That is the documented rule of thumb for English text and needs nothing
installed. A real tokenizer can be passed instead (:func:`tiktoken_tokenizer` builds one
when ``tiktoken`` is installed, the ``tiktoken`` extra); it is never the default, because
``tiktoken`` downloads its encodings on first use, which fails offline. Any tokenizer that
fails falls back to characters, silently and for good.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, final

__all__ = [
    "CHARS_PER_TOKEN",
    "Tokenizer",
    "estimate_tokens",
    "output_limit",
    "prompt_text",
    "text_tokens",
    "tiktoken_tokenizer",
]

_log = logging.getLogger("lovely_coordinator.limits")

CHARS_PER_TOKEN = 4
"""The rule of thumb behind the default estimate: four characters of English text a token."""

Tokenizer = Callable[[str], int]
"""Counts the tokens of a text. May raise: the estimate then falls back to characters."""

# Fields of the request bodies (OpenAI chat and responses, Anthropic messages, Gemini) that
# carry prompt text. Everything else (model, temperature, metadata, ...) is not prompt.
_PROMPT_FIELDS = (
    "system",
    "systemInstruction",
    "system_instruction",
    "instructions",
    "messages",
    "input",
    "contents",
    "prompt",
    "tools",
    "functions",
)
# Keys whose values are not text the model reads as tokens of the prompt: structure
# (roles, types, ids) and binary payloads (base64 images, audio, files), which are billed
# by other rules and would swamp a character count.
_NOT_TEXT = frozenset(
    {
        "role",
        "type",
        "id",
        "tool_call_id",
        "call_id",
        "cache_control",
        "image_url",
        "input_audio",
        "file",
        "file_data",
        "inline_data",
        "inlineData",
        "source",
        "data",
    }
)
_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def text_tokens(text: str, tokenizer: Tokenizer | None = None) -> int:
    """The tokens of ``text``: ``tokenizer``'s count, or characters / 4 rounded up.

    When the tokenizer raises or returns anything but an int ≥ 0, the characters decide
    for this text (:func:`tiktoken_tokenizer` also stops trying after its first failure).
    """
    if tokenizer is not None:
        try:
            counted = tokenizer(text)
        except Exception:
            counted = None
        if type(counted) is int and counted >= 0:
            return counted
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def prompt_text(payload: Mapping[str, Any]) -> str:
    """The prompt-carrying strings of a decoded request body, joined by newlines."""
    return "\n".join(_strings(payload.get(name)) for name in _PROMPT_FIELDS if name in payload)


def output_limit(payload: Mapping[str, Any]) -> int:
    """The output tokens the request asks for at most, for every choice; 0 when it sets none.

    ``max_completion_tokens``, ``max_tokens`` or ``max_output_tokens`` (OpenAI, Anthropic),
    or Gemini's ``generationConfig.maxOutputTokens``; times ``n`` (choices) when given.
    """
    limit: object = next((payload[k] for k in _OUTPUT_FIELDS if payload.get(k) is not None), None)
    if limit is None:
        config = payload.get("generationConfig")
        limit = config.get("maxOutputTokens") if isinstance(config, Mapping) else None
    if type(limit) is not int or limit < 0:
        return 0
    choices = payload.get("n")
    return limit * choices if type(choices) is int and choices > 1 else limit


def estimate_tokens(
    body: Mapping[str, Any] | bytes | str, tokenizer: Tokenizer | None = None
) -> int:
    """The tokens a request will be charged at admission: its prompt plus its output limit.

    Args:
        body: the request body, decoded or as the JSON text sent.
        tokenizer: counts the prompt's tokens; by default characters / 4.

    Returns:
        An int ≥ 0; 0 for a body that is not a JSON object (an upload, a form).
    """
    payload: object = body
    if isinstance(body, bytes | str):
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return 0
    if not isinstance(payload, Mapping):
        return 0
    text = prompt_text(payload)
    prompt = text_tokens(text, tokenizer) if text else 0
    return prompt + output_limit(payload)


def _strings(value: object) -> str:
    return "\n".join(_walk(value, depth=0))


def _walk(value: object, *, depth: int) -> Iterator[str]:
    # Prompts are shallow; the bound only guards against pathological nesting.
    if depth > 32:
        return
    if isinstance(value, str):
        if value:
            yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _NOT_TEXT:
                yield from _walk(item, depth=depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _walk(item, depth=depth + 1)


@final
class _Tiktoken:
    """A tokenizer over a tiktoken encoding, loaded at first use; characters after a failure."""

    def __init__(self, encoding: str) -> None:
        self._name = encoding
        self._lock = threading.Lock()
        self._encode: Callable[[str], list[int]] | None = None
        self._failed = False

    def __call__(self, text: str) -> int:
        encode = self._encode if self._encode is not None else self._load()
        if encode is None:
            return math.ceil(len(text) / CHARS_PER_TOKEN)
        try:
            return len(encode(text))
        except Exception:
            return math.ceil(len(text) / CHARS_PER_TOKEN)

    def _load(self) -> Callable[[str], list[int]] | None:
        with self._lock:
            if self._encode is None and not self._failed:
                try:
                    # Imported by name: tiktoken is optional and ships no type stubs.
                    tiktoken: Any = importlib.import_module("tiktoken")
                    encoding = tiktoken.get_encoding(self._name)
                    # disallowed_special=(): a prompt may quote "<|endoftext|>" as text.
                    self._encode = lambda text: encoding.encode(text, disallowed_special=())
                except Exception as exc:  # not installed, no network for the download, ...
                    self._failed = True
                    _log.debug("tiktoken unavailable (%s); estimating by characters", exc)
            return self._encode


def tiktoken_tokenizer(encoding: str = "o200k_base") -> Tokenizer:
    """A tokenizer using tiktoken's ``encoding`` (install the ``tiktoken`` extra).

    The encoding is loaded at the first count (tiktoken downloads it then, unless cached).
    When tiktoken is missing or the load fails — offline, say — every count falls back to
    characters / 4, without raising and without trying again.
    """
    return _Tiktoken(encoding)
