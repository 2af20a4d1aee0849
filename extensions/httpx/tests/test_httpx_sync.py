"""CoordinatedSyncTransport: the sync openai and anthropic clients (and plain httpx2 and
httpx clients) from many threads, against the local fake provider.

Threads are plain OS threads; each join and each wait is bounded. What is in flight is
read from the provider (which holds requests on ``pause``) and from the coordinator's
statistics, never guessed from sleeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import anthropic
import anyio
import httpx
import httpx2
import openai
import pytest
from lovely_coordinator_dev.testing.waits import wait_until
from lovely_coordinator_httpx import CoordinatedSyncTransport, CoordinatedTransport, legacy
from lovely_coordinator_limits import ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Refuse

from lovely_coordinator import (
    AgentCoordinator,
    ModelTuple,
    TupleStatistics,
    UsageError,
    create_agent_coordinator,
)

PROVIDERS = {"127.0.0.1": "local"}
T = ModelTuple("local", "gpt-test")
C = ModelTuple("local", "claude-test")
BOUND = 20.0


def _transport(coordinator: AgentCoordinator, **options: object) -> CoordinatedSyncTransport:
    return CoordinatedSyncTransport(
        coordinator,
        handler=ProviderLimitHandler(coordinator),
        providers=PROVIDERS,
        **options,  # type: ignore[arg-type]
    )


@contextmanager
def _openai(url: str, coordinator: AgentCoordinator, **options: object) -> Iterator[openai.OpenAI]:
    http = httpx2.Client(transport=_transport(coordinator, **options))
    with openai.OpenAI(
        api_key="test", base_url=f"{url}/v1", max_retries=0, http_client=http
    ) as client:
        yield client


@contextmanager
def _anthropic(url: str, coordinator: AgentCoordinator) -> Iterator[anthropic.Anthropic]:
    http = httpx2.Client(transport=_transport(coordinator))
    with anthropic.Anthropic(
        api_key="test", base_url=url, max_retries=0, http_client=http
    ) as client:
        yield client


def _chat(client: openai.OpenAI, max_tokens: int = 16) -> str:
    reply = client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens
    )
    return reply.choices[0].message.content or ""


def _entry(coordinator: AgentCoordinator, t: ModelTuple = T) -> TupleStatistics:
    entry = next((e for e in coordinator.statistics().tuples if e.tuple == t), None)
    assert entry is not None
    return entry


def _idle(coordinator: AgentCoordinator) -> None:
    stats = coordinator.statistics()
    assert (stats.active, stats.queued) == (0, 0), stats


def test_eight_threads_of_sync_clients_stay_within_the_cap(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    """Regression (issue 19, finding 4): sync clients were not coordinated at all (with
    LangChain's ChatOpenAI.invoke from 8 threads, 7 calls were in flight at cap 3)."""
    coordinator = create_agent_coordinator(3)
    fake_provider.pause("gpt-test")
    with _openai(fake_provider_url, coordinator) as client, ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_chat, client) for _ in range(8)]
        assert fake_provider.wait_for_in_flight("gpt-test", 3, BOUND)
        wait_until(lambda: coordinator.queued_count == 5, BOUND)
        assert fake_provider.in_flight("gpt-test") == 3
        fake_provider.resume("gpt-test")
        assert [f.result(BOUND) for f in futures] == ["ok"] * 8
    assert fake_provider.peak_in_flight("gpt-test") == 3
    _idle(coordinator)


def test_sync_and_async_callers_share_one_line(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(1)
    fake_provider.pause("gpt-test")
    results: list[str] = []

    async def async_call() -> None:
        transport = CoordinatedTransport(coordinator, providers=PROVIDERS)
        async with openai.AsyncOpenAI(
            api_key="test",
            base_url=f"{fake_provider_url}/v1",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=transport),
        ) as client:
            reply = await client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            results.append("async:" + (reply.choices[0].message.content or ""))

    with _openai(fake_provider_url, coordinator) as client, ThreadPoolExecutor(2) as pool:
        first = pool.submit(anyio.run, async_call)
        assert fake_provider.wait_for_in_flight("gpt-test", 1, BOUND)
        second = pool.submit(lambda: results.append("sync:" + _chat(client)))
        wait_until(lambda: coordinator.queued_count == 1, BOUND)
        fake_provider.resume("gpt-test")
        first.result(BOUND)
        second.result(BOUND)
    assert results == ["async:ok", "sync:ok"]
    assert fake_provider.peak_in_flight("gpt-test") == 1
    _idle(coordinator)


