"""Rate-limit headers of OpenAI and Anthropic responses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx2
from lovely_coordinator_limits import Limit, RateLimits, rate_limits_from_headers

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def test_openai_headers() -> None:
    headers = httpx2.Headers(
        {
            "X-RateLimit-Limit-Requests": "600",
            "x-ratelimit-remaining-requests": "599",
            "x-ratelimit-reset-requests": "100ms",
            "x-ratelimit-limit-tokens": "480000",
            "x-ratelimit-remaining-tokens": "479000.5",
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    assert rate_limits_from_headers(headers) == RateLimits(
        Limit(600.0, 599.0, 0.1), Limit(480_000.0, 479_000.5, 360.0)
    )


def test_openai_partial_and_broken_headers() -> None:
    limits = rate_limits_from_headers(
        [
            ("x-ratelimit-limit-requests", "-5"),
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-requests", "soon"),
            ("x-ratelimit-limit-tokens", "nan"),
            ("x-ratelimit-remaining-tokens", "1e3"),
        ]
    )
    assert limits == RateLimits(Limit(None, 3.0, None), None)
    assert rate_limits_from_headers({"content-type": "application/json"}).empty
    assert not limits.empty


def _at(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_anthropic_headers_prefer_the_combined_token_limit() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": _at(1.2),
        "anthropic-ratelimit-tokens-limit": "90000",
        "anthropic-ratelimit-tokens-remaining": "80000",
        "anthropic-ratelimit-tokens-reset": _at(6),
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": _at(2),
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
        "anthropic-ratelimit-output-tokens-reset": _at(0),
    }
    assert rate_limits_from_headers(headers, now=NOW) == RateLimits(
        Limit(50.0, 49.0, 1.2), Limit(90_000.0, 80_000.0, 6.0)
    )
    del headers["anthropic-ratelimit-tokens-limit"]
    del headers["anthropic-ratelimit-tokens-remaining"]
    del headers["anthropic-ratelimit-tokens-reset"]
    # Without the combined headers, the input-token limit (met first by prompt-heavy work).
    assert rate_limits_from_headers(headers, now=NOW).tokens == Limit(40_000.0, 39_000.0, 2.0)


def test_anthropic_reset_in_the_past_is_zero() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-reset": _at(-30),
    }
    assert rate_limits_from_headers(headers, now=NOW) == RateLimits(Limit(50.0, None, 0.0), None)


def test_amounts_too_large_to_reason_with_count_as_not_sent() -> None:
    """Regression: a limit near the largest float made the learned rate overflow to
    infinity, which ``learn_budget`` refused, out of the transport."""
    huge = "17" + "0" * 307
    headers = {
        "x-ratelimit-limit-requests": huge,
        "x-ratelimit-remaining-requests": huge,
        "x-ratelimit-limit-tokens": str(2**53 + 2),
        "x-ratelimit-remaining-tokens": "900",
    }
    assert rate_limits_from_headers(headers) == RateLimits(None, Limit(None, 900.0, None))
    headers["x-ratelimit-limit-tokens"] = str(2**53)
    assert rate_limits_from_headers(headers).tokens == Limit(float(2**53), 900.0, None)
