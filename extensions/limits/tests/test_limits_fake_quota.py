"""The fake provider's buckets, on a virtual clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lovely_coordinator_limits import rate_limits_from_headers
from lovely_coordinator_limits._fake_quota import Buckets, Quota, format_duration

from lovely_coordinator import InvalidArgumentError


def test_a_short_window_of_the_announced_rate() -> None:
    # 600 a minute, enforced over 10 s: 100 at once, then 10 a second.
    buckets = Buckets(Quota(requests_per_minute=600, window=10), now=0.0)
    admitted = [buckets.admit(prompt=0, output_limit=0, now=0.0).admitted for _ in range(101)]
    assert admitted == [True] * 100 + [False]
    refused = buckets.admit(prompt=0, output_limit=0, now=0.0)
    assert refused.retry_after == pytest.approx(0.1)
    assert buckets.admit(prompt=0, output_limit=0, now=0.1).admitted
    assert not buckets.admit(prompt=0, output_limit=0, now=0.1).admitted
    headers = buckets.openai_headers()
    assert headers == {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "10s",
    }


def test_tokens_are_charged_prompt_plus_output_limit_and_the_unused_part_comes_back() -> None:
    buckets = Buckets(Quota(tokens_per_minute=6_000, window=10), now=0.0)  # 1,000 at once
    assert buckets.admit(prompt=300, output_limit=200, now=0.0).admitted
    assert buckets.openai_headers()["x-ratelimit-remaining-tokens"] == "500"
    refused = buckets.admit(prompt=400, output_limit=200, now=0.0)
    assert not refused.admitted
    assert refused.retry_after == pytest.approx(1.0)  # 100 short at 100 a second
    buckets.give_back(150, now=0.0)  # the completion used 50 of its 200
    assert buckets.admit(prompt=400, output_limit=200, now=0.0).admitted
    buckets.give_back(10_000, now=0.0)
    assert buckets.openai_headers()["x-ratelimit-remaining-tokens"] == "1000"  # never above full


def test_a_request_larger_than_the_bucket_is_refused_for_a_whole_window() -> None:
    buckets = Buckets(Quota(tokens_per_minute=600), now=0.0)
    refused = buckets.admit(prompt=700, output_limit=0, now=0.0)
    assert (refused.admitted, refused.retry_after) == (False, 60.0)


def test_a_refused_request_draws_nothing() -> None:
    buckets = Buckets(Quota(requests_per_minute=60, tokens_per_minute=600, window=1), now=0.0)
    assert not buckets.admit(prompt=20, output_limit=0, now=0.0).admitted  # 10 tokens at once
    assert buckets.openai_headers()["x-ratelimit-remaining-requests"] == "1"


def test_anthropic_headers_report_every_enforced_bucket() -> None:
    quota = Quota(
        requests_per_minute=50,
        input_tokens_per_minute=30_000,
        output_tokens_per_minute=6_000,
        window=60,
    )
    buckets = Buckets(quota, now=0.0)
    assert buckets.admit(prompt=1_000, output_limit=600, now=0.0).admitted
    wall = datetime(2026, 1, 1, tzinfo=UTC)
    headers = buckets.anthropic_headers(wall)
    assert headers["anthropic-ratelimit-requests-remaining"] == "49"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "29000"
    assert headers["anthropic-ratelimit-output-tokens-limit"] == "6000"
    assert headers["anthropic-ratelimit-output-tokens-reset"] == "2026-01-01T00:00:06.000+00:00"
    assert "anthropic-ratelimit-tokens-limit" not in headers
    # What the client reads of them: the input limit stands in for the tokens.
    limits = rate_limits_from_headers(headers, now=wall)
    assert limits.requests is not None
    assert limits.requests.remaining == 49
    assert limits.tokens is not None
    assert (limits.tokens.per_minute, limits.tokens.remaining) == (30_000, 29_000)
    assert limits.tokens.reset == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (0.0204, "20ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (360.0, "6m0s"),
        (61.25, "1m1.25s"),
    ],
)
def test_durations_as_openai_writes_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "quota",
    [
        {"requests_per_minute": 0},
        {"tokens_per_minute": float("nan")},
        {"window": -1},
        {"output_tokens_per_minute": True},
    ],
)
def test_bad_quotas(quota: dict[str, float]) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"^Quota values must be positive finite numbers or None$"
    ):
        Quota(**quota)
