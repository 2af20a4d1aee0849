"""FencedLog against a real throwaway server (asyncio-only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
import redis.exceptions
from lovely_coordinator_dev.testing.faults import proxy_to
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer

from lovely_coordinator import CoordinatorError, InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator._redis import scripts
from lovely_coordinator.redis import FencedLog, StaleFenceError

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio


async def test_empty_log(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        assert await log.entries() == []
        assert await log.high_water() == 0


async def test_append_returns_indexes_and_raises_the_bar(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        assert await log.append(3, "a") == 0
        assert await log.append(3, "b") == 1  # equal fences: the holder writes many times
        assert await log.append(5, "c:with:colons") == 2
        assert await log.high_water() == 5
        assert await log.entries() == [(3, "a"), (3, "b"), (5, "c:with:colons")]


async def test_stale_fence_is_refused_and_changes_nothing(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        await log.append(7, "new holder")
        stale = r"^fence 6 is stale: the store already accepted fence 7$"
        with pytest.raises(StaleFenceError, match=stale) as info:
            await log.append(6, "old holder")
        assert isinstance(info.value, CoordinatorError)
        assert (info.value.fence, info.value.high_water) == (6, 7)
        assert await log.entries() == [(7, "new holder")]
        assert await log.high_water() == 7


async def test_fence_zero_is_unfenced(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        assert await log.append(0, "x") == 0
        assert await log.high_water() == 0
        await log.append(9, "y")
        assert await log.append(0, "z") == 2  # accepted, and never lowers the bar
        assert await log.high_water() == 9
        with pytest.raises(StaleFenceError):
            await log.append(8, "w")


async def test_fences_beyond_double_precision_compare_exactly(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        big = 2**63 + 1
        await log.append(big, "a")
        with pytest.raises(StaleFenceError):
            await log.append(big - 1, "b")
        assert await log.high_water() == big


async def test_logs_are_independent(redis_client: Any) -> None:
    with anyio.fail_after(5):
        await FencedLog(redis_client, "one").append(10, "a")
        assert await FencedLog(redis_client, "two").append(1, "b") == 0


@pytest.mark.parametrize(("fence", "entry"), [(-1, "a"), (True, "a"), (1.0, "a"), (1, b"a")])
async def test_bad_arguments(redis_client: Any, fence: Any, entry: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        with pytest.raises(InvalidArgumentError):
            await log.append(fence, entry)
        assert await log.entries() == []


def test_bad_key(redis_client: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^key must be a nonempty string$"):
        FencedLog(redis_client, "")
    with pytest.raises(InvalidArgumentError, match=r"^key must be a string the client can"):
        FencedLog(redis_client, "\udfff")


async def test_an_entry_the_client_cannot_encode_is_refused(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        with pytest.raises(InvalidArgumentError, match=r"^entry must be a string the client"):
            await log.append(1, "\ud800")
        assert await log.entries() == []
        assert await log.high_water() == 0


@pytest.mark.parametrize("client", [None, "redis://127.0.0.1:6379", object()])
def test_a_client_that_is_not_an_asyncio_redis_client_is_refused(client: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"^client must be a redis.asyncio.Redis"):
        FencedLog(client, "log")


async def test_works_with_a_decoding_client(
    redis_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(5):
        client = redis_connect(redis_server.url, decode_responses=True)
        log = FencedLog(client, "decoded")
        await log.append(2, "ünïcode")
        assert await log.entries() == [(2, "ünïcode")]
        assert await log.high_water() == 2


async def test_a_resent_append_answers_as_the_first_did(redis_client: Any) -> None:
    with anyio.fail_after(5):
        # What redis-py does when a reply is lost: the same call again, on a new connection.
        append = redis_client.register_script(scripts.FENCED_APPEND)
        keys = ["{log:log}:entries", "{log:log}:high-water", "{log:log}:receipt:once"]
        assert await append(keys, ["5", "a", 60_000]) == [1, 0]
        log = FencedLog(redis_client, "log")
        await log.append(7, "newer holder")
        # Resent after a newer holder wrote: neither a second copy nor a false refusal.
        assert await append(keys, ["5", "a", 60_000]) == [1, 0]
        assert await log.entries() == [(5, "a"), (7, "newer holder")]
        assert 0 < await redis_client.pttl(keys[2]) <= 60_000  # the receipt lapses


class Index:
    """An integer that is not an int (numpy.int64-like): accepted wherever an int is."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


