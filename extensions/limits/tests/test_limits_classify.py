"""Classification of failures into provider limits and ordinary errors."""

from __future__ import annotations

import httpx
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lovely_coordinator_limits import is_limit_message, is_limit_status, is_provider_limit

LIMIT_PHRASES = [
    "You exceeded your current quota, please check your plan and billing details.",
    "Your credit balance is too low to access the Anthropic API.",
    "Billing hard limit has been reached",
    "Monthly usage limit exceeded",
    "usage_limit_exceeded",
    "HTTP 429",
    "Error code: 429",
    "RESOURCE_EXHAUSTED",
    "Resource has been exhausted (e.g. check quota).",
    "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM)",
    "rate_limit_error",
    "rate-limited",
    "Too Many Requests",
    "too_many_requests",
    "TooManyRequests",
    "insufficient_quota",
]
NEVER_PHRASES = [
    "Overloaded",
    "overloaded_error",
    "HTTP 529",
    "This model's maximum context length is 128000 tokens",
    "context_length_exceeded",
    "prompt is too long: 210000 tokens > 200000 maximum",
    "input exceeds the context window",
    "Incorrect API key provided",
    "invalid x-api-key",
    "authentication_error",
    "Unauthorized",
]
ORDINARY_PHRASES = [
    "Connection reset by peer",
    "Request timed out.",
    "ReadTimeout",
    "502 Bad Gateway",
    "Internal server error",
    "model not found",
    "",
]
# Noise that appears next to limits in real messages and must not hide them.
NOISE = [
    "after an upstream timeout",
    "network error",
    "ECONNRESET",
    "retrying",
    "HTTP/1.1",
    "(503?)",
]


@pytest.mark.parametrize("text", LIMIT_PHRASES)
def test_limit_phrases_are_limits(text: str) -> None:
    assert is_limit_message(text)
    assert is_provider_limit(text)


@pytest.mark.parametrize("text", NEVER_PHRASES + ORDINARY_PHRASES)
def test_other_phrases_are_not_limits(text: str) -> None:
    assert not is_limit_message(text)
    assert not is_provider_limit(text)


def test_429_after_an_upstream_timeout_is_a_limit() -> None:
    # An older upstream version got this one wrong (coordinator-semantics §5).
    assert is_limit_message("HTTP 429 after an upstream timeout")


def test_overloaded_wins_over_a_limit_phrase() -> None:
    assert not is_limit_message("429 Too Many Requests: the engine is currently overloaded")


@given(
    st.lists(st.sampled_from(NOISE), max_size=3),
    st.sampled_from(LIMIT_PHRASES),
    st.lists(st.sampled_from(NOISE), max_size=3),
)
def test_noise_never_hides_a_limit(before: list[str], phrase: str, after: list[str]) -> None:
    assert is_limit_message(" ".join([*before, phrase, *after]))


@given(st.text(max_size=40), st.sampled_from(NEVER_PHRASES), st.text(max_size=40))
def test_a_never_phrase_always_wins(before: str, phrase: str, after: str) -> None:
    assert not is_limit_message(before + " " + phrase + " " + after)
    assert not is_limit_status(429, before + " " + phrase + " " + after)


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_case_does_not_matter(text: str) -> None:
    assert is_limit_message(text.upper()) == is_limit_message(text.lower())


@pytest.mark.parametrize(
    ("status", "text", "expected"),
    [
        (429, "", True),
        (429, "slow down", True),
        (429, "overloaded", False),
        (402, "payment required: billing", True),
        (402, "", True),  # as the SDK's PaymentRequiredError: a billing limit
        (402, "overloaded", False),
        (400, "Your credit balance is too low", True),
        (400, "context_length_exceeded", False),
        (403, "Quota exceeded for quota metric", True),
        (403, "forbidden", False),
        (404, "", False),
        (401, "rate limit", False),
        (408, "too many requests", False),
    ],
)
def test_status_rules(status: int, text: str, expected: bool) -> None:
    assert is_limit_status(status, text) is expected


@given(st.integers(min_value=500, max_value=599), st.text(max_size=60))
def test_server_errors_are_never_limits(status: int, text: str) -> None:
    assert not is_limit_status(status, text)
    assert not is_limit_status(status, text + " rate limit exceeded, 429")


def _httpx_error(status: int, body: bytes = b"") -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
    response = httpx.Response(status, content=body, request=request)
    return httpx.HTTPStatusError(f"status {status}", request=request, response=response)


def _httpx2_error(status: int) -> httpx2.HTTPStatusError:
    request = httpx2.Request("POST", "https://api.example.com/v1/messages")
    response = httpx2.Response(status, request=request)
    return httpx2.HTTPStatusError(f"status {status}", request=request, response=response)


@pytest.mark.parametrize(
    ("status", "expected"), [(429, True), (402, True), (500, False), (529, False), (404, False)]
)
def test_httpx_status_errors(status: int, expected: bool) -> None:
    assert is_provider_limit(_httpx_error(status)) is expected
    assert is_provider_limit(_httpx2_error(status)) is expected


def test_httpx_status_error_message_cannot_override_5xx() -> None:
    error = _httpx_error(503)
    assert "503" in str(error)
    assert not is_provider_limit(error)


class RateLimitError(Exception):
    """Named like the SDKs' class: recognised without importing any SDK."""


class OverloadedError(Exception):
    pass


class BodyError(Exception):
    def __init__(self, message: str, body: object) -> None:
        super().__init__(message)
        self.body = body


def test_sdk_class_names_decide() -> None:
    assert is_provider_limit(RateLimitError("whatever"))
    assert not is_provider_limit(RateLimitError("Overloaded"))
    assert not is_provider_limit(OverloadedError("rate limit"))


def test_body_is_read() -> None:
    body = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}
    assert is_provider_limit(BodyError("request failed", body))
    assert not is_provider_limit(BodyError("request failed", {"error": {"status": "INTERNAL"}}))
    assert is_provider_limit(BodyError("request failed", "quota exceeded"))
    circular: dict[str, object] = {}
    circular["self"] = circular
    assert not is_provider_limit(BodyError("request failed", circular))


def test_builtin_network_errors_are_not_limits() -> None:
    assert not is_provider_limit(TimeoutError())
    assert not is_provider_limit(ConnectionResetError("Connection reset by peer"))
    assert not is_provider_limit(ValueError("bad value"))


def _wrapped(cause: BaseException, *, implicit: bool) -> RuntimeError:
    try:
        try:
            raise cause
        except BaseException as exc:
            if implicit:
                raise RuntimeError("the agent run failed")  # noqa: B904 - the __context__ path
            raise RuntimeError("the agent run failed") from exc
    except RuntimeError as wrapped:
        return wrapped


@pytest.mark.parametrize("implicit", [False, True])
def test_causes_are_followed(implicit: bool) -> None:
    assert is_provider_limit(_wrapped(_httpx_error(429), implicit=implicit))
    assert not is_provider_limit(_wrapped(TimeoutError(), implicit=implicit))
    assert not is_provider_limit(_wrapped(_httpx_error(502), implicit=implicit))


def test_a_long_cycle_of_causes_terminates() -> None:
    first = RuntimeError("a")
    second = RuntimeError("b")
    first.__cause__ = second
    second.__cause__ = first
    assert not is_provider_limit(first)


def test_exception_groups() -> None:
    assert is_provider_limit(ExceptionGroup("many", [ValueError("x"), _httpx_error(429)]))
    assert not is_provider_limit(ExceptionGroup("many", [ValueError("x"), _httpx_error(500)]))
    assert not is_provider_limit(BaseExceptionGroup("many", [KeyboardInterrupt()]))