def test_a_429_is_retried_after_the_reopen_from_a_thread(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(2)
    fake_provider.script("gpt-test", Refuse(headers={"retry-after-ms": "50"}))
    with _openai(fake_provider_url, coordinator) as client:
        assert _chat(client) == "ok"
    statuses = [seen.status for seen in fake_provider.seen("gpt-test")]
    assert statuses == [429, 200]
    _idle(coordinator)


def test_headers_set_the_budget_and_the_compressed_usage_settles(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    from lovely_coordinator_limits.testing import Quota

    coordinator = create_agent_coordinator(2)
    fake_provider.limit("gpt-test", Quota(requests_per_minute=600, tokens_per_minute=60_000))
    with _openai(fake_provider_url, coordinator) as client:
        assert _chat(client, max_tokens=4000) == "ok"
    entry = _entry(coordinator)
    assert entry.tokens_available is not None
    # Settled at what the provider counted (a dozen tokens), not the 4,000+ estimate.
    assert entry.tokens_available > 60_000 - 100
    seen = fake_provider.seen("gpt-test")[0]
    assert seen.input_tokens + seen.output_tokens < 100


def test_an_anthropic_sync_message_and_stream(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(2)
    coordinator.set_budget(C, tokens_per_minute=100_000)
    with _anthropic(fake_provider_url, coordinator) as client:
        reply = client.messages.create(
            model="claude-test", max_tokens=3000, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.content[0].type == "text"
        with client.messages.stream(
            model="claude-test", max_tokens=3000, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            assert coordinator.active_count == 1  # the stream holds its slot
            assert "".join(stream.text_stream) == "ok"
        _idle(coordinator)
    available = _entry(coordinator, C).tokens_available
    assert available is not None
    assert available > 100_000 - 100  # both settled from their usage


def test_a_sync_openai_stream_holds_its_slot_until_closed(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(1)
    with _openai(fake_provider_url, coordinator) as client:
        stream = client.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        assert coordinator.active_count == 1
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        stream.close()
        assert text == "ok"
    _idle(coordinator)


def test_the_pool_timeout_bounds_the_wait_and_draws_nothing(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    """Regression (issue 19, finding 3): the client's timeout did not bound the wait."""
    coordinator = create_agent_coordinator(2)
    coordinator.set_budget(T, tokens_per_minute=10_000)
    coordinator.close_tuple(T, reopen_after=60)
    http = httpx2.Client(transport=_transport(coordinator), timeout=httpx2.Timeout(5.0, pool=0.2))
    with openai.OpenAI(
        api_key="test", base_url=f"{fake_provider_url}/v1", max_retries=0, http_client=http
    ) as client:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError) as caught:
            _chat(client)
        assert 0.2 <= time.monotonic() - started < 5
    assert isinstance(caught.value.__cause__, httpx2.PoolTimeout)
    assert "within the pool timeout (0.2 s)" in str(caught.value.__cause__)
    assert coordinator.queued_count == 0
    assert _entry(coordinator).tokens_available == pytest.approx(10_000, abs=1)
    assert fake_provider.seen() == []


def test_the_async_transport_on_a_sync_client_says_which_to_use(fake_provider_url: str) -> None:
    """Regression (issue 19, finding 4): a bare AttributeError on the first call (and
    anthropic's 'Connection error.', retried)."""
    coordinator = create_agent_coordinator()
    transport = CoordinatedTransport(coordinator, providers=PROVIDERS)
    message = (
        r"^CoordinatedTransport serves async clients .*; "
        r"a sync client needs .*\.CoordinatedSyncTransport$"
    )
    with pytest.raises(UsageError, match=message):
        httpx2.Client(transport=transport).__enter__()  # type: ignore[arg-type]
    http = httpx2.Client(transport=transport)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=message):
        http.post(f"{fake_provider_url}/v1/chat/completions", json={"model": "gpt-test"})
    with (
        openai.OpenAI(
            api_key="test", base_url=f"{fake_provider_url}/v1", max_retries=0, http_client=http
        ) as client,
        pytest.raises(UsageError, match=message),
    ):
        _chat(client)
    # anthropic wraps what its client raises; the cause says it.
    with anthropic.Anthropic(
        api_key="test",
        base_url=fake_provider_url,
        max_retries=0,
        http_client=httpx2.Client(transport=transport),  # type: ignore[arg-type]
    ) as other:
        with pytest.raises(anthropic.APIConnectionError) as caught:
            other.messages.create(
                model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert isinstance(caught.value.__cause__, UsageError)
    _idle(coordinator)


@pytest.mark.anyio
async def test_the_sync_transport_on_an_async_client_says_which_to_use(
    fake_provider_url: str,
) -> None:
    transport = _transport(create_agent_coordinator())
    message = (
        r"^CoordinatedSyncTransport serves sync clients .*; "
        r"an async client needs .*\.CoordinatedTransport$"
    )
    with pytest.raises(UsageError, match=message):
        await httpx2.AsyncClient(transport=transport).__aenter__()  # type: ignore[arg-type]
    http = httpx2.AsyncClient(transport=transport)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=message):
        await http.post(f"{fake_provider_url}/v1/chat/completions", json={"model": "m"})
    await http.aclose()


@pytest.mark.anyio
async def test_a_sync_call_inside_an_event_loop_is_refused(fake_provider_url: str) -> None:
    coordinator = create_agent_coordinator()
    http = httpx2.Client(transport=_transport(coordinator))
    with http, pytest.raises(UsageError, match="runs an event loop"):
        http.post(f"{fake_provider_url}/v1/chat/completions", json={"model": "gpt-test"})
    _idle(coordinator)


def test_unscheduled_requests_pass_through(fake_provider_url: str) -> None:
    coordinator = create_agent_coordinator(1)
    coordinator.close_tuple(T)
    with httpx2.Client(transport=_transport(coordinator)) as http:
        response = http.get(f"{fake_provider_url}/v1/models")
        assert response.status_code == 404  # the fake serves no listing; it got there
    _idle(coordinator)


def test_legacy_httpx_sync_clients_from_threads(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(2)
    transport = legacy.CoordinatedSyncTransport(
        coordinator, handler=ProviderLimitHandler(coordinator), providers=PROVIDERS
    )
    coordinator.set_budget(T, tokens_per_minute=100_000)
    fake_provider.pause("gpt-test")
    with (
        openai.OpenAI(
            api_key="test",
            base_url=f"{fake_provider_url}/v1",
            max_retries=0,
            http_client=httpx.Client(transport=transport),  # type: ignore[arg-type]
        ) as client,
        ThreadPoolExecutor(4) as pool,
    ):
        futures = [pool.submit(_chat, client, 3000) for _ in range(4)]
        assert fake_provider.wait_for_in_flight("gpt-test", 2, BOUND)
        wait_until(lambda: coordinator.queued_count == 2, BOUND)
        fake_provider.resume("gpt-test")
        assert [f.result(BOUND) for f in futures] == ["ok"] * 4
    assert fake_provider.peak_in_flight("gpt-test") == 2
    available = _entry(coordinator).tokens_available
    assert available is not None
    assert available > 100_000 - 200  # compressed answers, settled
    _idle(coordinator)


def test_many_threads_and_a_429_storm_lose_nothing(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(4)
    fake_provider.script("gpt-test", *[Refuse(headers={"retry-after-ms": "20"}) for _ in range(3)])
    lock = threading.Lock()
    done: list[str] = []

    def work(client: openai.OpenAI) -> None:
        for _ in range(5):
            answer = _chat(client)
            with lock:
                done.append(answer)

    with _openai(fake_provider_url, coordinator) as client, ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(work, client) for _ in range(8)]:
            future.result(BOUND)
    assert done == ["ok"] * 40
    assert fake_provider.peak_in_flight("gpt-test") <= 4
    _idle(coordinator)