async def test_a_fenced_read_returns_the_entries_and_raises_the_mark(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        await log.append(3, "a")
        assert await log.entries(fence=5) == [(3, "a")]
        assert await log.high_water() == 5  # raised before anything was written
        with pytest.raises(StaleFenceError, match=r"^fence 4 is stale: .* accepted fence 5$"):
            await log.append(4, "from an older holder")
        # Equal: allowed; and any integer will do at run time, as everywhere.
        assert await log.entries(fence=Index(5)) == [(3, "a")]  # type: ignore[arg-type]
        await log.append(5, "b")
        assert await log.entries() == [(3, "a"), (5, "b")]


async def test_a_stale_fenced_read_is_refused_and_changes_nothing(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        await log.append(9, "a")
        with pytest.raises(StaleFenceError) as info:
            await log.entries(fence=8)
        assert (info.value.fence, info.value.high_water) == (8, 9)
        with pytest.raises(StaleFenceError):
            await log.claim(8)
        assert await log.high_water() == 9
        assert await log.entries() == [(9, "a")]


async def test_claim_fences_off_older_holders_without_reading(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        await log.claim(7)
        assert await log.high_water() == 7
        with pytest.raises(StaleFenceError):
            await log.append(6, "late write of the previous holder")
        assert await log.entries() == []
        await log.claim(0)  # unfenced: never lowers or moves the mark
        assert await log.entries(fence=0) == []
        assert await log.high_water() == 7


async def test_read_modify_write_under_fences_loses_no_update(redis_client: Any) -> None:
    with anyio.fail_after(5):
        # The lost update of issue 12, in one process: the old holder read, the new
        # holder read under a higher fence, then the old holder wrote.
        log = FencedLog(redis_client, "counter")
        old_view = await log.entries(fence=10)
        new_view = await log.entries(fence=11)
        with pytest.raises(StaleFenceError):
            await log.append(10, str(len(old_view) + 1))
        await log.append(11, str(len(new_view) + 1))
        assert await log.entries() == [(11, "1")]


@pytest.mark.parametrize("fence", [-1, True, 1.0, "1", None])
async def test_bad_fences_for_reads_and_claims(redis_client: Any, fence: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        with pytest.raises(InvalidArgumentError, match=r"^fence must be a nonnegative integer$"):
            await log.claim(fence)
        if fence is not None:  # None is the unfenced read
            with pytest.raises(InvalidArgumentError):
                await log.entries(fence=fence)
        assert await log.high_water() == 0


async def test_braces_in_log_keys_never_make_two_logs_meet(redis_client: Any) -> None:
    with anyio.fail_after(5):
        await FencedLog(redis_client, "{a}").append(5, "x")
        await FencedLog(redis_client, "a").append(1, "y")  # another log, its own mark
        await FencedLog(redis_client, "%7Ba%7D").append(1, "z")
        assert await FencedLog(redis_client, "{a}").entries() == [(5, "x")]


async def test_a_fenced_read_loads_its_script_on_a_server_that_lost_it(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        await log.append(3, "a")
        await redis_client.script_flush()  # as a restarted server would be
        assert await log.entries(fence=4) == [(3, "a")]
        assert await log.high_water() == 4


async def test_a_fenced_read_with_a_decoding_client(
    redis_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_connect(redis_server.url, decode_responses=True), "decoded")
        await log.append(2, "ünï:code")
        assert await log.entries(fence=2) == [(2, "ünï:code")]
        with pytest.raises(StaleFenceError, match=r"accepted fence 2$"):
            await log.entries(fence=1)


async def test_an_error_reply_leaves_the_connection_usable(redis_client: Any) -> None:
    with anyio.fail_after(5):
        log = FencedLog(redis_client, "log")
        await redis_client.rpush("{log:log}:high-water", "not a string")  # a wrong type
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await log.entries(fence=1)
        await redis_client.delete("{log:log}:high-water")
        # The reply of the read that followed the failed claim was consumed: the next
        # command on that connection gets its own reply, not a stale one.
        assert await log.entries(fence=1) == []
        assert await redis_client.ping()


async def test_a_cancelled_fenced_read_gives_its_connection_back(
    redis_server: ThrowawayServer, redis_connect: Callable[..., Any]
) -> None:
    with anyio.fail_after(10):
        async with proxy_to(redis_server.port) as proxy:
            client = redis_connect(proxy.url)
            log = FencedLog(client, "log")
            await log.entries(fence=1)
            proxy.delay(0.5)
            with anyio.move_on_after(0.1):
                await log.entries(fence=2)  # cancelled while its replies are on the way
            proxy.heal()
            pool = client.connection_pool
            assert not pool._in_use_connections  # nothing leaked
            assert await log.entries(fence=2) == []  # and nothing out of step
