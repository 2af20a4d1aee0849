"""Benchmark section ``turns``: what a submit costs, and turns per second over 1k conversations.

* ``submit, idle conversation``: the turn starts now, so this includes spawning the
  turn's task (not running it). Shown against spawning a bare task with anyio's
  ``start_soon`` (target: at most 2x).
* ``submit, busy conversation``: the turn queues behind a running one; pure bookkeeping.
  Target: at most half the cost of the idle submit.
* ``1k conversations x 20 turns``: 20k trivial turns (one checkpoint each) submitted up
  front over 1k conversations, timed until ``wait()`` returns; on asyncio and trio. The
  target compares the time with the floor: one bare task per conversation running its 20
  bodies back to back, each in a cancel scope as an interruptible turn must be (at most
  2x). The registry does the same while a turn's task holds the very context values the
  next turn's submitter had; ``turns that set a contextvar`` forces the other path, a task
  per turn spawned in its submitter's context, and compares it with its own floor: per
  conversation, a chain of bare tasks, each running one body in a cancel scope and
  spawning the next (at most 1.5x). The same run with an in-memory locker that grants at
  once shows the cost of a lease per turn (a task group holding the lease watcher, and
  the shielded release).
"""

from __future__ import annotations

import contextvars
import gc
import time
from collections.abc import Awaitable, Callable
from functools import partial

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from lovely_coordinator.turns import Job, Lease, TurnRegistry

from . import Figure

__all__ = ["run"]

_CONVERSATIONS = 1_000


async def _turn(fence: int) -> None:
    await anyio.lowlevel.checkpoint()


_request: contextvars.ContextVar[int] = contextvars.ContextVar("request", default=0)


async def _setting_turn(fence: int) -> None:
    _request.set(fence)  # the turn's task can no longer take the next turn
    await anyio.lowlevel.checkpoint()


async def _park(release: anyio.Event, fence: int = 0) -> None:
    await release.wait()


def _submitter(
    turns: TurnRegistry, keys: list[str], run: Callable[[int], Awaitable[object]]
) -> Callable[[int], object]:
    return lambda i: turns.submit(keys[i], Job(run))


def _spawner(task_group: TaskGroup, release: anyio.Event) -> Callable[[int], object]:
    return lambda i: task_group.start_soon(_park, release)


def _per_call_us(call: Callable[[int], object], n: int) -> float:
    # Like timeit, with the collector off: a collection triggered by the objects a spawn
    # allocates would otherwise dominate, and vary between runs.
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for i in range(n):
            call(i)
        return (time.perf_counter() - start) / n * 1e6
    finally:
        gc.enable()


async def _submit_costs(quick: bool) -> list[Figure]:
    n = 10_000 if quick else 50_000
    idle = busy = spawn = float("inf")
    keys = [f"conv-{i}" for i in range(n)]
    for _ in range(5):  # best of five, interleaved: spawning a task is noisy
        release = anyio.Event()
        async with TurnRegistry(max_queued=n) as turns:
            parked = partial(_park, release)
            idle = min(idle, _per_call_us(_submitter(turns, keys, parked), n))
            busy = min(busy, _per_call_us(_submitter(turns, keys[:1] * n, _turn), n))
            release.set()
        release = anyio.Event()
        async with anyio.create_task_group() as tg:
            spawn = min(spawn, _per_call_us(_spawner(tg, release), n))
            release.set()
    return [
        Figure("submit, idle conversation", idle, "us", note="starts the turn's task"),
        Figure("  vs bare start_soon", idle / spawn, "x", target=2.0),
        Figure("submit, busy conversation", busy, "us", note="queues behind a running turn"),
        Figure("  vs idle submit", busy / idle, "x", target=0.5),
    ]


class _GrantingLocker:
    """Grants every lease at once (the registry already serializes a conversation)."""

    def __init__(self) -> None:
        self._fence = 0

    async def acquire(self, conversation_id: str) -> Lease:
        self._fence += 1
        return _Lease(self._fence)


class _Lease:
    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.lost = anyio.Event()

    async def release(self) -> None:
        pass


async def _registry_seconds(
    per_conversation: int, locked: bool, body: Callable[[int], Awaitable[None]] = _turn
) -> float:
    locker = _GrantingLocker() if locked else None
    gc.collect()
    start = time.perf_counter()
    async with TurnRegistry(locker, max_queued=per_conversation) as turns:
        for _ in range(per_conversation):
            for i in range(_CONVERSATIONS):
                turns.submit(f"conv-{i}", Job(body))
        await turns.wait()
    return time.perf_counter() - start


async def _in_sequence(turns: int) -> None:
    for _ in range(turns):
        with anyio.CancelScope():
            await _turn(0)


async def _chained(task_group: TaskGroup, turns: int) -> None:
    with anyio.CancelScope():
        await _turn(0)
    if turns > 1:
        task_group.start_soon(_chained, task_group, turns - 1)


async def _chained_seconds(per_conversation: int) -> float:
    # The floor of a task per turn: each conversation's turns run one after the other,
    # each body in its own task (which is how a turn that cannot share its predecessor's
    # task gets its submitter's context), spawned by the task of the turn before.
    gc.collect()
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(_CONVERSATIONS):
            tg.start_soon(_chained, tg, per_conversation)
    return time.perf_counter() - start


async def _bare_seconds(per_conversation: int) -> float:
    # The floor: one bare task per conversation running its turns' bodies back to back,
    # each in the cancel scope an interruptible turn needs (on both backends a scope costs
    # about twice a bare checkpoint), with no queue, no jobs and no registry.
    gc.collect()
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(_CONVERSATIONS):
            tg.start_soon(_in_sequence, per_conversation)
    return time.perf_counter() - start


def _throughput(backend: str, quick: bool) -> list[Figure]:
    per_conversation = 5 if quick else 20
    turns = per_conversation * _CONVERSATIONS
    plain = setting = locked = bare = chained = float("inf")
    for _ in range(3):
        plain = min(plain, anyio.run(_registry_seconds, per_conversation, False, backend=backend))
        setting = min(
            setting,
            anyio.run(_registry_seconds, per_conversation, False, _setting_turn, backend=backend),
        )
        locked = min(locked, anyio.run(_registry_seconds, per_conversation, True, backend=backend))
        bare = min(bare, anyio.run(_bare_seconds, per_conversation, backend=backend))
        chained = min(chained, anyio.run(_chained_seconds, per_conversation, backend=backend))
    label = f"1k conversations x {per_conversation} turns, {backend}"
    return [
        Figure(label, turns / plain, "turns/s"),
        Figure("  vs a bare task per conversation", plain / bare, "x", target=2.0),
        Figure("  turns that set a contextvar", turns / setting, "turns/s", note="a task per turn"),
        Figure("    vs a chained task per turn", setting / chained, "x", target=1.5),
        Figure("  with a locker", turns / locked, "turns/s", note="a lease per turn"),
    ]


def run(quick: bool) -> list[Figure]:
    figures = anyio.run(_submit_costs, quick, backend="asyncio")
    for backend in ("asyncio", "trio"):
        figures += _throughput(backend, quick)
    return figures
