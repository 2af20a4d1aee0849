"""What the transport does around each request: the cap, budgets, settlement, 429 retries.

The real openai and anthropic SDK clients (``max_retries=0``) against the local fake
provider, which enforces its quotas itself and can hold requests so a test can count what
is in flight. The first tests are the regressions of issue 11's user-found bugs.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anthropic
import anyio
import anyio.to_thread
import httpx2
import openai
import pytest
from lovely_coordinator_dev.testing.waits import until_statistics
from lovely_coordinator_httpx import CoordinatedTransport
from lovely_coordinator_limits import ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Quota, Refuse, openai_sse_on_trio

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    ModelTuple,
    TupleStatistics,
    create_agent_coordinator,
)

pytestmark = pytest.mark.anyio

PROVIDERS = {"127.0.0.1": "local"}
T = ModelTuple("local", "gpt-test")


@asynccontextmanager
async def _openai(
    url: str, coordinator: AgentCoordinator, **options: object
) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = CoordinatedTransport(coordinator, providers=PROVIDERS, **options)  # type: ignore[arg-type]
    async with openai.AsyncOpenAI(
        api_key="test",
        base_url=f"{url}/v1",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=transport),
    ) as client:
        yield client


def _entry(coordinator: AgentCoordinator, t: ModelTuple = T) -> TupleStatistics | None:
    return next((e for e in coordinator.statistics().tuples if e.tuple == t), None)


async def _chat(client: openai.AsyncOpenAI, model: str = "gpt-test", content: str = "hi") -> str:
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=16
    )
    return reply.choices[0].message.content or ""


async def test_calls_fanned_out_under_one_permit_stay_within_the_cap(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    """Regression (issue 11, bug 1): ten concurrent calls inside one permit all reached the
    provider at once at max_concurrency=4, each treating the inherited permit as cover."""
    with anyio.fail_after(20):
        coordinator = create_agent_coordinator(4)
        fake_provider.pause("gpt-test")
        answers: list[str] = []
        async with _openai(fake_provider_url, coordinator) as client, coordinator.permit(T):

            async def ask() -> None:
                answers.append(await _chat(client))

            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(ask)
                # The permit covers one call, three more take the free slots, six wait.
                await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, "gpt-test", 4)
                await until_statistics(coordinator, lambda s: s.queued == 6)
                assert fake_provider.in_flight("gpt-test") == 4
                fake_provider.resume("gpt-test")
        assert answers == ["ok"] * 10
        assert fake_provider.peak_in_flight("gpt-test") == 4
        stats = coordinator.statistics()
        assert (stats.active, stats.queued) == (0, 0)


async def test_a_429_is_retried_without_holding_a_slot_and_keeps_its_place(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    """Regression (issue 11, bug 3): with the SDK's retries off, a 429 was the caller's
    lost work; with them on, the slot sat idle through the SDK's backoff."""
    with anyio.fail_after(20):
        coordinator = create_agent_coordinator(1)
        fake_provider.script("gpt-test", Refuse(headers={"retry-after": "60"}))
        finished: list[str] = []
        async with _openai(fake_provider_url, coordinator) as client:

            async def ask(name: str, model: str = "gpt-test") -> None:
                await _chat(client, model, name)
                finished.append(name)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "first")
                await until_statistics(coordinator, lambda s: not coordinator.is_tuple_open(T))
                await until_statistics(coordinator, lambda s: s.queued == 1 and s.active == 0)
                # The slot is free meanwhile: another model's call goes through at once.
                await ask("other model", "calm")
                # A later call for the closed model queues behind the first.
                tg.start_soon(ask, "second")
                await until_statistics(coordinator, lambda s: s.queued == 2)
                coordinator.open_tuple(T)  # the wait is over (rather than wait 60 s)
        assert finished == ["other model", "first", "second"]
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429, 200, 200]


async def test_after_max_attempts_the_429_reaches_the_caller(
    fake_provider: FakeProvider, fake_provider_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(20):
        coordinator = create_agent_coordinator(2)
        fake_provider.script("gpt-test", *[Refuse(headers={"retry-after-ms": "1"})] * 3)
        with caplog.at_level(logging.DEBUG, logger="lovely_coordinator.httpx"):
            async with _openai(fake_provider_url, coordinator, max_attempts=3) as client:
                with pytest.raises(openai.RateLimitError):
                    await _chat(client)
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429, 429, 429]
        messages = [r.getMessage() for r in caplog.records if r.name == "lovely_coordinator.httpx"]
        assert messages == [
            "local/gpt-test: HTTP 429, sending again after the reopen (attempt 2 of 3)",
            "local/gpt-test: HTTP 429, sending again after the reopen (attempt 3 of 3)",
            "local/gpt-test: HTTP 429 after 3 attempts, passed to the caller",
        ]
        assert "hi" not in caplog.text  # no payloads in the logs
        stats = coordinator.statistics()
        assert (stats.active, stats.queued) == (0, 0)


