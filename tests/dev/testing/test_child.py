"""The JSON-lines child process used by the cross-process tests and the benchmark."""

from __future__ import annotations

import signal

import anyio
import pytest
from lovely_coordinator_dev.testing.child import Child, running

from ...redis.helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio

ECHO = "import json, sys\nprint(json.dumps({'hello': 1}))\nprint(sys.stdin.readline().strip())"


async def test_read_send_and_exit() -> None:
    with anyio.fail_after(10):
        child = await Child.start("-c", ECHO)
        assert await child.read() == {"hello": 1}
        child.send({"back": [1, 2]})
        assert await child.read() == {"back": [1, 2]}
        assert await child.wait() == 0
        with pytest.raises(EOFError, match="exited"):
            await child.read()
        await child.kill()  # fine after exit


async def test_kill_a_stopped_child() -> None:
    with anyio.fail_after(10):
        child = await Child.start("-c", "import time; time.sleep(60)")
        child.signal(signal.SIGSTOP)
        await child.kill()
        assert await child.wait() == -signal.SIGKILL


async def test_running_kills_every_child_on_the_way_out() -> None:
    with anyio.fail_after(10):
        sleeper = ("-c", "import time; time.sleep(60)")
        async with running(sleeper, sleeper) as children:
            assert len({child.pid for child in children}) == 2
        assert [await child.wait() for child in children] == [-signal.SIGKILL] * 2
