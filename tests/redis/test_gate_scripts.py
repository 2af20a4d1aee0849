"""The gates' scripts, driven directly on a real server."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from lovely_coordinator._redis import gate_scripts
from lovely_coordinator._redis.generation import MARKER_KEY

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

KEYS = ["g:{gates}:closed", "g:{gates}:epoch", MARKER_KEY]


async def test_gate_close_keeps_the_later_reopen_time(redis_client: Any) -> None:
    with anyio.fail_after(5):
        close = redis_client.register_script(gate_scripts.GATE_CLOSE)
        state = redis_client.register_script(gate_scripts.GATE_STATE)
        assert await close(KEYS[:1], ["m", 5000, "events"]) == 5000
        remaining = await close(KEYS[:1], ["m", 100, "events"])
        assert 4900 < remaining <= 5000
        _, _, member, left = await state(KEYS, [])
        assert member == b"m"
        assert 4900 < int(left) <= 5000


async def test_gate_state_drops_closures_that_ran_out(redis_client: Any) -> None:
    with anyio.fail_after(5):
        close = redis_client.register_script(gate_scripts.GATE_CLOSE)
        state = redis_client.register_script(gate_scripts.GATE_STATE)
        await close(KEYS[:1], ["m", 20, "events"])
        await anyio.sleep(0.05)
        assert len(await state(KEYS, [])) == 2  # the epoch and the time only
        assert await redis_client.zcard(KEYS[0]) == 0


async def test_the_epoch_is_made_once_and_remade_only_after_a_loss(redis_client: Any) -> None:
    with anyio.fail_after(5):
        state = redis_client.register_script(gate_scripts.GATE_STATE)
        first, _ = await state(KEYS, [])
        again, _ = await state(KEYS, [])
        assert first == again
        await redis_client.delete(*KEYS[:2])  # the gate set lost...
        after, _ = await state(KEYS, [])
        assert after != first
        await redis_client.hset(KEYS[2], "run", "another boot")  # ...or maybe lost
        later, _ = await state(KEYS, [])
        assert later != after
