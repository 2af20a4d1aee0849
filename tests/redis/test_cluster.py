"""Every Redis primitive on a real 3-node Redis Cluster (redis.asyncio.RedisCluster).

The cluster is started by the tests themselves (``lovely_coordinator_dev.testing
.redis_cluster``): three primaries of the same server binary as the other Redis tests, each
serving a third of the slots. Objects are picked so that their keys live on different nodes.
"""

from __future__ import annotations

import logging
import string
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import pytest
import redis.asyncio
from lovely_coordinator_dev.testing.redis_cluster import ThrowawayCluster
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer
from redis.crc import key_slot

from lovely_coordinator import AgentCoordinator, ModelTuple, create_agent_coordinator
from lovely_coordinator._redis import generation
from lovely_coordinator._redis.cluster import slot_marker, slot_tag
from lovely_coordinator._redis.keys import FRESH_BOOT_KEY, object_base
from lovely_coordinator.redis import (
    FencedLog,
    RedisFleet,
    RedisGates,
    RedisLocker,
    RedisPermitPool,
    StaleFenceError,
)

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

GPT = ModelTuple("openai", "gpt-4o")
PRINTABLE = set(string.digits + string.ascii_letters + "-_")


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    with ThrowawayCluster() as started:
        yield started


@pytest.fixture
async def cluster_connect(
    cluster: ThrowawayCluster, anyio_backend: str
) -> AsyncIterator[Callable[[], Any]]:
    """Makes clients of the cluster (flushed and declared fresh first); closes them after."""
    cluster.flush()
    clients: list[Any] = []

    def connect() -> Any:
        client = redis.asyncio.RedisCluster(host=cluster.host, port=cluster.port)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        await client.aclose()


class Told(logging.Handler):
    """``with Told(logger, text, then):`` calls ``then()`` when ``logger`` logs a record
    whose message contains ``text`` (in the thread that logs it)."""

    def __init__(self, logger: logging.Logger, text: str, then: Callable[[], object]) -> None:
        super().__init__(logging.DEBUG)
        self._logger, self._text, self._then = logger, text, then

    def emit(self, record: logging.LogRecord) -> None:
        if self._text in record.getMessage():
            self._then()

    def __enter__(self) -> Told:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)


def one_per_node(cluster: ThrowawayCluster, key_of: Callable[[str], str]) -> list[str]:
    """Three names whose keys (``key_of(name)``) live on the three different nodes."""
    found: dict[int, str] = {}
    number = 0
    while len(found) < len(cluster.nodes):
        name = f"n{number}"
        found.setdefault(cluster.nodes.index(cluster.node_of(key_of(name))), name)
        number += 1
    return [found[i] for i in range(len(cluster.nodes))]


def conversation_key(name: str) -> str:
    return f"{object_base('lovely:', 'conv', name)}:lock"


def pool_key(name: str) -> str:
    return f"{object_base('lovely:', 'pool', name)}:holders"


async def test_a_lease_on_every_node_is_handed_over_by_its_release(
    cluster: ThrowawayCluster, cluster_connect: Callable[[], Any]
) -> None:
    with anyio.fail_after(15):
        first, second = RedisLocker(cluster_connect(), ttl=30), RedisLocker(cluster_connect())
        fences: list[int] = []

        async def wait_for_it(name: str, granted: anyio.Event) -> None:
            async with await second.acquire(name) as lease:
                fences.append(lease.fence)
                granted.set()

        for name in one_per_node(cluster, conversation_key):
            holder = await first.acquire(name)
            granted = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_it, name, granted)
                await anyio.wait_all_tasks_blocked()
                waiting = f"{object_base('lovely:', 'conv', name)}:waiting"
                while not await first._client.exists(waiting):  # noqa: ASYNC110
                    await anyio.sleep(0.005)  # (state in Redis: nothing to wait on locally)
                # The release is published classically; the cluster carries it to every
                # node, so the waiter wakes far below its 1 s re-check.
                with anyio.fail_after(0.5):
                    await holder.release()
                    await granted.wait()
            assert fences[-1] > holder.fence


async def test_a_lease_on_a_cluster_is_renewed_past_its_ttl(
    cluster_connect: Callable[[], Any],
) -> None:
    with anyio.fail_after(5):
        locker = RedisLocker(cluster_connect(), ttl=0.3)
        async with await locker.acquire("c") as lease:
            await anyio.sleep(0.8)  # renewed every 0.1 s
            assert not lease.lost.is_set()