@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_never_retried(
    fake_provider: FakeProvider, fake_provider_url: str, status: int
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        fake_provider.script("gpt-test", Refuse(status, body={"error": {"message": "boom"}}))
        async with _openai(fake_provider_url, coordinator) as client:
            with pytest.raises(openai.APIStatusError) as caught:
                await _chat(client)
            assert caught.value.status_code == status
        assert [s.status for s in fake_provider.seen("gpt-test")] == [status]
        assert coordinator.is_tuple_open(T)
        assert coordinator.statistics().active == 0


async def test_a_rejecting_transport_passes_429s_on_at_once(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        fake_provider.script("gpt-test", Refuse(headers={"retry-after-ms": "1"}))
        async with _openai(fake_provider_url, coordinator, reject_on_closed_tuple=True) as client:
            with pytest.raises(openai.RateLimitError):
                await _chat(client)
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429]


async def test_a_request_cancelled_while_it_waits_to_resend_leaves_nothing(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)
        fake_provider.script("gpt-test", Refuse(headers={"retry-after": "60"}))
        async with _openai(fake_provider_url, coordinator) as client:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_chat, client)
                    await until_statistics(coordinator, lambda s: not coordinator.is_tuple_open(T))
                    await until_statistics(coordinator, lambda s: s.queued == 1)
                    scope.cancel()
            stats = coordinator.statistics()
            assert (stats.active, stats.queued) == (0, 0)
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429]


STORM, CALM = "storm", ("calm-1", "calm-2")


