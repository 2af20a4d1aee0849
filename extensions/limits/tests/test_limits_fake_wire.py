"""The fake provider's wire formats: what a request asks for, and usage in every answer."""

from __future__ import annotations

import json

import pytest
from lovely_coordinator_limits import Usage, UsageMeter, estimate_tokens, usage_from_json
from lovely_coordinator_limits._fake_wire import (
    Ask,
    answer_text,
    completion,
    parse_ask,
    stream_events,
)


def _body(payload: object) -> bytes:
    return json.dumps(payload).encode()


def test_openai_request() -> None:
    payload = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "x" * 40}],
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ask = parse_ask("POST", "/v1/chat/completions", _body(payload))
    # 10 tokens of text and 3 of framing: one more than the client's estimate of the prompt.
    assert ask == Ask("openai", "gpt-test", True, True, 13, 20)
    assert estimate_tokens(payload) == 10 + 20


def test_anthropic_and_gemini_requests() -> None:
    anthropic = {
        "model": "claude",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert parse_ask("POST", "/v1/messages", _body(anthropic)) == Ask(
        "anthropic", "claude", False, False, 4, 8
    )
    gemini = {"contents": [{"parts": [{"text": "abcd"}]}], "stream": True}
    assert parse_ask("POST", "/v1beta/models/gem:generateContent", _body(gemini)) == Ask(
        "gemini", "gem", False, False, 4, 16
    )


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/chat/completions", b"{}"),
        ("POST", "/v1/files", b"{}"),
        ("POST", "/v1/messages", b"[1]"),
        ("POST", "/v1/messages", b"{broken"),
    ],
)
def test_other_requests_are_not_asks(method: str, path: str, body: bytes) -> None:
    assert parse_ask(method, path, body) is None


def test_answers_are_cut_to_the_output_limit() -> None:
    assert answer_text("ok", 16) == ("ok", 1, False)
    assert answer_text("x" * 100, 5) == ("x" * 20, 5, True)
    text, tokens, cut = answer_text(None, 50)
    assert (len(text), tokens, cut) == (200, 50, False)


@pytest.mark.parametrize("api", ["openai", "anthropic", "gemini"])
def test_every_completion_reports_its_usage(api: str) -> None:
    ask = Ask(api, "m", False, False, 7, 16)  # type: ignore[arg-type]
    assert usage_from_json(completion(ask, "abcdefgh", 2, False)) == Usage(7, 2)


@pytest.mark.parametrize(
    ("api", "include_usage", "expected"),
    [
        ("openai", True, Usage(7, 3)),
        ("openai", False, None),
        ("anthropic", False, Usage(7, 3)),
    ],
)
def test_streams_report_usage_as_the_apis_do(
    api: str, include_usage: bool, expected: Usage | None
) -> None:
    ask = Ask(api, "m", True, include_usage, 7, 16)  # type: ignore[arg-type]
    meter = UsageMeter("text/event-stream")
    for event in stream_events(ask, "x" * 12, 3, False):
        meter.feed(event)
    assert meter.usage() == expected