async def test_pools_on_every_node_hold_their_limit_and_wake_by_sharded_pubsub(
    cluster: ThrowawayCluster, cluster_connect: Callable[[], Any]
) -> None:
    with anyio.fail_after(15):
        for name in one_per_node(cluster, pool_key):
            pools = [
                RedisPermitPool(cluster_connect(), name=name, limit=1, ttl=30) for _ in range(2)
            ]
            inside = peak = done = 0

            async def work(pool: RedisPermitPool) -> None:
                nonlocal inside, peak, done
                async with pool.permit():
                    inside += 1
                    peak = max(peak, inside)
                    await anyio.sleep(0.005)
                    inside -= 1
                done += 1

            # A release wakes the next waiter through the pool's sharded channel: with a
            # 30 s ttl the re-check alone (1 s) would take ten seconds for these ten.
            with anyio.fail_after(3):
                async with anyio.create_task_group() as tg:
                    for i in range(10):
                        tg.start_soon(work, pools[i % 2])
            assert (done, peak) == (10, 1)


async def test_a_pool_whose_slot_moves_to_another_node_still_wakes_its_waiter(
    cluster: ThrowawayCluster, cluster_connect: Callable[[], Any]
) -> None:
    with anyio.fail_after(20):
        name = one_per_node(cluster, pool_key)[0]
        channel = f"{object_base('lovely:', 'pool', name)}:released"
        holder_pool = RedisPermitPool(cluster_connect(), name=name, limit=1, ttl=30)
        waiter_pool = RedisPermitPool(cluster_connect(), name=name, limit=1, ttl=30)
        held = await holder_pool.acquire()
        granted = anyio.Event()

        async def wait_for_it() -> None:
            async with waiter_pool.permit():
                granted.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_it)
            queue = f"{object_base('lovely:', 'pool', name)}:queue"
            while not await held_client(holder_pool).zcard(queue):  # noqa: ASYNC110
                await anyio.sleep(0.005)  # (state in Redis: nothing to wait on locally)
            target = cluster.nodes[1]
            cluster.move_slot(pool_key(name), to=target)
            # The server ends the waiter's sharded subscription as the slot leaves; it
            # subscribes again where the slot went.
            plain = redis.asyncio.Redis(port=target.port)
            try:
                while await plain.pubsub_shardnumsub(channel) != [(channel.encode(), 1)]:  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # (another client's state: poll the server)
            finally:
                await plain.aclose()
            with anyio.fail_after(0.5):  # by the message, not the 1 s re-check
                await held.release()
                await granted.wait()


def held_client(pool: RedisPermitPool) -> Any:
    return pool._client


async def test_a_gate_closed_and_opened_through_sharded_pubsub(
    cluster: ThrowawayCluster, cluster_connect: Callable[[], Any]
) -> None:
    with anyio.fail_after(15):
        coordinators = [create_agent_coordinator(2) for _ in range(2)]
        a, b = (RedisGates(cluster_connect(), c, resync_interval=60) for c in coordinators)
        async with a, b:
            channel = f"{object_base('lovely:', 'gates')}:events"
            node = cluster.node_of(channel)
            plain = redis.asyncio.Redis(port=node.port)
            try:
                assert await plain.pubsub_shardnumsub(channel) == [(channel.encode(), 2)]
            finally:
                await plain.aclose()
            # Resyncs come once a minute: only a message can carry these in time.
            await a.close_tuple(GPT, reopen_after=30)
            await changed(coordinators[1], closed=True)
            await a.open_tuple(GPT)
            await changed(coordinators[1], closed=False)


async def changed(coordinator: AgentCoordinator, *, closed: bool) -> None:
    with anyio.fail_after(0.5):
        while coordinator.is_tuple_open(GPT) == closed:  # noqa: ASYNC110
            await anyio.sleep(0.005)  # (another replica's state: poll it)


async def test_fenced_logs_on_every_node(
    cluster: ThrowawayCluster, cluster_connect: Callable[[], Any]
) -> None:
    with anyio.fail_after(10):
        client = cluster_connect()

        def log_key(name: str) -> str:
            return f"{object_base('', 'log', name)}:entries"

        for name in one_per_node(cluster, log_key):
            log = FencedLog(client, name)
            assert await log.append(5, "a") == 0
            assert await log.entries(fence=7) == [(5, "a")]  # a fenced read: the mark is 7
            with pytest.raises(StaleFenceError):
                await log.append(6, "stale")
            await log.claim(9)
            with pytest.raises(StaleFenceError):
                await log.entries(fence=8)
            assert await log.high_water() == 9
            assert await log.entries() == [(5, "a")]


