"""Sync LangChain calls (``invoke`` from threads) through coordinate() and the rate limiter.

Threads are plain OS threads; each join and wait is bounded. What is in flight is read from
the provider (which holds requests on ``pause``) and from the coordinator's statistics.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from lovely_coordinator_dev.testing.waits import wait_until
from lovely_coordinator_langchain import CoordinatedRateLimiter, coordinate
from lovely_coordinator_limits import Backoff, ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Quota, Refuse

from lovely_coordinator import ModelTuple, create_agent_coordinator

PROVIDERS = {"127.0.0.1": "local"}
GPT = ModelTuple("local", "gpt-test")
BOUND = 20.0


def _gpt(url: str, **options: object) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-test", base_url=f"{url}/v1", api_key="test", **options)  # type: ignore[arg-type]


def _claude(url: str) -> ChatAnthropic:
    return ChatAnthropic(model="claude-test", base_url=url, api_key="test")  # type: ignore[call-arg, arg-type]


def _answer(model: BaseChatModel) -> object:
    return model.invoke("hello").content


def test_threads_of_invoke_stay_within_the_cap(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=3)
    fake_provider.pause("gpt-test")
    fake_provider.pause("claude-test")
    with (
        coordinate(_gpt(fake_provider_url), coordinator, providers=PROVIDERS) as gpt,
        coordinate(_claude(fake_provider_url), coordinator, providers=PROVIDERS) as claude,
        ThreadPoolExecutor(12) as pool,
    ):
        futures = [pool.submit(_answer, model) for model in [gpt, claude] * 6]
        assert fake_provider.wait_for_in_flight(None, 3, BOUND)
        wait_until(lambda: coordinator.queued_count == 9, BOUND)
        assert fake_provider.in_flight() == 3
        fake_provider.resume("gpt-test")
        fake_provider.resume("claude-test")
        assert [f.result(BOUND) for f in futures] == ["ok"] * 12
    assert fake_provider.peak_in_flight() == 3
    assert coordinator.statistics().active == 0


def test_a_sync_429_is_parked_and_retried_and_budgets_learned(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator(max_concurrency=2)
    backoff = Backoff(base=0.05, factor=2.0, max_delay=1.0, jitter=0.0)
    handler = ProviderLimitHandler(coordinator, backoff=backoff)
    fake_provider.limit("gpt-test", Quota(requests_per_minute=600, tokens_per_minute=60_000))
    fake_provider.script("gpt-test", Refuse(headers={"retry-after-ms": "20"}))
    with coordinate(
        _gpt(fake_provider_url), coordinator, handler=handler, providers=PROVIDERS
    ) as model:
        assert _answer(model) == "ok"
        assert "".join(str(c.content) for c in model.stream("hello")) == "ok"
    assert [s.status for s in fake_provider.seen()] == [429, 200, 200]
    entry = coordinator.tuple_statistics(GPT)
    assert entry is not None
    assert entry.requests_available is not None
    assert entry.active == 0


def test_the_sync_rate_limiter_draws_from_the_budget(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = create_agent_coordinator()
    coordinator.set_budget(GPT, requests_per_minute=2)
    limiter = CoordinatedRateLimiter(GPT, coordinator)
    model = _gpt(fake_provider_url, rate_limiter=limiter)
    assert [_answer(model) for _ in range(2)] == ["ok", "ok"]
    assert not limiter.acquire(blocking=False)  # the budget is spent for 30 s
    coordinator.set_budget(GPT, requests_per_minute=None)
    assert limiter.acquire(blocking=False)
    assert limiter.acquire()
    assert len(fake_provider.seen()) == 2
