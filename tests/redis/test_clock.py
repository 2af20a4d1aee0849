"""A server clock that steps forward, on a real server (``faketime``, Debian's package).

Redis expires keys and the gates' closures by its wall clock: a forward step ends them
early. What must not shorten: the quiet period after a loss of state (counted in capped
ticks, see generation.py) and a gate closure that a live replica knows (it re-asserts the
time it knows is left). These servers are the embedded Valkey (Debian's Redis does not
start under faketime); without faketime the tests skip, except under ``CI=true``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer, embedded_executable

from lovely_coordinator import ModelTuple, create_agent_coordinator
from lovely_coordinator._redis import scripts
from lovely_coordinator.redis import RedisGates

from .helpers import anyio_backend, lock_keys, require_faketime

__all__ = ["anyio_backend"]  # a fixture

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SLOW = ModelTuple("openai", "gpt-4o")


@pytest.fixture
def stepping_server() -> Iterator[ThrowawayServer]:
    """A private server whose clock the test may step (it starts on time)."""
    require_faketime()
    with ThrowawayServer(embedded_executable(), clock_offset=0.0) as server:
        yield server


async def test_a_forward_step_does_not_end_the_quiet_period(
    stepping_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(20):
        stepping_server.restart()  # not vouched for: a quiet period
        client = redis_connect(stepping_server.url)
        acquire = client.register_script(scripts.LOCK_ACQUIRE)
        keys = lock_keys("c")
        args = ["aa", 5000, 10**7, "", 5000]
        keys_list = [keys["lock"], keys["fence"], keys["waiting"], keys["marker"]]
        keys_list += [f"{keys['lock']}:x", keys["beats"], keys["ticket"]]
        tag, wait, _ = await acquire(keys_list, args)
        assert tag == scripts.QUIET
        stepping_server.set_clock_offset(60)  # the server's clock jumps a minute ahead
        tag, after, _ = await acquire(keys_list, args)
        assert tag == scripts.QUIET
        assert after >= wait - 1000 - 500  # a tick at most (and the time this took)


async def test_a_forward_step_does_not_shorten_a_closure_a_replica_knows(
    stepping_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(20):
        a_coordinator, b_coordinator = create_agent_coordinator(1), create_agent_coordinator(1)
        a = RedisGates(redis_connect(stepping_server.url), a_coordinator, resync_interval=60)
        b = RedisGates(redis_connect(stepping_server.url), b_coordinator, resync_interval=60)
        async with a, b:
            await a.close_tuple(SLOW, reopen_after=120)
            while b_coordinator.is_tuple_open(SLOW):  # noqa: ASYNC110  (over the network)
                await anyio.sleep(0.005)
            # The server's clock jumps past the closure: Redis drops it.
            stepping_server.set_clock_offset(130)
            client = redis_connect(stepping_server.url)
            # b resyncs (as it does periodically): it must not take the closure as opened.
            await b._resync()
            assert not b_coordinator.is_tuple_open(SLOW)
            reopens_at = b_coordinator.tuple_reopens_at(SLOW)
            assert reopens_at is not None
            assert reopens_at - anyio.current_time() > 115
            # ...and Redis has it again, with what was left, for replicas that start later.
            closed = await client.zrange("lovely:{gates}:closed", 0, -1, withscores=True)
            seconds, _ = await client.time()
            [(_, reopen_ms)] = closed
            assert reopen_ms / 1000 - int(seconds) > 114
            late_coordinator = create_agent_coordinator(1)
            async with RedisGates(client, late_coordinator):
                late_reopens = late_coordinator.tuple_reopens_at(SLOW)
                assert late_reopens is not None
                assert late_reopens - anyio.current_time() > 114