async def test_a_fleet_on_a_cluster_shares_its_limit_and_gates(
    cluster_connect: Callable[[], Any],
) -> None:
    inside = peak = done = 0
    with anyio.fail_after(20):
        coordinators = [create_agent_coordinator(8) for _ in range(2)]
        fleets = [RedisFleet(cluster_connect(), c, name="f", ttl=3) for c in coordinators]
        async with fleets[0] as a, fleets[1] as b:
            await a.set_tuple_limit(GPT, 1)
            while not b.governs(GPT):
                await b.statistics()

            async def call(coordinator: AgentCoordinator) -> None:
                nonlocal inside, peak, done
                async with coordinator.request(GPT, tokens=10):
                    inside += 1
                    peak = max(peak, inside)
                    await anyio.sleep(0.005)
                    inside -= 1
                done += 1

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(call, coordinators[i % 2])
            assert (done, peak) == (8, 1)
            await a.close_tuple(GPT, 60)
            await b.statistics()
            entered = anyio.Event()

            async def parked() -> None:
                async with coordinators[1].request(GPT):
                    entered.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(parked)
                await anyio.wait_all_tasks_blocked()
                assert not entered.is_set()
                # The opening reaches b on the fleet's sharded channel, well before its
                # waiter's re-check (ttl / 3 = 1 s).
                with anyio.fail_after(0.5):
                    await a.open_tuple(GPT)
                    await entered.wait()


async def test_the_generation_marker_is_one_per_slot(
    cluster: ThrowawayCluster, cluster_connect: Callable[[], Any]
) -> None:
    with anyio.fail_after(15):
        vouched = cluster_connect()
        used, fresh, flushed = one_per_node(cluster, conversation_key)
        async with await RedisLocker(vouched, ttl=0.5).acquire(used):
            pass  # the slot of `used` has a marker of this boot now
        async with await RedisLocker(vouched, ttl=0.5).acquire(flushed):
            pass
        await vouched.delete(FRESH_BOOT_KEY)  # from now on, nobody vouches for a boot
        client = cluster_connect()
        locker = RedisLocker(client, ttl=0.5)
        markers = {
            name: slot_marker(generation.MARKER_KEY, client, object_base("lovely:", "conv", name))
            for name in (used, fresh, flushed)
        }
        for name, marker in markers.items():
            assert key_slot(marker.encode()) == key_slot(conversation_key(name).encode())
        cluster.flush_node(cluster.node_of(conversation_key(flushed)))
        await client.ping()  # the client learns the cluster's layout first (not timed)
        # A slot whose state is this boot's: granted at once, well inside the quiet
        # period (ttl + a tick, 1.5 s) that the two below wait.
        with anyio.fail_after(1.0):
            async with await locker.acquire(used):
                pass
        for name in (fresh, flushed):  # a slot never seen, and a slot that lost its state
            started = anyio.current_time()
            async with await locker.acquire(name):
                pass
            assert anyio.current_time() - started >= 0.5 + 1.0 - 0.05  # ttl + a tick


async def test_min_replicas_waits_for_the_replicas_of_the_keys_node(
    cluster: ThrowawayCluster, cluster_connect: Callable[[], Any], caplog: pytest.LogCaptureFixture
) -> None:
    # These primaries have no replicas: a grant that needs one is never confirmed (WAIT,
    # pinned to the node of the conversation's slot, answers 0) and is given back.
    caplog.set_level(logging.WARNING, logger="lovely_coordinator.redis")
    unconfirmed = "only 0 of the 1 replicas required acknowledged it"
    with anyio.fail_after(10):
        client = cluster_connect()
        locker = RedisLocker(client, ttl=0.6, min_replicas=1)
        granted = False
        told = anyio.Event()

        async def acquire() -> None:
            nonlocal granted
            await locker.acquire("c")
            granted = True

        # Until the first grant was given back (WAIT times out after 0.2 s, ttl / 3),
        # however long a loaded machine takes to get there.
        with Told(logging.getLogger("lovely_coordinator.redis"), unconfirmed, told.set):
            async with anyio.create_task_group() as tg:
                tg.start_soon(acquire)
                await told.wait()
                tg.cancel_scope.cancel()
        assert not granted
        assert unconfirmed in caplog.text
        assert await client.exists(conversation_key("c")) == 0  # given back
        async with await RedisLocker(client, ttl=0.6).acquire("c"):
            pass


def test_every_slot_has_a_tag() -> None:
    for slot in range(16384):
        tag = slot_tag(slot)
        assert key_slot(f"{{{tag}}}".encode()) == slot
        assert len(tag) == 3
        assert set(tag) <= PRINTABLE  # no braces: a tag of its own


def test_the_cluster_server_names_its_nodes(cluster: ThrowawayCluster) -> None:
    assert all(isinstance(node, ThrowawayServer) and node.cluster for node in cluster.nodes)
    assert {cluster.nodes.index(cluster.node_of(f"{{{i}}}")) for i in range(30)} == {0, 1, 2}
