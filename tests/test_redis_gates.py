"""RedisGates: two replicas (separate clients and coordinators) on a real server."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import pytest_asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    ModelTuple,
    create_agent_coordinator,
)
from lovely_coordinator._redis.server import ThrowawayServer
from lovely_coordinator.redis import RedisGates

SLOW = ModelTuple("openai", "gpt-x")
OTHER = ModelTuple("anthropic", "claude-y")


class Replica:
    def __init__(self, client: Any, **options: Any) -> None:
        self.client = client
        self.coordinator = create_agent_coordinator(2)
        self.gates = RedisGates(self.client, self.coordinator, **options)


@pytest_asyncio.fixture
async def replicas(
    redis_client: Any, redis_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> AsyncIterator[list[Replica]]:
    pair = [Replica(redis_connect(redis_server.url), resync_interval=60) for _ in range(2)]
    async with pair[0].gates, pair[1].gates:
        yield pair


async def closed_within(coordinator: AgentCoordinator, t: ModelTuple, seconds: float) -> None:
    # The other replica's state arrives over the network: poll its coordinator.
    with anyio.fail_after(seconds):
        while coordinator.is_tuple_open(t):  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def resync_after_killing_pubsub(replica: Replica, redis_client: Any) -> None:
    """Drop every pub/sub connection and return once ``replica`` has resynced."""
    resyncs = replica.gates.resyncs
    await redis_client.client_kill_filter(_type="pubsub")
    while replica.gates.resyncs == resyncs:  # noqa: ASYNC110  (a counter, not an event)
        await anyio.sleep(0.01)


@pytest.mark.asyncio
async def test_close_on_one_replica_parks_that_tuple_on_the_other(replicas: list[Replica]) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        await a.gates.close_tuple(SLOW, reopen_after=1.5)
        assert not a.coordinator.is_tuple_open(SLOW)  # local before returning
        await closed_within(b.coordinator, SLOW, 0.5)
        granted: list[ModelTuple] = []

        async def work(t: ModelTuple) -> None:
            async with b.coordinator.permit(t):
                granted.append(t)

        async with anyio.create_task_group() as tg:
            tg.start_soon(work, SLOW)
            tg.start_soon(work, OTHER)
            await anyio.wait_all_tasks_blocked()
            assert granted == [OTHER]  # the closed tuple parks, the other flows
            assert b.coordinator.queued_count == 1
        assert granted == [OTHER, SLOW]  # reopened by itself on b
        assert a.coordinator.is_tuple_open(SLOW)
        assert b.coordinator.is_tuple_open(SLOW)


@pytest.mark.asyncio
async def test_both_replicas_reopen_at_the_same_time(replicas: list[Replica]) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        await a.gates.close_tuple(SLOW, reopen_after=5)
        await closed_within(b.coordinator, SLOW, 0.5)
        at_a, at_b = a.coordinator.tuple_reopens_at(SLOW), b.coordinator.tuple_reopens_at(SLOW)
        assert at_a is not None
        assert at_b is not None
        # One process: one clock; off by the delivery delay only.
        assert abs(at_a - at_b) < 0.2


@pytest.mark.asyncio
async def test_no_replica_shortens_a_closure(replicas: list[Replica]) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        await a.gates.close_tuple(SLOW, reopen_after=5)
        await closed_within(b.coordinator, SLOW, 0.5)
        await b.gates.close_tuple(SLOW, reopen_after=0.1)
        await anyio.sleep(0.3)
        for replica in replicas:
            reopens_at = replica.coordinator.tuple_reopens_at(SLOW)
            assert reopens_at is not None
            assert reopens_at - anyio.current_time() > 4


@pytest.mark.asyncio
async def test_open_tuple_opens_everywhere(replicas: list[Replica]) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        await a.gates.close_tuple(SLOW, reopen_after=30)
        await closed_within(b.coordinator, SLOW, 0.5)
        await b.gates.open_tuple(SLOW)
        assert b.coordinator.is_tuple_open(SLOW)
        while not a.coordinator.is_tuple_open(SLOW):  # noqa: ASYNC110
            await anyio.sleep(0.005)


@pytest.mark.asyncio
async def test_a_new_replica_starts_with_the_current_closures(
    replicas: list[Replica], redis_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        await replicas[0].gates.close_tuple(SLOW, reopen_after=30)
        # Replies as str: parsed alike.
        late = Replica(redis_connect(redis_server.url, decode_responses=True))
        async with late.gates:
            assert not late.coordinator.is_tuple_open(SLOW)  # resynced inside __aenter__
            reopens_at = late.coordinator.tuple_reopens_at(SLOW)
            assert reopens_at is not None
            assert 29 < reopens_at - anyio.current_time() <= 30


@pytest.mark.asyncio
async def test_killed_pubsub_connection_resyncs(replicas: list[Replica], redis_client: Any) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        # A closure that reached Redis but whose message b never saw (written directly,
        # with no PUBLISH): only a resync can reveal it, and the periodic one is 60 s away.
        now_ms = int((await redis_client.time())[0]) * 1000
        await redis_client.zadd("lovely:{gates}:closed", {"openai\x00gpt-x": now_ms + 30_000})
        assert b.coordinator.is_tuple_open(SLOW)
        assert await redis_client.client_kill_filter(_type="pubsub") >= 2
        await closed_within(b.coordinator, SLOW, 5)
        await closed_within(a.coordinator, SLOW, 5)


@pytest.mark.asyncio
async def test_resync_reopens_a_closure_opened_while_disconnected(
    replicas: list[Replica], redis_client: Any
) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        await a.gates.close_tuple(SLOW, reopen_after=30)
        await closed_within(b.coordinator, SLOW, 0.5)
        await redis_client.zrem("lovely:{gates}:closed", "openai\x00gpt-x")  # no message
        await resync_after_killing_pubsub(b, redis_client)
        assert b.coordinator.is_tuple_open(SLOW)


@pytest.mark.asyncio
async def test_resync_keeps_a_longer_local_closure(
    replicas: list[Replica], redis_client: Any
) -> None:
    _, b = replicas
    with anyio.fail_after(10):
        await b.gates.close_tuple(SLOW, reopen_after=1)
        b.coordinator.close_tuple(SLOW, reopen_after=30)  # this replica's own, local decision
        await redis_client.zrem("lovely:{gates}:closed", "openai\x00gpt-x")
        await resync_after_killing_pubsub(b, redis_client)
        assert not b.coordinator.is_tuple_open(SLOW)


@pytest.mark.asyncio
async def test_unreachable_redis_still_gates_locally_and_shares_later(
    redis_connect: Callable[..., Any],
) -> None:
    with ThrowawayServer() as server, anyio.fail_after(20):
        a = Replica(redis_connect(server.url), resync_interval=0.2)
        b = Replica(redis_connect(server.url))
        async with a.gates, b.gates:
            server.kill()
            await a.gates.close_tuple(SLOW, reopen_after=30)  # no error
            assert not a.coordinator.is_tuple_open(SLOW)
            server.start()
            # a pushes its closure at its next resync; b learns it from the message or
            # from its own resync after resubscribing.
            await closed_within(b.coordinator, SLOW, 5)


@pytest.mark.asyncio
async def test_unreachable_redis_at_start_fails_the_entry_and_leaves_nothing_running(
    redis_connect: Callable[..., Any],
) -> None:
    with ThrowawayServer() as server, anyio.fail_after(20):
        server.kill()
        # No client-side retries: the refusal is reported at once.
        a = Replica(redis_connect(server.url, retry=Retry(NoBackoff(), 0)))
        with pytest.raises(redis.exceptions.ConnectionError):
            await a.gates.__aenter__()
        while len(asyncio.all_tasks()) > 1:  # noqa: ASYNC110  (the listener retires)
            await anyio.sleep(0.01)
        server.start()
        async with a.gates:  # and entering works once the server is back
            await a.gates.close_tuple(SLOW, reopen_after=30)
            assert not a.coordinator.is_tuple_open(SLOW)


@pytest.mark.asyncio
async def test_bad_reopen_after_changes_nothing(replicas: list[Replica], redis_client: Any) -> None:
    a, _ = replicas
    with anyio.fail_after(5):
        with pytest.raises(InvalidArgumentError):
            await a.gates.close_tuple(SLOW, reopen_after=-1)
        assert a.coordinator.is_tuple_open(SLOW)
        assert await redis_client.zcard("lovely:{gates}:closed") == 0


@pytest.mark.asyncio
async def test_malformed_state_and_messages_are_ignored(
    replicas: list[Replica], redis_client: Any
) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        now_ms = int((await redis_client.time())[0]) * 1000
        await redis_client.zadd("lovely:{gates}:closed", {"no-separator": now_ms + 30_000})
        await redis_client.publish("lovely:{gates}:events", "c 1000 no-separator")
        await redis_client.publish("lovely:{gates}:events", "gibberish")
        await a.gates.close_tuple(SLOW, reopen_after=5)  # still heard after the bad ones
        await closed_within(b.coordinator, SLOW, 0.5)
        await resync_after_killing_pubsub(b, redis_client)
        assert not b.coordinator.is_tuple_open(SLOW)


@pytest.mark.asyncio
async def test_entering_twice_is_refused(replicas: list[Replica]) -> None:
    with anyio.fail_after(5), pytest.raises(RuntimeError, match="already entered"):
        await replicas[0].gates.__aenter__()


@pytest.mark.parametrize("interval", [0, -1, math.inf, math.nan])
def test_bad_resync_interval(interval: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^resync_interval must be a positive number"):
        RedisGates(object(), create_agent_coordinator(), resync_interval=interval)
