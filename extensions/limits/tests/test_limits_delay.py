"""Reading the provider's requested wait from headers and bodies."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lovely_coordinator_limits import (
    delay_from_body,
    delay_from_headers,
    parse_duration,
    parse_retry_after,
    parse_timestamp,
    retry_delay,
)

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1.5s", 1.5),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("7.66s", 7.66),
        ("500us", 0.0005),
        ("2", 2.0),
        (" 30s ", 30.0),
        (".5s", 0.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "abc", "1x", "-1s", "1s2", "s", "1 s", "inf", "nan", "1e3s", "1..2s"]
)
def test_parse_duration_rejects(text: str) -> None:
    assert parse_duration(text) is None


@given(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_parse_duration_round_trips_go_formatting(h: int, m: int, s: int, ms: int) -> None:
    text = (f"{h}h" if h else "") + (f"{m}m" if h or m else "") + f"{s}.{ms:03d}s"
    assert parse_duration(text) == pytest.approx(h * 3600 + m * 60 + s + ms / 1000)


def test_parse_retry_after_seconds_and_dates() -> None:
    assert parse_retry_after("30", now=NOW) == 30.0
    assert parse_retry_after("1.5", now=NOW) == 1.5
    later = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, now=NOW) == 90.0
    earlier = format_datetime(NOW - timedelta(hours=1), usegmt=True)
    assert parse_retry_after(earlier, now=NOW) == 0.0
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:10 -0000", now=NOW) == 10.0
    for bad in ["soon", "-5", "", "1e9"]:
        assert parse_retry_after(bad, now=NOW) is None


@given(st.integers(0, 10**6))
def test_parse_retry_after_http_dates(seconds: int) -> None:
    date = format_datetime(NOW + timedelta(seconds=seconds), usegmt=True)
    assert parse_retry_after(date, now=NOW) == seconds


def test_parse_timestamp() -> None:
    assert parse_timestamp("2026-01-01T12:00:30Z", now=NOW) == 30.0
    assert parse_timestamp("2026-01-01T12:00:00.250Z", now=NOW) == 0.25
    assert parse_timestamp("2026-01-01T13:00:05+01:00", now=NOW) == 5.0
    assert parse_timestamp("2026-01-01T11:00:00Z", now=NOW) == 0.0
    assert parse_timestamp("2026-01-01T12:00:30", now=NOW) is None  # no offset
    assert parse_timestamp("tomorrow", now=NOW) is None


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After-Ms": "1500", "Retry-After": "9"}, 1.5),
        ({"retry-after": "2"}, 2.0),
        ({"Retry-After": "Thu, 01 Jan 2026 12:00:07 GMT"}, 7.0),
        ({"x-ratelimit-reset-requests": "6m0s"}, 360.0),
        ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}, 1.0),
        (
            {
                "x-ratelimit-reset-requests": "1s",
                "x-ratelimit-remaining-requests": "5",
                "x-ratelimit-reset-tokens": "6m0s",
                "x-ratelimit-remaining-tokens": "0",
            },
            360.0,
        ),
        (
            {
                "anthropic-ratelimit-requests-reset": "2026-01-01T12:00:20Z",
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-tokens-reset": "2026-01-01T12:00:03Z",
                "anthropic-ratelimit-tokens-remaining": "9000",
            },
            20.0,
        ),
        ({"anthropic-ratelimit-output-tokens-reset": "2026-01-01T12:00:04Z"}, 4.0),
        ({"retry-after": "garbage", "x-ratelimit-reset-tokens": "3s"}, 3.0),
        ({"retry-after-ms": "soon", "retry-after": "4"}, 4.0),
        ({"content-type": "application/json"}, None),
        ({}, None),
    ],
)
def test_delay_from_headers(headers: dict[str, str], seconds: float | None) -> None:
    assert delay_from_headers(headers, now=NOW) == seconds
    assert delay_from_headers(list(headers.items()), now=NOW) == seconds
    assert delay_from_headers(httpx2.Headers(headers), now=NOW) == seconds


def _gemini(delay: str) -> dict[str, object]:
    return {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
            ],
        }
    }


def test_a_body_nested_past_the_parser_gives_no_delay() -> None:
    """Regression: it raised RecursionError, out of the transport, instead of the 429."""
    assert delay_from_body(b"[" * 100_000) is None
    assert delay_from_body("[" * 100_000) is None


def test_delay_from_body() -> None:
    assert delay_from_body(_gemini("30s")) == 30.0
    assert delay_from_body([_gemini("1.5s")]) == 1.5
    assert delay_from_body(json.dumps(_gemini("12s"))) == 12.0
    assert delay_from_body(json.dumps(_gemini("12s")).encode()) == 12.0
    assert delay_from_body(_gemini("soon")) is None
    assert delay_from_body({"error": {"details": "none"}}) is None
    assert delay_from_body({"error": {"details": [{"@type": "other", "retryDelay": "1s"}]}}) is None
    assert delay_from_body("not json") is None
    assert delay_from_body(None) is None
    assert delay_from_body(42) is None


def test_retry_delay_from_responses_and_errors() -> None:
    request = httpx.Request("POST", "https://example.com")
    headered = httpx.Response(429, headers={"retry-after": "3"}, request=request)
    assert retry_delay(headered, now=NOW) == 3.0
    error = httpx.HTTPStatusError("429", request=request, response=headered)
    assert retry_delay(error, now=NOW) == 3.0
    # Gemini: nothing in the headers, the delay is in the (already read) body.
    body = httpx2.Response(429, json=_gemini("8s"))
    assert retry_delay(body, now=NOW) == 8.0
    assert retry_delay(httpx2.Response(429), now=NOW) is None


def test_retry_delay_ignores_an_unread_streaming_body() -> None:
    unread = httpx2.Response(429, stream=httpx2.ByteStream(b"{}"))
    with pytest.raises(httpx2.ResponseNotRead):
        _ = unread.content
    assert retry_delay(unread, now=NOW) is None
    assert retry_delay(ValueError("no response"), now=NOW) is None


@given(
    st.integers(0, 10**7),
    st.one_of(st.none(), st.integers(0, 10**5).map(str)),
    st.one_of(st.none(), st.sampled_from(["6m0s", "1.5s", "20ms"])),
)
def test_retry_after_ms_wins_over_every_other_header(
    milliseconds: int, retry_after: str | None, reset: str | None
) -> None:
    headers = {"retry-after-ms": str(milliseconds)}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    if reset is not None:
        headers["x-ratelimit-reset-tokens"] = reset
    assert delay_from_headers(headers, now=NOW) == milliseconds / 1000


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)))
def test_parse_timestamp_round_trips(moment: datetime) -> None:
    aware = moment.replace(tzinfo=UTC)
    expected = max(0.0, (aware - NOW).total_seconds())
    assert parse_timestamp(aware.isoformat(), now=NOW) == pytest.approx(expected)
    assert parse_timestamp(aware.isoformat().replace("+00:00", "Z"), now=NOW) == pytest.approx(
        expected
    )
