"""The legacy transport, with the real openai SDK on an ``httpx`` (0.x) client."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import openai
import pytest
from lovely_coordinator_httpx.legacy import CoordinatedTransport
from lovely_coordinator_limits import ProviderLimitHandler
from lovely_coordinator_limits.testing import FakeProvider, Refuse, openai_sse_on_trio

from lovely_coordinator import AgentCoordinator, ModelTuple, create_agent_coordinator

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def _openai(url: str, coordinator: AgentCoordinator) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = CoordinatedTransport(
        coordinator,
        handler=ProviderLimitHandler(coordinator),
        providers={"127.0.0.1": "local"},
        max_attempts=1,  # one limit's effect on the gate; retries: test_httpx_gate
    )
    async with openai.AsyncOpenAI(
        api_key="test",
        base_url=f"{url}/v1",
        max_retries=0,
        # Accepted at run time; the SDK's annotation names only httpx2's client.
        http_client=httpx.AsyncClient(transport=transport),  # type: ignore[arg-type]
    ) as client:
        yield client


@openai_sse_on_trio
async def test_a_legacy_stream_holds_the_permit_until_closed(
    provider: FakeProvider, url: str
) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        async with _openai(url, coordinator) as client:
            stream = await client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            pieces: list[str] = []
            async with stream:
                async for chunk in stream:
                    assert coordinator.active_count == 1
                    pieces.append(chunk.choices[0].delta.content or "")
            assert "".join(pieces) == "ok"
            assert coordinator.active_count == 0
        del stream, chunk
        gc.collect()


async def test_a_legacy_429_closes_the_tuple(provider: FakeProvider, url: str) -> None:
    with anyio.fail_after(10):
        coordinator = create_agent_coordinator(2)
        provider.script("gpt-test", Refuse(headers={"retry-after-ms": "30000"}))
        async with _openai(url, coordinator) as client:
            before = anyio.current_time()
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "hi"}]
                )
        reopens_at = coordinator.tuple_reopens_at(ModelTuple("local", "gpt-test"))
        assert reopens_at is not None
        assert before + 30 <= reopens_at <= anyio.current_time() + 30
        assert coordinator.active_count == 0
