"""Mapping requests to (provider, model) tuples."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2
import pytest
from lovely_coordinator_httpx import tuple_for_request

from lovely_coordinator import ModelTuple


def _post(url: str, payload: object) -> httpx2.Request:
    return httpx2.Request("POST", url, content=json.dumps(payload).encode())


@pytest.mark.parametrize(
    ("url", "payload", "expected"),
    [
        (
            "https://api.openai.com/v1/chat/completions",
            {"model": "gpt-4o", "messages": []},
            ("openai", "gpt-4o"),
        ),
        (
            "https://api.anthropic.com/v1/messages",
            {"model": "claude-sonnet-4-5", "max_tokens": 1},
            ("anthropic", "claude-sonnet-4-5"),
        ),
        (
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent",
            {"contents": []},
            ("google", "gemini-2.5-flash"),
        ),
        ("http://127.0.0.1:8000/v1/chat/completions", {"model": "m"}, ("127.0.0.1", "m")),
        ("https://api.openai.com/v1/files", {"purpose": "batch"}, None),
        ("https://api.openai.com/v1/chat/completions", {"model": 3}, None),
        ("https://api.openai.com/v1/chat/completions", {"model": ""}, None),
        ("https://api.openai.com/v1/chat/completions", {"model": "a\0b"}, None),
        ("https://api.openai.com/v1/chat/completions", ["model"], None),
        ("http://127.0.0.1:8000/v1/messages", {"model": "c"}, ("anthropic", "c")),
        ("http://127.0.0.1:8000/proxy/v1/messages", {"model": "c"}, ("anthropic", "c")),
        ("http://127.0.0.1/v1beta/models/gemini:generateContent", {}, ("google", "gemini")),
        ("https://api.anthropic.com/v1/messages/count_tokens", {"model": "c"}, None),
        ("https://api.openai.com/v1/responses/input_tokens", {"model": "g"}, None),
        ("https://api.openai.com/v1/responses", {"model": "g"}, ("openai", "g")),
        ("https://api.openai.com/v1/embeddings", {"model": "e"}, ("openai", "e")),
        (
            "https://generativelanguage.googleapis.com/v1beta/models/gemini:countTokens",
            {"contents": []},
            None,
        ),
        ("https://example.com/v1/models/:generateContent", {}, None),
        ("https://example.com/v1/models/a/b:generateContent", {}, None),
    ],
)
def test_default_mapping(url: str, payload: object, expected: tuple[str, str] | None) -> None:
    found = tuple_for_request(_post(url, payload))
    assert found == expected
    if expected is not None:
        assert isinstance(found, ModelTuple)


def test_only_json_posts_are_mapped() -> None:
    assert (
        tuple_for_request(httpx2.Request("GET", "https://api.openai.com/v1/models/gpt-4o")) is None
    )
    upload = httpx2.Request("POST", "https://api.openai.com/v1/files", content=b"\x89PNG...")
    assert tuple_for_request(upload) is None
    broken = httpx2.Request("POST", "https://api.openai.com/v1/chat/completions", content=b"{oops")
    assert tuple_for_request(broken) is None


async def _chunks() -> AsyncIterator[bytes]:
    yield b'{"model": "gpt-4o"}'


def test_streaming_uploads_are_not_read() -> None:
    request = httpx2.Request(
        "POST", "https://api.openai.com/v1/chat/completions", content=_chunks()
    )
    assert tuple_for_request(request) is None


def test_provider_names_can_be_overridden() -> None:
    request = _post("http://127.0.0.1:9/v1/messages", {"model": "claude"})
    assert tuple_for_request(request, {"127.0.0.1": "anthropic"}) == ("anthropic", "claude")


def test_a_provider_key_may_name_a_path_prefix() -> None:
    providers = {"127.0.0.1": "openai", "127.0.0.1/v1/messages": "anthropic"}
    messages = _post("http://127.0.0.1:9/v1/messages", {"model": "claude"})
    chat = _post("http://127.0.0.1:9/v1/chat/completions", {"model": "gpt"})
    assert tuple_for_request(messages, providers) == ("anthropic", "claude")
    assert tuple_for_request(chat, providers) == ("openai", "gpt")
    other = _post("http://127.0.0.2:9/v1/chat/completions", {"model": "gpt"})
    assert tuple_for_request(other, providers) == ("127.0.0.2", "gpt")
