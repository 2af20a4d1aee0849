"""A Python child process that reports JSON lines: the replicas of tests and benchmarks.

Cross-replica properties (turns that never overlap, permits reclaimed from a killed
process, a paused holder's refused writes) need real processes, which the tests and the
benchmark start, signal and read through this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import IO, Any, final

import anyio

__all__ = ["Child", "running"]


@final
class Child:
    """``python ARGS...`` with stdin/stdout as pipes; one JSON object per stdout line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(cls, *args: str, stderr: int | IO[Any] | None = None) -> Child:
        """Start ``python ARGS...``; its stderr goes to ``stderr`` (default: ours)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self._process.pid

    async def read(self) -> Any:
        """The next reported object.

        Raises:
            EOFError: the child exited without reporting.
        """
        assert self._process.stdout is not None
        line = await self._process.stdout.readline()
        if not line:
            raise EOFError(f"child {self.pid} exited (code {await self._process.wait()})")
        return json.loads(line)

    def send(self, obj: Any) -> None:
        """Write one JSON line to the child's stdin."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(obj).encode() + b"\n")

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    async def wait(self) -> int:
        return await self._process.wait()

    async def kill(self) -> None:
        """SIGKILL (a stopped child dies too) and reap. Idempotent."""
        if self._process.returncode is None:
            self.signal(signal.SIGKILL)
        await self._process.wait()
        if self._process.stdin is not None:
            self._process.stdin.close()


@contextlib.asynccontextmanager
async def running(*argvs: Sequence[str]) -> AsyncIterator[list[Child]]:
    """Start one child per argument list; kill every one of them on the way out."""
    children: list[Child] = []
    try:
        for argv in argvs:
            children.append(await Child.start(*argv))
        yield children
    finally:
        with anyio.CancelScope(shield=True):
            for child in children:
                await child.kill()
