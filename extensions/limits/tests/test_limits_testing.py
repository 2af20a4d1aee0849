"""The served fake provider, with the real openai and anthropic SDK clients.

It enforces its quotas itself and says so in its headers, reports usage (streams
included), and holds requests on demand so a test can count what is in flight.
"""

from __future__ import annotations

import gc

import anthropic
import anyio
import anyio.to_thread
import openai
import pytest
from lovely_coordinator_limits import Usage, rate_limits_from_headers
from lovely_coordinator_limits.testing import FakeProvider, Quota, Refuse, openai_sse_on_trio

pytestmark = pytest.mark.anyio


def _openai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="test", base_url=f"{url}/v1", max_retries=0)


def _anthropic(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0)


async def test_a_quota_is_enforced_and_reported(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        # 60 a minute over a 3 s window: 3 at once (the refill of 1 a second is too slow
        # to matter within this test).
        fake_provider.limit("gpt-test", Quota(requests_per_minute=60, window=3))
        async with _openai(fake_provider_url) as client:
            remaining = []
            for _ in range(3):
                raw = await client.chat.completions.with_raw_response.create(
                    model="gpt-test", messages=[{"role": "user", "content": "hi"}]
                )
                limits = rate_limits_from_headers(raw.headers)
                assert limits.requests is not None
                assert limits.requests.per_minute == 60
                remaining.append(limits.requests.remaining)
            assert remaining == [2, 1, 0]
            with pytest.raises(openai.RateLimitError) as caught:
                await client.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "hi"}]
                )
        headers = caught.value.response.headers
        assert 1 <= int(headers["retry-after"]) <= 2
        assert 0 < int(headers["retry-after-ms"]) <= 1000
        assert [s.status for s in fake_provider.seen("gpt-test")] == [200, 200, 200, 429]


async def test_tokens_are_counted_at_admission_and_reported_as_usage(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        fake_provider.limit("gpt-test", Quota(tokens_per_minute=600, window=10))  # 100 at once
        async with _openai(fake_provider_url) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-test", messages=[{"role": "user", "content": "x" * 40}], max_tokens=60
            )
            reply = raw.parse()
            assert reply.usage is not None
            assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (13, 1)
            # Charged 13 + 60 at admission; the headers were sent before the unused 59
            # came back.
            assert raw.headers["x-ratelimit-remaining-tokens"] == "27"
            with pytest.raises(openai.RateLimitError):  # 13 + 90 > 86 left after the give-back
                await client.chat.completions.create(
                    model="gpt-test",
                    messages=[{"role": "user", "content": "x" * 40}],
                    max_tokens=90,
                )
        (first, second) = fake_provider.seen("gpt-test")
        assert (first.input_tokens, first.output_tokens, second.status) == (13, 1, 429)


@openai_sse_on_trio
async def test_openai_streams_report_usage_when_asked(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        fake_provider.reply = "a longer answer"
        async with _openai(fake_provider_url) as client:
            stream = await client.chat.completions.create(
                model="gpt-test",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", None
            async for chunk in stream:
                text += "".join(c.delta.content or "" for c in chunk.choices)
                usage = chunk.usage or usage
        assert text == "a longer answer"
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (4, 4)
        del stream
        gc.collect()


async def test_anthropic_streams_and_headers(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        quota = Quota(requests_per_minute=50, input_tokens_per_minute=9_000, window=60)
        fake_provider.limit("claude-test", quota)
        async with (
            _anthropic(fake_provider_url) as client,
            client.messages.stream(
                model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            ) as stream,
        ):
            message = await stream.get_final_message()
            headers = stream.response.headers
        assert message.usage.input_tokens == 4
        assert message.usage.output_tokens == 1
        limits = rate_limits_from_headers(headers)
        assert limits.requests is not None
        assert limits.requests.remaining == 49
        assert limits.tokens is not None
        assert (limits.tokens.per_minute, limits.tokens.remaining) == (9_000, 8_996)
        (seen,) = fake_provider.seen("claude-test")
        assert Usage(seen.input_tokens, seen.output_tokens) == Usage(4, 1)


async def test_held_requests_are_in_flight_until_resumed(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        fake_provider.pause("gpt-test")
        answers: list[str | None] = []
        async with _openai(fake_provider_url) as client, anyio.create_task_group() as tg:

            async def ask() -> None:
                reply = await client.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "hi"}]
                )
                answers.append(reply.choices[0].message.content)

            for _ in range(3):
                tg.start_soon(ask)
            assert await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, None, 3)
            assert fake_provider.in_flight("gpt-test") == 3
            assert answers == []
            fake_provider.resume("gpt-test")
        assert answers == ["ok"] * 3
        # The provider's count drops when its handler ends, just after the client has read
        # the answer: wait for it (another thread's state; bounded by fail_after).
        while fake_provider.in_flight():  # noqa: ASYNC110 (a thread's state, no event)
            await anyio.sleep(0.001)
        assert fake_provider.peak_in_flight("gpt-test") == 3
        assert not fake_provider.wait_for_in_flight("gpt-test", 1, timeout=0)


async def test_scripted_refusals_come_first_and_skip_the_quota(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        fake_provider.limit("gpt-test", Quota(requests_per_minute=60))
        fake_provider.script("gpt-test", Refuse(500, body={"error": {"message": "boom"}}))
        async with _openai(fake_provider_url) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "hi"}]
                )
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
        assert raw.headers["x-ratelimit-remaining-requests"] == "59"
