"""RedisGates: two replicas (separate clients and coordinators) on a real server."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio
import redis.exceptions
from lovely_coordinator_dev.testing.faults import proxy_to
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from lovely_coordinator import (
    AgentCoordinator,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ModelTuple,
    create_agent_coordinator,
)
from lovely_coordinator._base.errors import UsageError
from lovely_coordinator.redis import RedisGates

from .helpers import RECONNECTING, anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

SLOW = ModelTuple("openai", "gpt-x")
OTHER = ModelTuple("anthropic", "claude-y")


class Replica:
    def __init__(self, client: Any, **options: Any) -> None:
        self.client = client
        self.coordinator = create_agent_coordinator(2)
        self.gates = RedisGates(self.client, self.coordinator, **options)


@pytest.fixture
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


async def test_open_tuple_opens_everywhere(replicas: list[Replica]) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        await a.gates.close_tuple(SLOW, reopen_after=30)
        await closed_within(b.coordinator, SLOW, 0.5)
        await b.gates.open_tuple(SLOW)
        assert b.coordinator.is_tuple_open(SLOW)
        while not a.coordinator.is_tuple_open(SLOW):  # noqa: ASYNC110
            await anyio.sleep(0.005)


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


async def test_unreachable_redis_at_start_fails_the_entry_and_leaves_nothing_running(
    redis_connect: Callable[..., Any],
) -> None:
    with ThrowawayServer() as server, anyio.fail_after(20):
        server.kill()
        # No client-side retries: the refusal is reported at once.
        a = Replica(redis_connect(server.url, retry=Retry(NoBackoff(), 0)))
        # The tasks that are not the gates' (the test's own and the test runner's).
        before = asyncio.all_tasks()
        with pytest.raises(redis.exceptions.ConnectionError):
            await a.gates.__aenter__()
        while asyncio.all_tasks() - before:  # noqa: ASYNC110  (the listener retires)
            await anyio.sleep(0.01)
        server.start()
        async with a.gates:  # and entering works once the server is back
            await a.gates.close_tuple(SLOW, reopen_after=30)
            assert not a.coordinator.is_tuple_open(SLOW)


@pytest.mark.parametrize("reopen_after", [-1, math.nan, math.inf, 1e306, 10**400, True, "5"])
async def test_bad_reopen_after_changes_nothing(
    replicas: list[Replica], redis_client: Any, reopen_after: Any
) -> None:
    a, _ = replicas
    with anyio.fail_after(5):
        message = r"^reopen_after must be a number of seconds from 0 to 1e9$"
        with pytest.raises(InvalidArgumentError, match=message):
            await a.gates.close_tuple(SLOW, reopen_after=reopen_after)
        assert a.coordinator.is_tuple_open(SLOW)  # not even the local gate
        assert await redis_client.zcard("lovely:{gates}:closed") == 0


async def test_a_tuple_or_prefix_the_client_cannot_encode_changes_nothing(
    replicas: list[Replica], redis_client: Any
) -> None:
    a, _ = replicas
    bad = ModelTuple("openai", "gpt\ud800")  # a lone surrogate: no UTF-8 for it
    with anyio.fail_after(5):
        message = r"^the model tuple must be strings the client can encode as utf-8$"
        with pytest.raises(InvalidArgumentError, match=message):
            await a.gates.close_tuple(bad, reopen_after=5)
        assert a.coordinator.is_tuple_open(bad)  # not even the local gate
        with pytest.raises(InvalidArgumentError, match=message):
            await a.gates.open_tuple(bad)
        assert await redis_client.zcard("lovely:{gates}:closed") == 0
    with pytest.raises(InvalidArgumentError, match=r"^prefix must be a string the client"):
        RedisGates(redis_client, a.coordinator, prefix="\ud800")


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


async def test_entering_twice_is_refused(replicas: list[Replica]) -> None:
    with anyio.fail_after(5), pytest.raises(UsageError, match="already entered"):
        await replicas[0].gates.__aenter__()


@pytest.mark.parametrize("interval", [0, -1, math.inf, math.nan, 1e16])
def test_bad_resync_interval(redis_client: Any, interval: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^resync_interval must be a positive number"):
        RedisGates(redis_client, create_agent_coordinator(), resync_interval=interval)


@pytest.mark.parametrize("coordinator", [None, "coordinator", object()])
def test_a_coordinator_that_is_not_an_agent_coordinator_is_refused(
    redis_client: Any, coordinator: Any
) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"^coordinator must be an AgentCoordinator"):
        RedisGates(redis_client, coordinator)


@pytest.mark.parametrize("client", [None, "redis://127.0.0.1:6379", redis.Redis()])
def test_a_client_that_is_not_an_asyncio_redis_client_is_refused(client: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"^client must be a redis.asyncio.Redis"):
        RedisGates(client, create_agent_coordinator())


def test_gates_can_be_made_outside_an_event_loop() -> None:
    # At import time, say; the background work starts when entered.
    RedisGates(redis.asyncio.Redis.from_url("redis://127.0.0.1:1"), create_agent_coordinator())


async def test_a_restart_without_persistence_never_shortens_a_closure(
    redis_connect: Callable[..., Any],
) -> None:
    with ThrowawayServer() as server, anyio.fail_after(30):
        a = Replica(redis_connect(server.url, **RECONNECTING), resync_interval=60)
        b = Replica(redis_connect(server.url, **RECONNECTING), resync_interval=60)
        async with a.gates, b.gates:
            await a.gates.close_tuple(SLOW, reopen_after=20)
            await closed_within(b.coordinator, SLOW, 0.5)
            reopens = [r.coordinator.tuple_reopens_at(SLOW) for r in (a, b)]
            server.restart()  # every closure forgotten by the server
            restarted_at = anyio.current_time()
            # The replicas notice (their subscriptions broke), resync, find the gate set
            # gone, and put back what they know: a replica started now sees the closure.
            late = Replica(redis_connect(server.url, **RECONNECTING))
            while True:
                async with late.gates:
                    if not late.coordinator.is_tuple_open(SLOW):
                        break
                await anyio.sleep(0.05)
            assert anyio.current_time() - restarted_at < 5  # the reconnect bound
            for replica, before in zip((a, b), reopens, strict=True):
                after = replica.coordinator.tuple_reopens_at(SLOW)
                assert after is not None
                assert before is not None
                assert after >= before - 0.01  # never shortened, on any replica
            reopens_at = late.coordinator.tuple_reopens_at(SLOW)
            assert reopens_at is not None
            assert reopens_at - anyio.current_time() > 15


# Both backends, overriding the module's asyncio-only fixture: the refusal under trio.
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_under_trio_the_error_says_asyncio_only(anyio_backend: str) -> None:
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1")
    if anyio_backend == "asyncio":
        return
    with pytest.raises(UsageError, match=r"asyncio-only .* cannot be used under trio"):
        RedisGates(client, create_agent_coordinator())


async def hold_state_reads(
    replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> tuple[anyio.Event, anyio.Event]:
    """Make ``replica``'s next state reads stop after the reply until ``proceed`` is set."""
    read, proceed = anyio.Event(), anyio.Event()
    real = replica.gates._state

    async def held() -> tuple[str, int, dict[ModelTuple, float]]:
        state = await real()
        read.set()
        await proceed.wait()
        return state

    monkeypatch.setattr(replica.gates, "_state", held)
    return read, proceed


