"""CoordinatedTransport with the real openai and anthropic SDK clients and a local fake provider."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import anthropic
import anyio
import anyio.lowlevel
import httpx2
import openai
import pytest
from lovely_coordinator_dev.testing.waits import until_statistics
from lovely_coordinator_httpx import CoordinatedTransport
from lovely_coordinator_limits import Backoff, ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Refuse, openai_sse_on_trio
from openai.types.chat import ChatCompletionMessageParam

from lovely_coordinator import (
    AgentCoordinator,
    CoordinatorStatistics,
    ModelTuple,
    TupleSuspendedError,
    create_agent_coordinator,
)

pytestmark = pytest.mark.anyio

PROVIDERS = {"127.0.0.1": "local"}

# Tests of openai streams are marked openai_sse_on_trio (the SDK leaves its generator chain
# unclosed, which trio reports); they collect garbage before they end, so the warnings land
# in the test that is filtered and not in a later one. The transport adds no generator of
# its own to that chain.


def _transport(
    coordinator: AgentCoordinator, *, backoff: Backoff | None = None, reject: bool = False
) -> CoordinatedTransport:
    # One attempt: these tests look at what a single limit does to the gate, so the 429
    # must reach the caller; the transport's retries are tested in test_httpx_gate.
    handler = ProviderLimitHandler(coordinator, backoff=backoff)
    return CoordinatedTransport(
        coordinator,
        handler=handler,
        providers=PROVIDERS,
        reject_on_closed_tuple=reject,
        max_attempts=1,
    )


@asynccontextmanager
async def _openai(url: str, transport: CoordinatedTransport) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx2.AsyncClient(transport=transport)
    async with openai.AsyncOpenAI(
        api_key="test", base_url=f"{url}/v1", max_retries=0, http_client=http
    ) as client:
        yield client


@asynccontextmanager
async def _anthropic(
    url: str, transport: CoordinatedTransport
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    http = httpx2.AsyncClient(transport=transport)
    async with anthropic.AsyncAnthropic(
        api_key="test", base_url=url, max_retries=0, http_client=http
    ) as client:
        yield client


async def _chat(client: openai.AsyncOpenAI, model: str) -> str | None:
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return reply.choices[0].message.content


async def _message(client: anthropic.AsyncAnthropic, model: str) -> str:
    reply = await client.messages.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    block = reply.content[0]
    assert block.type == "text"
    return block.text


@pytest.mark.parametrize("under_a_bash_permit", [False, True])
async def test_a_request_waits_for_a_permit(
    provider: FakeProvider, url: str, under_a_bash_permit: bool
) -> None:
    """Also when the caller holds a permit of another coordinator (the Bash pool): only a
    permit of the transport's own coordinator stands in for the request's."""
    with anyio.fail_after(10):
        coordinator, bash = create_agent_coordinator(1), create_agent_coordinator(1)
        t = ModelTuple("local", "gpt-test")
        answers: list[str | None] = []
        async with _openai(url, _transport(coordinator)) as client:
            held = await coordinator.acquire(t)
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    async with contextlib.AsyncExitStack() as stack:
                        if under_a_bash_permit:
                            await stack.enter_async_context(bash.permit(("bash", "pool")))
                        answers.append(await _chat(client, "gpt-test"))

                tg.start_soon(ask)
                # Event-driven, not wait_all_tasks_blocked(): the SDK may park the task on a
                # worker thread (platform detection) before it reaches the transport.
                await until_statistics(coordinator, lambda s: s.queued == 1)
                assert provider.seen() == []
                held.release()
        assert answers == ["ok"]
        assert coordinator.active_count == 0
        assert coordinator.queued_count == 0
        assert bash.active_count == 0


async def test_a_request_under_a_held_permit_uses_it(provider: FakeProvider, url: str) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)
        async with (
            _openai(url, _transport(coordinator)) as client,
            coordinator.permit(("local", "gpt-test")),
        ):
            # A second acquire would wait behind ourselves forever at max_concurrency=1.
            assert await _chat(client, "gpt-test") == "ok"
            assert coordinator.active_count == 1
        assert coordinator.active_count == 0


@openai_sse_on_trio
async def test_openai_stream_holds_the_permit_until_closed(
    provider: FakeProvider, url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        async with _openai(url, _transport(coordinator)) as client:
            stream = await client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async with stream:
                pieces: list[str] = []
                async for chunk in stream:
                    # Headers arrived long ago; the body is still open.
                    assert coordinator.active_count == 1
                    pieces.append(chunk.choices[0].delta.content or "")
            assert "".join(pieces) == "ok"
            assert coordinator.active_count == 0
        del stream, chunk
        gc.collect()


@openai_sse_on_trio
async def test_two_open_streams_of_one_task_take_a_slot_each(
    provider: FakeProvider, url: str
) -> None:
    """Regression: the request context of an open stream stayed current in the caller's
    task, so the task's next call of the same tuple joined it: two calls in flight on one
    slot and one draw, past the cap. (At max_concurrency=1 the second would wait.)"""
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        coordinator.set_budget(("local", "gpt-test"), requests_per_minute=60)
        async with _openai(url, _transport(coordinator)) as client:
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
            first = await client.chat.completions.create(
                model="gpt-test", messages=messages, stream=True
            )
            second = await client.chat.completions.create(
                model="gpt-test", messages=messages, stream=True
            )
            assert coordinator.active_count == 2
            (entry,) = coordinator.statistics().tuples
            assert entry.requests_available is not None
            assert entry.requests_available < 59  # two drawn (refill: 1 a second)
            # A plain call meanwhile takes a slot of its own as well.
            async with anyio.create_task_group() as tg:
                tg.start_soon(_chat, client, "gpt-test")
                await until_statistics(coordinator, lambda s: s.queued == 1)
                await first.close()
            await second.close()
            assert coordinator.active_count == 0
        del first, second
        gc.collect()


async def test_anthropic_stream_holds_the_permit_until_closed(
    provider: FakeProvider, url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        async with _anthropic(url, _transport(coordinator)) as client:
            async with client.messages.stream(
                model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                texts: list[str] = []
                async for text in stream.text_stream:
                    assert coordinator.active_count == 1
                    texts.append(text)
            assert "".join(texts) == "ok"
            assert coordinator.active_count == 0
        assert [s.stream for s in provider.seen("claude-test")] == [True]


@openai_sse_on_trio
async def test_a_stream_abandoned_by_cancellation_releases_its_permit(
    provider: FakeProvider, url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)
        async with _openai(url, _transport(coordinator)) as client:
            with anyio.CancelScope() as scope:
                stream = await client.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                async with stream:
                    async for _chunk in stream:
                        assert coordinator.active_count == 1
                        scope.cancel()
                        await (
                            anyio.lowlevel.checkpoint()
                        )  # the checkpoint where the cancellation lands
            assert scope.cancelled_caught
            assert coordinator.active_count == 0
            # The slot really is free: the next request gets it.
            assert await _chat(client, "gpt-test") == "ok"
        del stream
        gc.collect()


async def test_a_request_cancelled_while_queued_leaves_no_trace(
    provider: FakeProvider, url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(1)
        async with _openai(url, _transport(coordinator)) as client:
            held = await coordinator.acquire(("local", "gpt-test"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(_chat, client, "gpt-test")
                await until_statistics(coordinator, lambda s: s.queued == 1)
                tg.cancel_scope.cancel()
            assert coordinator.queued_count == 0
            held.release()
            assert coordinator.active_count == 0
            assert provider.seen() == []


def _rfc3339_in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "40"}, 40.0),
        ({"retry-after-ms": "40000"}, 40.0),
        ({"x-ratelimit-reset-requests": "40s", "x-ratelimit-remaining-requests": "0"}, 40.0),
        ({"x-ratelimit-reset-tokens": "0m40s"}, 40.0),
    ],
)
async def test_openai_429_closes_the_tuple(
    provider: FakeProvider, url: str, headers: dict[str, str], expected: float
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        transport = _transport(coordinator)
        t = ModelTuple("local", "gpt-test")
        provider.script("gpt-test", Refuse(headers=headers))
        async with _openai(url, transport) as client:
            before = anyio.current_time()
            with pytest.raises(openai.RateLimitError):
                await _chat(client, "gpt-test")
        assert not coordinator.is_tuple_open(t)
        reopens_at = coordinator.tuple_reopens_at(t)
        assert reopens_at is not None
        assert before + expected - 1 <= reopens_at <= anyio.current_time() + expected
        state = transport.handler.state(t)
        assert state is not None
        assert state.failures == 1
        assert coordinator.active_count == 0
        # Other tuples are untouched.
        assert coordinator.is_tuple_open(("local", "other"))


async def test_anthropic_429_closes_the_tuple(provider: FakeProvider, url: str) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        t = ModelTuple("local", "claude-test")
        headers = {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": _rfc3339_in(40),
        }
        provider.script("claude-test", Refuse(headers=headers))
        async with _anthropic(url, _transport(coordinator)) as client:
            before = anyio.current_time()
            with pytest.raises(anthropic.RateLimitError):
                await _message(client, "claude-test")
        reopens_at = coordinator.tuple_reopens_at(t)
        assert reopens_at is not None
        assert before + 35 <= reopens_at <= anyio.current_time() + 40
        assert coordinator.active_count == 0


async def test_anthropic_overloaded_keeps_the_tuple_open(provider: FakeProvider, url: str) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        provider.script("claude-test", Refuse(529, body=body))
        async with _anthropic(url, _transport(coordinator)) as client:
            with pytest.raises(anthropic.APIStatusError):
                await _message(client, "claude-test")
        assert coordinator.is_tuple_open(("local", "claude-test"))
        assert coordinator.active_count == 0


async def test_gemini_body_delay_closes_the_tuple(provider: FakeProvider, url: str) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        body = {
            "error": {
                "code": 429,
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "40s"}
                ],
            }
        }
        provider.script("gemini-test", Refuse(body=body))
        async with httpx2.AsyncClient(transport=_transport(coordinator)) as http:
            before = anyio.current_time()
            response = await http.post(
                f"{url}/v1beta/models/gemini-test:generateContent", json={"contents": []}
            )
            assert response.status_code == 429
            assert response.json() == body  # the body read by the transport is still there
        reopens_at = coordinator.tuple_reopens_at(("local", "gemini-test"))
        assert reopens_at is not None
        assert before + 39 <= reopens_at <= anyio.current_time() + 40
        assert coordinator.active_count == 0


async def test_a_closed_tuple_can_reject_foreground_requests(
    provider: FakeProvider, url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        coordinator.close_tuple(("local", "gpt-test"))
        async with httpx2.AsyncClient(transport=_transport(coordinator, reject=True)) as http:
            with pytest.raises(TupleSuspendedError):
                await http.post(f"{url}/v1/chat/completions", json={"model": "gpt-test"})
            # Requests without a model are not scheduled at all.
            response = await http.post(f"{url}/v1/files", json={"purpose": "batch"})
            assert response.status_code == 404
        assert provider.seen("gpt-test") == []


async def test_half_open_probe_after_the_gate_reopens(provider: FakeProvider, url: str) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(4)
        coordinator.set_tuple_limit(("local", "gpt-test"), 3)
        backoff = Backoff(base=0.05, factor=2.0, max_delay=1.0, jitter=0.0)
        transport = _transport(coordinator, backoff=backoff)
        t = ModelTuple("local", "gpt-test")
        # The first request hits a limit; so does the probe after the reopen.
        provider.script("gpt-test", Refuse(headers={"retry-after-ms": "20"}), Refuse())
        async with _openai(url, transport) as client:
            with pytest.raises(openai.RateLimitError):
                await _chat(client, "gpt-test")
            state = transport.handler.state(t)
            assert state is not None
            assert state.failures == 1
            assert state.saved_limit == 3
            # Waits for the timed reopen, goes through as the probe and fails: closed again,
            # for the backoff's second step (no hint this time).
            with pytest.raises(openai.RateLimitError):
                await _chat(client, "gpt-test")
            state = transport.handler.state(t)
            assert state is not None
            assert state.failures == 2
            assert not coordinator.is_tuple_open(t)
            # The next probe succeeds: recovery starts, and a round of two more successes
            # at cap 2 gives the old cap back and ends the episode.
            assert await _chat(client, "gpt-test") == "ok"
            state = transport.handler.state(t)
            assert state is not None
            assert state.cap == 2
            assert await _chat(client, "gpt-test") == "ok"
            assert await _chat(client, "gpt-test") == "ok"
        assert transport.handler.state(t) is None
        assert coordinator.is_tuple_open(t)
        (entry,) = [e for e in coordinator.statistics().tuples if e.tuple == t]
        assert entry.limit == 3
        assert [s.status for s in provider.seen("gpt-test")] == [429, 429, 200, 200, 200]


STORM = ["storm-1", "storm-2", "storm-3"]
CALM = ["calm-1", "calm-2"]


def _closed(snapshot: CoordinatorStatistics) -> set[str]:
    return {e.tuple.model for e in snapshot.tuples if not e.open}


async def test_a_429_storm_on_three_tuples_leaves_the_others_flowing(
    provider: FakeProvider, url: str
) -> None:
    with anyio.fail_after(20):
        coordinator = create_agent_coordinator(3)
        transport = _transport(coordinator)
        for model in STORM:
            provider.script(model, *[Refuse(headers={"retry-after": "60"})] * 3)
        done: dict[str, int] = dict.fromkeys(STORM + CALM, 0)

        async with _openai(url, transport) as client:

            async def persist(model: str) -> None:
                # The SDK does not retry (max_retries=0): the closed gate does the waiting.
                while True:
                    try:
                        assert await _chat(client, model) == "ok"
                    except openai.RateLimitError:
                        continue
                    done[model] += 1
                    return

            async with anyio.create_task_group() as storm:
                for model in STORM:
                    for _ in range(3):
                        storm.start_soon(persist, model)
                await until_statistics(coordinator, lambda s: _closed(s) >= set(STORM))
                async with anyio.create_task_group() as calm:
                    for model in CALM:
                        for _ in range(5):
                            calm.start_soon(persist, model)
                # Every calm request finished while the storm tuples stayed closed (for
                # 60 s) with their requests parked in the queue.
                assert all(done[model] == 5 for model in CALM)
                assert _closed(coordinator.statistics()) == set(STORM)
                assert not any(done[model] for model in STORM)
                # The storm passes; reopen early rather than wait out the 60 s.
                provider.forgive()
                for model in STORM:
                    coordinator.open_tuple(("local", model))
        assert all(done[model] == 3 for model in STORM)
        for model in STORM:
            statuses = [s.status for s in provider.seen(model)]
            assert statuses.count(200) == 3
            assert 1 <= statuses.count(429) <= 3
            assert transport.handler.state(("local", model)) is None
        assert provider.peak_in_flight() <= 3
        stats = coordinator.statistics()
        assert stats.active == 0
        assert stats.queued == 0
        assert all(e.open and e.limit is None for e in stats.tuples)


async def test_a_custom_mapping_and_a_billing_refusal(provider: FakeProvider, url: str) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        seen: list[str] = []

        def by_header(request: httpx2.Request) -> tuple[str, str] | None:
            seen.append(request.url.path)
            team = request.headers.get("x-team")
            return None if team is None else ("team", team)

        transport = CoordinatedTransport(
            coordinator, handler=ProviderLimitHandler(coordinator), tuple_for=by_header
        )
        body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "Your credit balance is too low"},
        }
        provider.script("claude-test", Refuse(400, body=body))
        async with httpx2.AsyncClient(transport=transport) as http:
            payload = {"model": "claude-test", "max_tokens": 1, "messages": []}
            response = await http.post(f"{url}/v1/messages", json=payload, headers={"x-team": "a"})
            assert response.status_code == 400
            # No x-team header: sent without a permit and without a tuple to close.
            response = await http.post(f"{url}/v1/messages", json=payload)
            assert response.status_code == 200
        assert seen == ["/v1/messages", "/v1/messages"]
        assert not coordinator.is_tuple_open(("team", "a"))
        assert coordinator.statistics().active == 0
