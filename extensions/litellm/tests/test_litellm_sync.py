"""install() and litellm's sync calls (``completion`` from threads), against the fake provider.

Threads are plain OS threads; each join and wait is bounded. What is in flight is read from
the provider (which holds requests on ``pause``) and from the coordinator's statistics.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import litellm
import pytest
from lovely_coordinator_dev.testing.waits import wait_until
from lovely_coordinator_limits import Backoff, ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Quota, Refuse
from lovely_coordinator_litellm import Installation, install

from lovely_coordinator import ModelTuple, create_agent_coordinator

pytestmark = [
    # litellm's own TypedDicts, read by pydantic when litellm imports its modules lazily.
    pytest.mark.filterwarnings(r"ignore:Items? .* on TypedDict class .*ReadOnly:UserWarning"),
]

PROVIDERS = {"127.0.0.1": "local"}
GPT = ModelTuple("local", "gpt-test")
CLAUDE = ModelTuple("local", "claude-test")
BOUND = 20.0


@pytest.fixture
def installed() -> Iterator[Installation]:
    coordinator = create_agent_coordinator(max_concurrency=3)
    backoff = Backoff(base=0.05, factor=2.0, max_delay=1.0, jitter=0.0)
    handler = ProviderLimitHandler(coordinator, backoff=backoff)
    with install(coordinator, handler=handler, providers=PROVIDERS) as installation:
        yield installation


def _ask(url: str, model: str) -> Any:
    base = f"{url}/v1" if model.startswith("openai/") else url
    reply = litellm.completion(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        api_base=base,
        api_key="test",
        max_retries=0,
        max_tokens=20,
    )
    return reply.choices[0].message.content


def test_threads_of_completion_stay_within_the_cap(
    installed: Installation, fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = installed.coordinator
    fake_provider.pause("gpt-test")
    fake_provider.pause("claude-test")
    models = ["openai/gpt-test", "anthropic/claude-test"] * 6
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(_ask, fake_provider_url, model) for model in models]
        assert fake_provider.wait_for_in_flight(None, 3, BOUND)
        wait_until(lambda: coordinator.queued_count == 9, BOUND)
        assert fake_provider.in_flight() == 3
        fake_provider.resume("gpt-test")
        fake_provider.resume("claude-test")
        assert [f.result(BOUND) for f in futures] == ["ok"] * 12
    assert fake_provider.peak_in_flight() == 3
    assert coordinator.statistics().active == 0


def test_a_sync_429_is_parked_and_retried_and_budgets_learned(
    installed: Installation, fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    quota = Quota(requests_per_minute=600, tokens_per_minute=60_000)
    for model in ("gpt-test", "claude-test"):
        fake_provider.limit(model, quota)
        fake_provider.script(model, Refuse(headers={"retry-after-ms": "20"}))
    assert _ask(fake_provider_url, "openai/gpt-test") == "ok"
    assert _ask(fake_provider_url, "anthropic/claude-test") == "ok"
    assert [s.status for s in fake_provider.seen("gpt-test")] == [429, 200]
    assert [s.status for s in fake_provider.seen("claude-test")] == [429, 200]
    tuples = {t.tuple: t for t in installed.coordinator.statistics().tuples}
    for model_tuple in (GPT, CLAUDE):
        assert tuples[model_tuple].requests_available is not None
        assert tuples[model_tuple].active == 0


def test_uninstall_puts_the_sync_hooks_back() -> None:
    coordinator = create_agent_coordinator()
    before = (litellm.client_session, getattr(litellm, "sync_transport", None))
    with install(coordinator):
        assert litellm.client_session is not None
        assert getattr(litellm, "sync_transport", None) is not None
    assert (litellm.client_session, getattr(litellm, "sync_transport", None)) == before