async def test_a_closure_that_arrives_while_a_resync_reads_the_state_is_kept(
    replicas: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        read, proceed = await hold_state_reads(b, monkeypatch)
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.gates._resync)
            await read.wait()  # the state (without the closure) is read, not yet applied
            await a.gates.close_tuple(SLOW, reopen_after=30)
            await closed_within(b.coordinator, SLOW, 0.5)
            proceed.set()
        assert not b.coordinator.is_tuple_open(SLOW)  # the stale read reopened nothing


async def test_an_opening_that_arrives_while_a_resync_reads_the_state_is_kept(
    replicas: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = replicas
    with anyio.fail_after(10):
        await a.gates.close_tuple(SLOW, reopen_after=30)
        await closed_within(b.coordinator, SLOW, 0.5)
        read, proceed = await hold_state_reads(b, monkeypatch)
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.gates._resync)
            await read.wait()  # the state (with the closure) is read, not yet applied
            await a.gates.open_tuple(SLOW)
            while not b.coordinator.is_tuple_open(SLOW):  # noqa: ASYNC110
                await anyio.sleep(0.005)
            proceed.set()
        assert b.coordinator.is_tuple_open(SLOW)  # the stale read closed nothing again


async def test_a_cancelled_close_is_still_shared_at_the_next_resync(
    redis_server: ThrowawayServer, redis_client: Any, redis_connect: Callable[..., Any]
) -> None:
    async with proxy_to(redis_server.port) as proxy:
        a = Replica(redis_connect(proxy.url), resync_interval=60)
        with anyio.fail_after(10):
            async with a.gates:
                proxy.drop()  # the close's request never reaches the server
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(a.gates.close_tuple, SLOW, 30)
                        await anyio.wait_all_tasks_blocked()
                        scope.cancel()
                assert not a.coordinator.is_tuple_open(SLOW)  # closed locally at once
                proxy.heal()
                await a.gates._resync()
                assert await redis_client.zscore("lovely:{gates}:closed", "openai\x00gpt-x")
