"""Real openai and anthropic SDK clients against the local fake fake_provider.

The SDKs raise their own exception types from real HTTP responses; the classification
and wait parsing must work on exactly those objects.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import anthropic
import anyio
import openai
import pytest
from lovely_coordinator_limits import is_provider_limit, retry_delay
from lovely_coordinator_limits.testing import FakeProvider, Refuse

pytestmark = pytest.mark.anyio


def _openai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="test", base_url=f"{url}/v1", max_retries=0)


def _anthropic(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0)


async def _ask_openai(url: str, model: str) -> str | None:
    async with _openai(url) as client:
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
        return reply.choices[0].message.content


async def _ask_anthropic(url: str, model: str) -> str:
    async with _anthropic(url) as client:
        reply = await client.messages.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        block = reply.content[0]
        assert block.type == "text"
        return block.text


def _in(seconds: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


def _rfc3339_in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [
        ({"retry-after": "7"}, 7.0, 7.0),
        ({"retry-after-ms": "2500"}, 2.5, 2.5),
        ({"retry-after": "HTTP-DATE"}, 25.0, 30.0),
        ({"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "0"}, 360, 360),
        ({"x-ratelimit-reset-tokens": "1.5s"}, 1.5, 1.5),
    ],
)
async def test_openai_rate_limit_errors(
    fake_provider: FakeProvider,
    fake_provider_url: str,
    headers: dict[str, str],
    low: float,
    high: float,
) -> None:
    with anyio.fail_after(10):
        if headers.get("retry-after") == "HTTP-DATE":
            headers = {"retry-after": _in(30)}
        fake_provider.script("gpt-test", Refuse(headers=headers))
        with pytest.raises(openai.RateLimitError) as caught:
            await _ask_openai(fake_provider_url, "gpt-test")
        assert is_provider_limit(caught.value)
        delay = retry_delay(caught.value)
        assert delay is not None
        assert low <= delay <= high
        # The script is used up: the next request succeeds.
        assert await _ask_openai(fake_provider_url, "gpt-test") == "ok"


async def test_openai_insufficient_quota_is_a_limit(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        body = {
            "error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}
        }
        fake_provider.script("gpt-test", Refuse(body=body))
        with pytest.raises(openai.RateLimitError) as caught:
            await _ask_openai(fake_provider_url, "gpt-test")
        assert is_provider_limit(caught.value)
        assert retry_delay(caught.value) is None


@pytest.mark.parametrize(
    ("refusal", "error_type"),
    [
        (Refuse(500, body={"error": {"message": "boom"}}), openai.InternalServerError),
        (
            Refuse(503, body={"error": {"message": "rate limit upstream"}}),
            openai.InternalServerError,
        ),
        (Refuse(401, body={"error": {"message": "Incorrect API key"}}), openai.AuthenticationError),
        (
            Refuse(400, body={"error": {"message": "maximum context length is 8192 tokens"}}),
            openai.BadRequestError,
        ),
    ],
)
async def test_openai_ordinary_errors(
    fake_provider: FakeProvider,
    fake_provider_url: str,
    refusal: Refuse,
    error_type: type[Exception],
) -> None:
    with anyio.fail_after(10):
        fake_provider.script("gpt-test", refusal)
        with pytest.raises(error_type) as caught:
            await _ask_openai(fake_provider_url, "gpt-test")
        assert not is_provider_limit(caught.value)


async def test_openai_connection_error_is_not_a_limit() -> None:
    with anyio.fail_after(10):
        # A port nobody listens on: bind one, close it, and connect there.
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        await listener.aclose()
        with pytest.raises(openai.APIConnectionError) as caught:
            await _ask_openai(f"http://127.0.0.1:{port}", "gpt-test")
        assert not is_provider_limit(caught.value)


async def test_anthropic_rate_limit_with_reset_headers(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        headers = {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": _rfc3339_in(40),
            "anthropic-ratelimit-tokens-remaining": "100",
            "anthropic-ratelimit-tokens-reset": _rfc3339_in(2),
        }
        fake_provider.script("claude-test", Refuse(headers=headers))
        with pytest.raises(anthropic.RateLimitError) as caught:
            await _ask_anthropic(fake_provider_url, "claude-test")
        assert is_provider_limit(caught.value)
        delay = retry_delay(caught.value)
        assert delay is not None
        assert 35.0 <= delay <= 40.0
        assert await _ask_anthropic(fake_provider_url, "claude-test") == "ok"


async def test_anthropic_retry_after(fake_provider: FakeProvider, fake_provider_url: str) -> None:
    with anyio.fail_after(10):
        fake_provider.script("claude-test", Refuse(headers={"retry-after": "12"}))
        with pytest.raises(anthropic.RateLimitError) as caught:
            await _ask_anthropic(fake_provider_url, "claude-test")
        assert retry_delay(caught.value) == 12.0


async def test_anthropic_overloaded_is_not_a_limit(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        fake_provider.script("claude-test", Refuse(529, body=body))
        with pytest.raises(anthropic.APIStatusError) as caught:
            await _ask_anthropic(fake_provider_url, "claude-test")
        assert caught.value.status_code == 529
        assert not is_provider_limit(caught.value)


async def test_anthropic_credit_balance_is_a_limit(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        body = {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "Your credit balance is too low to access the Anthropic API.",
            },
        }
        fake_provider.script("claude-test", Refuse(400, body=body))
        with pytest.raises(anthropic.BadRequestError) as caught:
            await _ask_anthropic(fake_provider_url, "claude-test")
        assert is_provider_limit(caught.value)


async def test_fake_provider_records_requests(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        fake_provider.script("gpt-test", Refuse(), Refuse())
        for _ in range(2):
            with pytest.raises(openai.RateLimitError):
                await _ask_openai(fake_provider_url, "gpt-test")
        assert await _ask_openai(fake_provider_url, "gpt-test") == "ok"
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429, 429, 200]
        assert fake_provider.peak_in_flight("gpt-test") == 1
