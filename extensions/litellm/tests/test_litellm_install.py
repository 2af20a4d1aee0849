"""install() with the real litellm against the local fake provider: openai/ and anthropic/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import litellm
import pytest
from anyio.lowlevel import checkpoint
from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler
from lovely_coordinator_dev.testing.waits import until_statistics
from lovely_coordinator_limits import Backoff, ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Quota, Refuse
from lovely_coordinator_litellm import Installation, install

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    ModelTuple,
    UsageError,
    create_agent_coordinator,
)

pytestmark = [
    pytest.mark.anyio,
    # litellm's own TypedDicts, read by pydantic when litellm imports its modules lazily.
    pytest.mark.filterwarnings(r"ignore:Items? .* on TypedDict class .*ReadOnly:UserWarning"),
]

PROVIDERS = {"127.0.0.1": "local"}
GPT = ModelTuple("local", "gpt-test")
CLAUDE = ModelTuple("local", "claude-test")


@pytest.fixture
def coordinator() -> AgentCoordinator:
    return create_agent_coordinator(max_concurrency=3)


@pytest.fixture
async def installed(coordinator: AgentCoordinator) -> AsyncIterator[Installation]:
    # Short closures after a 429, so the retried requests are quick.
    backoff = Backoff(base=0.05, factor=2.0, max_delay=1.0, jitter=0.0)
    handler = ProviderLimitHandler(coordinator, backoff=backoff)
    async with install(coordinator, handler=handler, providers=PROVIDERS) as installation:
        yield installation


async def _ask(url: str, model: str, **options: Any) -> Any:
    base = f"{url}/v1" if model.startswith("openai/") else url
    return await litellm.acompletion(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        api_base=base,
        api_key="test",
        max_retries=0,
        max_tokens=20,
        **options,
    )


async def test_the_cap_holds_at_the_provider_under_fan_out(
    installed: Installation, fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = installed.coordinator
    with anyio.fail_after(30):
        fake_provider.pause("gpt-test")
        fake_provider.pause("claude-test")
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(_ask, fake_provider_url, "openai/gpt-test")
                tg.start_soon(_ask, fake_provider_url, "anthropic/claude-test")
            await until_statistics(coordinator, lambda s: s.active == 3 and s.queued == 9)
            await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, None, 3)
            assert fake_provider.in_flight() == 3
            fake_provider.resume("gpt-test")
            fake_provider.resume("claude-test")
        assert fake_provider.peak_in_flight() == 3
        assert (
            sorted(s.model for s in fake_provider.seen()) == ["claude-test"] * 6 + ["gpt-test"] * 6
        )
        assert coordinator.statistics().active == 0


async def test_a_429_is_parked_and_retried_out_of_sight(
    installed: Installation, fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(20):
        fake_provider.script("gpt-test", Refuse(headers={"retry-after-ms": "20"}))
        fake_provider.script("claude-test", Refuse(headers={"retry-after-ms": "20"}))
        gpt = await _ask(fake_provider_url, "openai/gpt-test")
        claude = await _ask(fake_provider_url, "anthropic/claude-test")
        assert gpt.choices[0].message.content == claude.choices[0].message.content == "ok"
        assert [s.status for s in fake_provider.seen("gpt-test")] == [429, 200]
        assert [s.status for s in fake_provider.seen("claude-test")] == [429, 200]


async def test_budgets_are_learned_from_both_providers_headers(
    installed: Installation, fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(20):
        quota = Quota(requests_per_minute=600, tokens_per_minute=60_000)
        fake_provider.limit("gpt-test", quota)
        fake_provider.limit("claude-test", quota)
        await _ask(fake_provider_url, "openai/gpt-test")
        await _ask(fake_provider_url, "anthropic/claude-test")
        tuples = {t.tuple: t for t in installed.coordinator.statistics().tuples}
        for model in (GPT, CLAUDE):
            assert tuples[model].requests_available is not None
            assert tuples[model].tokens_available is not None


async def test_streams_hold_their_slot_until_read_and_settle(
    installed: Installation, fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    with anyio.fail_after(20):
        fake_provider.reply = "a streamed answer"
        for model in ("openai/gpt-test", "anthropic/claude-test"):
            stream = await _ask(fake_provider_url, model, stream=True)
            pieces = [chunk.choices[0].delta.content or "" async for chunk in stream]
            assert "".join(pieces) == "a streamed answer"
            await checkpoint()
        assert installed.coordinator.statistics().active == 0
        assert [s.stream for s in fake_provider.seen()] == [True, True]


async def test_a_call_under_the_only_permit_runs_on_it(
    installed: Installation, fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    coordinator = installed.coordinator
    coordinator.set_max_concurrency(1)
    with anyio.fail_after(20):
        async with coordinator.permit(GPT):
            reply = await _ask(fake_provider_url, "anthropic/claude-test")
        assert reply.choices[0].message.content == "ok"


def test_uninstall_puts_litellm_back_and_one_installation_at_a_time(
    coordinator: AgentCoordinator,
) -> None:
    original = AsyncHTTPHandler.__dict__["create_async_transport"]
    installation = install(coordinator)
    assert installation.active
    assert installation.handler is ProviderLimitHandler.for_coordinator(coordinator)
    assert AsyncHTTPHandler.__dict__["create_async_transport"] is not original
    with pytest.raises(UsageError, match=r"^lovely-coordinator is already installed in litellm"):
        install(coordinator)
    installation.uninstall()
    installation.uninstall()
    assert [installation.active] == [False]
    assert AsyncHTTPHandler.__dict__["create_async_transport"] is original
    with pytest.raises(InvalidArgumentError, match=r"^max_attempts must be a positive integer$"):
        install(coordinator, max_attempts=0)
    assert AsyncHTTPHandler.__dict__["create_async_transport"] is original