async def test_a_429_storm_on_one_tuple_while_two_others_flow(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(30):
        coordinator = create_agent_coordinator(3)
        # The storm model admits two requests at once, then two a second; six arrive at once.
        fake_provider.limit(STORM, Quota(requests_per_minute=120, window=1))
        fake_provider.latency = 0.05
        done: dict[str, int] = dict.fromkeys((STORM, *CALM), 0)
        async with _openai(fake_provider_url, coordinator) as client:

            async def ask(model: str) -> None:
                assert await _chat(client, model) == "ok"  # never an error: 429s are retried
                done[model] += 1

            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(ask, STORM)
                storm = ModelTuple("local", STORM)
                await until_statistics(coordinator, lambda s: not coordinator.is_tuple_open(storm))
                for model in CALM:
                    for _ in range(10):
                        tg.start_soon(ask, model)
        assert done == {STORM: 6, CALM[0]: 10, CALM[1]: 10}
        statuses = [s.status for s in fake_provider.seen(STORM)]
        assert statuses.count(200) == 6
        assert statuses.count(429) >= 1  # there was a storm, and no call was lost to it
        assert all(s.status == 200 for model in CALM for s in fake_provider.seen(model))
        assert fake_provider.peak_in_flight() <= 3
        stats = coordinator.statistics()
        assert (stats.active, stats.queued) == (0, 0)


async def test_budgets_are_learned_from_the_headers(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        fake_provider.limit("gpt-test", Quota(requests_per_minute=60, tokens_per_minute=6_000))
        async with _openai(fake_provider_url, coordinator) as client:
            assert _entry(coordinator) is None
            await _chat(client)
            entry = _entry(coordinator)
            assert entry is not None
            # The provider had 59 requests left right after admitting this one.
            assert entry.requests_available is not None
            assert entry.requests_available <= 59.5
            assert entry.tokens_available is not None
        async with _openai(fake_provider_url, coordinator, learn_budgets=False) as client:
            other = ModelTuple("local", "other")
            fake_provider.limit("other", Quota(requests_per_minute=60))
            await _chat(client, "other")
            assert _entry(coordinator, other) is None


async def test_an_explicit_budget_keeps_its_rate(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        coordinator.set_budget(T, requests_per_minute=6)  # stricter than the provider's 60
        fake_provider.limit("gpt-test", Quota(requests_per_minute=60))
        async with _openai(fake_provider_url, coordinator) as client:
            start = anyio.current_time()
            await _chat(client)
        entry = _entry(coordinator)
        # After the read: the bucket refills until the snapshot is taken.
        elapsed = anyio.current_time() - start
        assert entry is not None
        assert entry.requests_available is not None
        # Still the user's 6 a minute, one spent: a learned 60 would have left about 59.
        assert 5 <= entry.requests_available <= 5 + elapsed / 10 + 1e-6


async def test_the_usage_settles_the_charge(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        coordinator.set_budget(T, tokens_per_minute=600)  # 10 a second: refill is small
        async with _openai(fake_provider_url, coordinator) as client:
            start = anyio.current_time()
            await _chat(client, content="x" * 40)
        entry = _entry(coordinator)
        # After the read: the bucket refills until the snapshot is taken.
        elapsed = anyio.current_time() - start
        assert entry is not None
        assert entry.tokens_available is not None
        # Estimated 10 + 16 at admission; the provider counted 13 in and 1 out.
        used = 13 + 1
        assert 600 - used <= entry.tokens_available <= 600 - used + 10 * elapsed + 1e-6


@openai_sse_on_trio
async def test_an_openai_stream_settles_from_its_usage_chunk_when_closed(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        coordinator.set_budget(T, tokens_per_minute=600)
        async with _openai(fake_provider_url, coordinator) as client:
            start = anyio.current_time()
            stream = await client.chat.completions.create(
                model="gpt-test",
                messages=[{"role": "user", "content": "x" * 40}],
                max_tokens=100,
                stream=True,
                stream_options={"include_usage": True},
            )
            async with stream:
                async for _chunk in stream:
                    # Still streaming: the call holds its slot, charged its estimate.
                    assert coordinator.active_count == 1
            assert coordinator.active_count == 0
        entry = _entry(coordinator)
        # After the read: the bucket refills until the snapshot is taken.
        elapsed = anyio.current_time() - start
        assert entry is not None
        assert entry.tokens_available is not None
        assert 600 - 14 <= entry.tokens_available <= 600 - 14 + 10 * elapsed + 1e-6
        del stream, _chunk
        gc.collect()


async def test_an_anthropic_stream_settles_from_its_message_delta(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        t = ModelTuple("local", "claude-test")
        coordinator.set_budget(t, tokens_per_minute=600)
        transport = CoordinatedTransport(coordinator, providers=PROVIDERS)
        async with anthropic.AsyncAnthropic(
            api_key="test",
            base_url=fake_provider_url,
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=transport),
        ) as client:
            start = anyio.current_time()
            async with client.messages.stream(
                model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                await stream.get_final_message()
        entry = _entry(coordinator, t)
        # After the read: the bucket refills until the snapshot is taken.
        elapsed = anyio.current_time() - start
        assert entry is not None
        assert entry.tokens_available is not None
        assert 600 - 5 <= entry.tokens_available <= 600 - 5 + 10 * elapsed + 1e-6


# A chat completion as the provider would send it, for scripted answers with odd headers
# or usage.
_COMPLETION = {
    "id": "chatcmpl-scripted",
    "object": "chat.completion",
    "created": 0,
    "model": "gpt-test",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


async def test_absurd_rate_limit_headers_do_not_fail_the_call(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    """Regression: a limit too large to reason with (a plain decimal near the largest
    float) made the learned rate overflow to infinity, and ``learn_budget`` raised out of
    the transport: the provider's answer became an InvalidArgumentError."""
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        huge = "17" + "0" * 307
        headers = {
            "x-ratelimit-limit-requests": huge,
            "x-ratelimit-remaining-requests": huge,
            "x-ratelimit-reset-requests": "0s",
        }
        fake_provider.script("gpt-test", Refuse(200, headers=headers, body=_COMPLETION))
        async with _openai(fake_provider_url, coordinator) as client:
            assert await _chat(client) == "ok"
        assert _entry(coordinator) is None  # nothing learned from it
        assert coordinator.active_count == 0


@pytest.mark.parametrize("prompt_tokens", [2**53 + 1, 10**30])
async def test_absurd_usage_does_not_fail_the_call(
    fake_provider: FakeProvider, fake_provider_url: str, prompt_tokens: int
) -> None:
    """Regression: usage above what a budget counts made the settlement raise when the
    body was closed, so the answer never reached the caller."""
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        coordinator.set_budget(T, tokens_per_minute=600)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": 1}
        fake_provider.script("gpt-test", Refuse(200, body={**_COMPLETION, "usage": usage}))
        async with _openai(fake_provider_url, coordinator) as client:
            assert await _chat(client) == "ok"
        entry = _entry(coordinator)
        assert entry is not None
        assert entry.tokens_available is not None
        assert entry.tokens_available <= 600 - 2**53 + 60  # charged the most a budget counts
        assert coordinator.active_count == 0


async def test_every_extension_shares_one_handler(fake_provider_url: str) -> None:
    coordinator = create_agent_coordinator(2)
    first = CoordinatedTransport(coordinator)
    second = CoordinatedTransport(coordinator)
    assert first.handler is second.handler is ProviderLimitHandler.for_coordinator(coordinator)
    assert first.max_attempts == 5
    for bad in (0, -1, True, 2.0):
        with pytest.raises(
            InvalidArgumentError, match=r"^max_attempts must be a positive integer$"
        ):
            CoordinatedTransport(coordinator, max_attempts=bad)  # type: ignore[arg-type]
