"""RedisFleet against a real throwaway server: members of one process, each with its own
coordinator and client (the cross-process tests are in test_fleet_processes.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    TupleSuspendedError,
    UsageError,
    create_agent_coordinator,
)
from lovely_coordinator.redis import FleetStatistics, RedisFleet

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # fixture

pytestmark = pytest.mark.anyio

GPT = ModelTuple("openai", "gpt-4o")
CLAUDE = ModelTuple("anthropic", "claude")


@asynccontextmanager
async def members(
    server: ThrowawayServer, connect: Callable[..., Any], count: int, **options: Any
) -> AsyncIterator[list[tuple[AgentCoordinator, RedisFleet]]]:
    """``count`` members of fleet "f", each with its own coordinator (limit 16) and client."""
    async with AsyncExitStack() as stack:
        found = []
        for _ in range(count):
            coordinator = create_agent_coordinator(16)
            fleet = RedisFleet(connect(server.url), coordinator, name="f", ttl=3, **options)
            found.append((coordinator, await stack.enter_async_context(fleet)))
        yield found


async def test_settings_and_statistics(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with members(redis_server, redis_connect, 2) as [(_, a), (_, b)]:
            await a.set_budget(GPT, requests_per_minute=600, tokens_per_minute=60_000)
            await a.set_tuple_limit(("openai", "gpt-4o"), 4)
            await a.close_tuple(CLAUDE, 30)
            stats = await b.statistics()
            assert isinstance(stats, FleetStatistics)
            assert stats.members == 2
            assert stats.available
            by_tuple = {row.tuple: row for row in stats.tuples}
            gpt, claude = by_tuple[GPT], by_tuple[CLAUDE]
            assert (gpt.limit, gpt.requests_per_minute, gpt.tokens_per_minute) == (4, 600, 60_000)
            assert gpt.requests_available == pytest.approx(600, abs=1)
            assert gpt.open
            assert gpt.in_flight == 0
            assert gpt.queued == 0
            assert not claude.open
            assert claude.reopens_at is not None
            assert b.governs(GPT)
            assert b.governs(CLAUDE)
            await b.open_tuple(CLAUDE)
            await a.set_budget(GPT)
            await a.set_tuple_limit(GPT, None)
            stats = await a.statistics()
            assert stats.tuples == ()
            assert not a.governs(GPT)
            assert not a.governs(CLAUDE)


async def test_limit_is_shared_by_every_member(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    inside = peak = done = 0
    with anyio.fail_after(20):
        async with members(redis_server, redis_connect, 3) as fleet:
            await fleet[0][1].set_tuple_limit(GPT, 2)
            for _, member in fleet:
                while not member.governs(GPT):
                    await member.statistics()

            async def call(coordinator: AgentCoordinator) -> None:
                nonlocal inside, peak, done
                async with coordinator.request(GPT, tokens=10):
                    inside += 1
                    peak = max(peak, inside)
                    await anyio.sleep(0.01)
                    inside -= 1
                done += 1

            async with anyio.create_task_group() as tg:
                for coordinator, _ in fleet:
                    for _ in range(6):
                        tg.start_soon(call, coordinator)
            stats = await fleet[1][1].statistics()
    assert done == 18
    assert peak == 2
    assert stats.tuples[0].in_flight == 0


async def test_budget_is_shared_and_settle_refunds(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(20):
        async with members(redis_server, redis_connect, 2) as [(ca, a), (cb, b)]:
            await a.set_budget(GPT, requests_per_minute=2, tokens_per_minute=100)
            await b.statistics()
            async with ca.request(GPT, tokens=90) as call:
                call.settle(40)  # 50 tokens back
            async with cb.request(GPT, tokens=50):
                pass
            stats = await a.statistics()
            row = stats.tuples[0]
            assert row.requests_available == pytest.approx(0, abs=0.01)
            assert row.tokens_available == pytest.approx(10, abs=1)
            # The bucket holds no request now: a third one waits (a request per 30 s).
            with anyio.move_on_after(0.3) as scope:
                async with cb.request(GPT):
                    pass
            assert scope.cancelled_caught
            stats = await a.statistics()
            assert stats.tuples[0].queued == 0  # the cancelled waiter left the line


async def test_closed_gate_parks_or_rejects(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(20):
        async with members(redis_server, redis_connect, 2) as [(_, a), (cb, b)]:
            await a.close_tuple(GPT, 60)
            await b.statistics()
            with pytest.raises(TupleSuspendedError):
                async with cb.request(GPT, reject_on_closed_tuple=True):
                    pass
            entered = anyio.Event()

            async def call() -> None:
                async with cb.request(GPT):
                    entered.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.sleep(0.2)
                assert not entered.is_set()
                await a.open_tuple(GPT)
                await entered.wait()


async def test_ungoverned_tuples_and_no_fleet_are_untouched(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with members(redis_server, redis_connect, 1) as [(coordinator, fleet)]:
            await fleet.set_tuple_limit(GPT, 1)
            async with coordinator.request(CLAUDE, tokens=5) as call:
                call.settle(3)
            async with coordinator.request(GPT, tokens=5) as call:
                call.settle(3)
                assert (await fleet.statistics()).tuples[0].in_flight == 1
        # Left: the coordinator admits on its own again.
        async with coordinator.request(GPT):
            pass


async def test_a_waiting_request_lends_its_permit(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with members(redis_server, redis_connect, 1) as [(coordinator, fleet)]:
            coordinator.set_max_concurrency(1)
            await fleet.close_tuple(GPT, 60)
            entered = anyio.Event()

            async def agent() -> None:
                async with coordinator.permit(GPT), coordinator.request(GPT):
                    entered.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(agent)
                while (await fleet.statistics()).tuples[0].queued < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.005)  # (the line is in Redis)
                # The agent's only slot serves another model meanwhile.
                async with coordinator.permit(CLAUDE):
                    assert coordinator.statistics().lent == 1
                await fleet.open_tuple(GPT)
                await entered.wait()


async def test_bad_input_and_misuse(redis_client: Any) -> None:
    coordinator = create_agent_coordinator()
    with pytest.raises(InvalidArgumentTypeError):
        RedisFleet("redis://", coordinator, name="f")
    with pytest.raises(InvalidArgumentTypeError):
        RedisFleet(redis_client, object(), name="f")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        RedisFleet(redis_client, coordinator, name="")
    with pytest.raises(InvalidArgumentError):
        RedisFleet(redis_client, coordinator, name="f", ttl=0)
    with pytest.raises(InvalidArgumentError):
        RedisFleet(redis_client, coordinator, name="f", on_unavailable="drop")  # type: ignore[arg-type]
    fleet = RedisFleet(redis_client, coordinator, name="f")
    with pytest.raises(UsageError):
        await fleet.set_tuple_limit(GPT, 2)
    async with fleet:
        with pytest.raises(UsageError):
            await fleet.__aenter__()
        with pytest.raises(UsageError):
            async with RedisFleet(redis_client, coordinator, name="g"):
                pass
        with pytest.raises(InvalidArgumentError, match="Budget must be"):
            await fleet.set_budget(GPT, requests_per_minute=0)
        with pytest.raises(InvalidArgumentError):
            await fleet.set_tuple_limit(GPT, 0)
        with pytest.raises(InvalidArgumentError):
            await fleet.close_tuple(GPT, -1)
        with pytest.raises(InvalidArgumentError):
            await fleet.set_budget(("", "x"), requests_per_minute=1)
        assert (await fleet.statistics()).tuples == ()


def test_trio_is_refused(redis_client: Any) -> None:
    async def main() -> None:
        with pytest.raises(UsageError, match="asyncio-only"):
            RedisFleet(redis_client, create_agent_coordinator(), name="f")

    import trio

    trio.run(main)


async def test_learn_budget_teaches_the_fleet(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    async def settled(fleet: RedisFleet, **expected: float | None) -> Any:
        while True:
            rows = (await fleet.statistics()).tuples
            if rows and all(getattr(rows[0], k) == v for k, v in expected.items()):
                return rows[0]
            await anyio.sleep(0.01)  # (sent in the background)

    with anyio.fail_after(10):
        async with members(redis_server, redis_connect, 2) as [(ca, a), (cb, b)]:
            ca.learn_budget(GPT, requests_per_minute=600, tokens_per_minute=1000)
            await a.statistics()  # waits for what a learned, then b sees it too
            await settled(b, tokens_per_minute=1000)
            cb.learn_budget(GPT, tokens_remaining=100)
            row = await settled(a, requests_per_minute=600, tokens_per_minute=1000)
            assert row.tokens_available is not None
            assert row.tokens_available < 150  # lowered to what the provider said remains
            assert ca.tuple_statistics(GPT) is None  # the local budget is left alone
            # An explicit budget is kept; a remaining amount still lowers it.
            await a.set_budget(GPT, tokens_per_minute=5000)
            await anyio.to_thread.run_sync(lambda: cb.learn_budget(GPT, tokens_per_minute=10))
            row = await settled(b, tokens_per_minute=5000, requests_per_minute=None)
            cb.learn_budget(GPT, tokens_per_minute=20, tokens_remaining=7)
            ca.learn_budget(GPT, tokens_remaining=9)
            row = await settled(b, tokens_per_minute=5000)
            while row.tokens_available is None or row.tokens_available > 100:
                row = await settled(b, tokens_per_minute=5000)


async def test_the_endpoint_and_top_show_the_fleet(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    import json

    import httpx
    from rich.console import Console

    from lovely_coordinator._cli.top import render

    with anyio.fail_after(10):
        async with members(redis_server, redis_connect, 1) as [(coordinator, fleet)]:
            await fleet.set_tuple_limit(GPT, 3)
            await fleet.set_budget(GPT, requests_per_minute=600)
            await fleet.close_tuple(CLAUDE, 60)
            async with (
                coordinator.serve_statistics() as (host, port),
                httpx.AsyncClient(base_url=f"http://{host}:{port}") as http,
                coordinator.request(GPT),
            ):
                while True:
                    document = json.loads((await http.get("/statistics")).content)
                    rows = {tuple(r["tuple"]): r for r in document["fleet"]["tuples"]}
                    if GPT in rows and rows[GPT]["in_flight"] == 1:
                        break
                    await anyio.sleep(0.05)  # (refreshed in the background, at most 1/s)
            assert document["fleet"]["name"] == "f"
            assert document["fleet"]["members"] == 1
            assert rows[GPT]["limit"] == 3
            assert rows[CLAUDE]["open"] is False
            assert 0 < rows[CLAUDE]["reopens_in"] <= 60
            console = Console(width=120, record=True, force_terminal=False)
            console.print(render(document, "http://x"))
            screen = console.export_text()
            assert "fleet f · 1 members" in screen
            assert "openai/gpt-4o" in screen
            assert "closed · reopens in" in screen
            document["fleet"]["available"] = False
            document["fleet"]["tuples"] = []
            console.print(render(document, "http://x"))
            screen = console.export_text()
            assert "Redis unreachable" in screen
            assert "governs no tuple" in screen


async def test_a_learned_remaining_amount_takes_off_what_was_admitted_since(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with members(redis_server, redis_connect, 1) as [(coordinator, fleet)]:
            await fleet.set_budget(GPT, tokens_per_minute=60_000)  # 1,000 a second
            async with coordinator.request(GPT, tokens=100) as answered:
                pass
            async with coordinator.request(GPT, tokens=300):
                pass
            # The provider said 1,000 remained when the first call reached it; the second
            # (300) was admitted after that, so at most about 700 remain now.
            fleet.learn(GPT, None, 60_000, None, 1_000, answering=answered)
            while True:
                row = (await fleet.statistics()).tuples[0]
                assert row.tokens_available is not None
                if row.tokens_available < 5_000:
                    break
                await anyio.sleep(0.01)  # (sent in the background)
            assert 600 < row.tokens_available < 900


async def test_the_httpx_transport_is_admitted_by_the_fleet_and_teaches_it(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    import httpx2
    import openai
    from lovely_coordinator_httpx import CoordinatedTransport
    from lovely_coordinator_limits.testing import FakeProvider, Quota, serve

    provider = FakeProvider(reply=None, latency=0.05)
    provider.limit("m", Quota(requests_per_minute=600, tokens_per_minute=100_000))
    t = ModelTuple("fake", "m")
    with serve(provider) as url, anyio.fail_after(20):
        async with members(redis_server, redis_connect, 1) as [(coordinator, fleet)]:
            await fleet.set_tuple_limit(t, 2)
            transport = CoordinatedTransport(coordinator, providers={"127.0.0.1": "fake"})
            client = openai.AsyncOpenAI(
                api_key="-",
                base_url=f"{url}/v1",
                http_client=httpx2.AsyncClient(transport=transport),
                max_retries=0,
            )
            async with client, anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(
                        lambda: client.chat.completions.create(
                            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5
                        )
                    )
            row = (await fleet.statistics()).tuples[0]
    assert len(provider.seen("m")) == 6
    assert row.in_flight == 0
    # The provider's headers set the fleet's budget (none was set), at its own figures.
    assert (row.requests_per_minute, row.tokens_per_minute) == (600, 100_000)
    assert row.requests_available is not None
    assert row.requests_available < 600


async def test_listeners_stale_settings_and_other_loops(
    redis_server: ThrowawayServer,
    redis_client: Any,
    redis_connect: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    from lovely_coordinator._redis.fleet_state import Setting

    seen: list[tuple[ModelTuple, str]] = []

    def listener(t: ModelTuple, waited: float, outcome: str) -> None:
        seen.append((t, outcome))
        raise RuntimeError("a listener that fails")

    with anyio.fail_after(10):
        async with members(redis_server, redis_connect, 1) as [(coordinator, fleet)]:
            remove = fleet.add_listener(listener)
            with pytest.raises(InvalidArgumentTypeError):
                fleet.add_listener(3)  # type: ignore[arg-type]
            await fleet.set_tuple_limit(GPT, 1)
            async with coordinator.request(GPT):
                pass
            assert seen == [(GPT, "granted")]
            assert "an admission listener failed" in caplog.text
            remove()
            remove()  # idempotent
            # A setting this member still believes in, which the fleet no longer has: the
            # request is admitted locally, and the member forgets the setting.
            fleet._member.known.put(CLAUDE, Setting(limit=1))
            async with coordinator.request(CLAUDE):
                pass
            assert not fleet.governs(CLAUDE)
            assert len(seen) == 1

            # Another event loop (another thread) cannot be admitted by this fleet.
            async def elsewhere() -> None:
                async with coordinator.request(GPT):
                    pass

            with pytest.raises(UsageError, match="event loop it was entered on"):
                await anyio.to_thread.run_sync(asyncio.run, elsewhere())
            assert fleet.latest_statistics().name == "f"


async def test_request_sync_from_a_thread_is_admitted_by_the_fleet(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    from lovely_coordinator import AdmissionTimeoutError

    done: list[int] = []

    def blocking(coordinator: AgentCoordinator, timeout: float | None) -> None:
        with coordinator.request_sync(GPT, tokens=10, timeout=timeout) as call:
            call.settle(5)
            done.append(call.tokens)

    with anyio.fail_after(20):
        async with members(redis_server, redis_connect, 1) as [(coordinator, fleet)]:
            await fleet.set_tuple_limit(GPT, 1)
            async with anyio.create_task_group() as tg, coordinator.request(GPT):
                with pytest.raises(AdmissionTimeoutError):
                    await anyio.to_thread.run_sync(blocking, coordinator, 0.2)
                assert (await fleet.statistics()).tuples[0].queued == 0  # place given up
                tg.start_soon(anyio.to_thread.run_sync, blocking, coordinator, None)
                while (await fleet.statistics()).tuples[0].queued < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # (the line is in Redis)
                assert not done
                # Leaving the request gives the unit back: the thread is admitted.
            assert done == [5]
            row = (await fleet.statistics()).tuples[0]
            assert (row.in_flight, row.queued) == (0, 0)
