"""How a fleet member admits one request: attempts, waits, and the local fallback.

:class:`FleetAdmission` is the admission half of ``RedisFleet`` (the hook of
``_admission.py``): the first attempt of each request leaves in the order requests were
made (a process-local line per tuple); a refused one waits, lending the task's permit
meanwhile, and re-tries when woken by an announcement on the fleet's channel, when what it
waits for is due (the reply says when), and at least every ``min(ttl / 3, 1 s)``, which is
also its place's heartbeat; never a polling loop. While Redis cannot be reached, an attempt
is admitted at the member's share (``on_unavailable="local"``) or waits for Redis
(``"wait"``). A :class:`Unit` is one admitted request: settled in the background (the
latest value wins), given back when the request ends; a unit that lapsed (its member
stalled past the ttl) is gone on the server, so its late settle changes nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

import anyio

from .._agents.settings import SUSPENDED_MESSAGE
from .._base.errors import AdmissionTimeoutError, TupleSuspendedError, UsageError
from .._base.types import ModelTuple
from . import boot, cancellation, fleet_scripts, scripts
from .fleet_member import UNAVAILABLE_ERRORS, Member
from .fleet_state import Setting, tag_of
from .grant import MAX_RECHECK
from .log import log
from .renewal import best_effort, local_deadline
from .subscriber import Watch, text

if TYPE_CHECKING:
    from .._agents.coordinator import AgentCoordinator

__all__ = ["AdmissionListener", "FleetAdmission", "Offline", "Unit"]

AdmissionListener = Callable[[ModelTuple, float, str], object]
"""Told of each admission: the tuple, the seconds it waited, and its outcome (``granted``,
``local``, ``rejected`` or ``cancelled``)."""


class FleetAdmission:
    """The admission half of ``RedisFleet`` (see the module docstring)."""

    name: str
    coordinator: AgentCoordinator
    _member: Member
    _loop: asyncio.AbstractEventLoop | None
    _lines: dict[ModelTuple, asyncio.Lock]
    _listeners: list[AdmissionListener]
    _background: set[asyncio.Task[None]]  # settles, learnings, refreshes on their way
    _releasing: set[asyncio.Task[None]]  # of which the releases
    _closing: bool  # being left: no more settles, learnings or refreshes
    _left: bool  # left: not even releases (the client may be closed)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task of the fleet's loop, kept until done (awaited on exit)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def admit_blocking(
        self, t: ModelTuple, tokens: int, *, reject: bool, timeout: float | None
    ) -> Unit | None:
        """:meth:`admit` from a thread without an event loop (``request_sync``): made on
        the fleet's loop while the calling thread blocks, given up past ``timeout``."""
        loop = self._loop
        assert loop is not None
        future = asyncio.run_coroutine_threadsafe(self.admit(t, tokens, reject=reject), loop)
        try:
            return future.result(timeout)
        except BaseException as exc:
            if not future.cancel() and not future.cancelled() and future.exception() is None:
                unit = future.result()  # granted as the wait ended: give it back
                if unit is not None:
                    unit.release(used=False)
            if isinstance(exc, concurrent.futures.TimeoutError):
                raise AdmissionTimeoutError() from None
            raise

    async def admit(self, t: ModelTuple, tokens: int, *, reject: bool) -> Unit | None:
        """The admission hook's wait (see ``_admission.py``), told to the listeners."""
        started = anyio.current_time()
        outcome = "cancelled"
        try:
            unit = await self._admit(t, tokens, reject)
            outcome = "ungoverned" if unit is None else "local" if unit.local else "granted"
            return unit
        except TupleSuspendedError:
            outcome = "rejected"
            raise
        finally:
            if self._listeners and outcome != "ungoverned":
                waited = anyio.current_time() - started
                for listener in tuple(self._listeners):
                    try:
                        listener(t, waited, outcome)
                    except Exception:
                        log.exception("fleet %r: an admission listener failed", self.name)

    async def _admit(self, t: ModelTuple, tokens: int, reject: bool) -> Unit | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise UsageError(
                "a RedisFleet admits requests only on the asyncio event loop it was entered on"
            )
        member = self._member
        tag = tag_of(t)
        unit = Unit(self, t, tag, uuid.uuid4().hex, tokens)
        line = self._lines.get(t)
        if line is None:
            line = self._lines[t] = asyncio.Lock()
        async with line:  # the first attempts of one tuple leave in the order they came
            reply = await self._attempt(unit, reject)
        if isinstance(reply, Offline):
            if reply.wait == 0:
                return unit.granted()
        elif int(reply[0]) == scripts.GRANTED:
            return unit.granted(reply)
        elif int(reply[0]) == fleet_scripts.UNGOVERNED:
            member.known.put(t, Setting())
            return None
        permit = self.coordinator.current_permit()
        wait = functools.partial(self._wait, unit, reject, reply)
        if permit is None or permit.state != "held":
            return await wait()
        got: list[Unit | None] = []

        async def lent() -> None:
            got.append(await wait())

        try:
            await permit.lend(lent)
        except BaseException:
            if got and got[0] is not None:
                got[0].release(used=False)
            raise
        return got[0]

    async def _attempt(self, unit: Unit, reject: bool) -> Sequence[Any] | Offline:
        """One admission attempt: the script's reply, or what to do while Redis is
        unreachable."""
        member = self._member
        if not member.available:
            return self._locally(unit, reject)
        keys = member.keys(unit.tag)
        unit.sent = anyio.current_time()
        try:
            return await cancellation.call(
                member.confirm.grant(
                    member.admit,
                    [member.epoch_key, keys["cfg"], keys["bucket"], keys["quiet"], keys["holders"],
                     keys["charges"], keys["queue"], keys["waiters"], keys["needs"], keys["ticket"],
                     member.tombstone(unit.tag, unit.id), keys["marker"]],
                    [unit.id, unit.tokens, member.ttl_ms, member.ttl_ms, member.channel, unit.tag,
                     boot.vouch(member.client, keys["marker"])],
                    give_back=lambda _: unit.give_back_unconfirmed(),
                    what=f"an admission of fleet {self.name!r}",
                    # Waiting, re-tried at the re-check (ms -1), on an open gate (0).
                    refusal=lambda _: [scripts.WAITING, -1, 0, 0],
                )
            )  # fmt: skip
        except UNAVAILABLE_ERRORS as exc:
            member.unavailable(exc)
            return self._locally(unit, reject)

    def _locally(self, unit: Unit, reject: bool) -> Offline:
        member = self._member
        if member.on_unavailable == "wait":
            return Offline(None)
        setting = member.known.get(unit.t)
        if setting.closed_until_ms is not None:
            left = setting.closed_until_ms / 1000 - (time.time() + member.server_offset)
            if left > 0:
                if reject:
                    raise TupleSuspendedError(SUSPENDED_MESSAGE)
                return Offline(left)
        wait = member.share.try_admit(unit.t, setting, unit.tokens, anyio.current_time())
        if wait == 0:
            unit.local = True
        return Offline(wait)

    async def _wait(self, unit: Unit, reject: bool, reply: Sequence[Any] | Offline) -> Unit | None:
        member = self._member
        watch = Watch(ticket=-math.inf)
        member.watches.setdefault(unit.tag, set()).add(watch)
        recheck = min(member.ttl / 3, MAX_RECHECK)
        try:
            while True:
                if isinstance(reply, Offline):
                    if reply.wait is None:  # "wait" mode: until Redis is back
                        with anyio.move_on_after(recheck):
                            await member.back.wait()
                    elif reply.wait == 0:
                        return unit.granted()
                    else:
                        with anyio.move_on_after(min(reply.wait, recheck)):
                            await watch.event.wait()
                else:
                    tag = int(reply[0])
                    if tag == scripts.GRANTED:
                        if anyio.current_time() < local_deadline(unit.sent, member.ttl):
                            return unit.granted(reply)
                        log.warning(
                            "fleet %r: a grant arrived after its ttl; given back", self.name
                        )
                        await best_effort(
                            functools.partial(unit.give_back, used=False), member.ttl, "giving back"
                        )
                        unit.reset()
                        wait = 0.0
                    elif tag == fleet_scripts.UNGOVERNED:
                        member.known.put(unit.t, Setting())
                        return None
                    elif tag == fleet_scripts.LOST:
                        await member.restore(member.epoch)
                        if not member.known.governs(unit.t):
                            return None
                        wait = 0.0
                    elif tag == scripts.QUIET:
                        if await boot.on_quiet(
                            member.client,
                            member.keys(unit.tag)["marker"],
                            f"fleet {self.name!r}",
                            int(reply[1]),
                            text(reply[2]),
                        ):
                            wait = 0.0
                        else:
                            wait = min(int(reply[1]) / 1000, recheck)
                    else:
                        if int(reply[3]) and reject:
                            raise TupleSuspendedError(SUSPENDED_MESSAGE)
                        watch.ticket = int(reply[2])
                        ms = int(reply[1])
                        wait = recheck if ms < 0 else min(ms / 1000, recheck)
                    if wait > 0:
                        with anyio.move_on_after(wait + 0.001):
                            await watch.event.wait()
                watch.reset()
                reply = await self._attempt(unit, reject)
        except BaseException:
            if not unit.local:
                await best_effort(
                    functools.partial(unit.give_back, used=False, abandon=True),
                    member.ttl,
                    f"cleaning up a request of fleet {self.name!r}",
                )
            raise
        finally:
            watches = member.watches.get(unit.tag)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del member.watches[unit.tag]

    def _wake_local(self, tag: str) -> None:
        for watch in self._member.watches.get(tag, ()):
            watch.event.set()


def _mark(value: Any) -> float | None:
    raw = text(value) if isinstance(value, bytes | str) else value
    return None if raw in ("", None) else float(raw)


@dataclass(frozen=True, slots=True)
class Offline:
    """What an attempt comes to while Redis is unreachable: admitted locally (``wait`` 0),
    wait that many seconds (or until a local unit is released), or (None, "wait" mode)
    wait for Redis."""

    wait: float | None


@final
class Unit:
    """One request's fleet admission (``_admission.Admitted``): a unit of the tuple, held
    until released; settle() is sent in the background (the latest value wins)."""

    def __init__(
        self, fleet: FleetAdmission, t: ModelTuple, tag: str, unit_id: str, tokens: int
    ) -> None:
        self.fleet = fleet
        self.t = t
        self.tag = tag
        self.id = unit_id
        self.tokens = tokens  # the current charge
        self.sent = 0.0
        self.local = False
        self.admitted_ms: int | None = None  # the server's time of the admission (ms)
        # What the bucket had drawn in all (requests, tokens) once it was admitted.
        self.marks: tuple[float | None, float | None] = (None, None)
        self._sending: asyncio.Task[None] | None = None
        self._settled = tokens
        self._done = False

    def reset(self) -> None:
        """A fresh id, after a grant that came too late was given back."""
        self.id = uuid.uuid4().hex
        self._done = False

    async def give_back_unconfirmed(self) -> None:
        """Give back an admission too few replicas acknowledged (``min_replicas``; its
        budget draw refunded) and take a fresh id for the next attempt."""
        await self.give_back(used=False)
        self.reset()

    def granted(self, reply: Sequence[Any] | None = None) -> Unit:
        """Admitted (by the script's ``reply``; None: locally): held from now on."""
        if reply is not None:
            self.admitted_ms = int(reply[2])
            self.marks = (_mark(reply[3]), _mark(reply[4]))
        member = self.fleet._member
        if not self.local:
            member.units[self.id] = (self.t, member.keys(self.tag)["holders"])
        return self

    def settle(self, tokens: int) -> None:
        delta = tokens - self.tokens
        self.tokens = tokens
        if self.local:
            self.fleet._member.share.settle(self.t, delta)
            return
        loop = self.fleet._loop
        assert loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._send_soon()
        else:
            loop.call_soon_threadsafe(self._send_soon)

    def _send_soon(self) -> None:
        if self._sending is None and not self._done and not self.fleet._closing:
            self._sending = self.fleet._in_background(self._send())

    async def _send(self) -> None:
        member = self.fleet._member
        keys = member.keys(self.tag)
        try:
            while self._settled != self.tokens and not self._done:
                value = self.tokens
                await member.settle(
                    [keys["cfg"], keys["bucket"], keys["holders"], keys["charges"], keys["queue"]],
                    [self.id, value, member.channel, self.tag],
                )
                self._settled = value
        except Exception as exc:  # it lapses with its unit; the release settles it too
            log.warning(
                "fleet %r: settling a request failed: %s",
                self.fleet.name,
                exc,
                exc_info=not isinstance(exc, UNAVAILABLE_ERRORS),
            )
        finally:
            self._sending = None

    def release(self, *, used: bool) -> None:
        """Give the unit back (``_admission.Admitted``): at once locally, to the server in
        the background (a request's exit never waits: the httpx transport exits from sync
        code and finalizers). From any thread; never raises."""
        loop = self.fleet._loop
        assert loop is not None
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._release_soon(used)
        else:
            loop.call_soon_threadsafe(self._release_soon, used)

    def _release_soon(self, used: bool) -> None:
        if self.local:
            self._done = True
            self.fleet._member.share.release(self.t)
            self.fleet._wake_local(self.tag)
        elif not self.fleet._left:
            task = self.fleet._in_background(self.give_back(used=used))
            self.fleet._releasing.add(task)
            task.add_done_callback(self.fleet._releasing.discard)
        else:  # the fleet was left: the unit lapses within its ttl
            self._done = True
            self.fleet._member.units.pop(self.id, None)

    async def give_back(self, *, used: bool, abandon: bool = False) -> None:
        self._done = True
        member = self.fleet._member
        if self.local:
            member.share.release(self.t)
            self.fleet._wake_local(self.tag)
            return
        member.units.pop(self.id, None)
        keys = member.keys(self.tag)
        await best_effort(
            lambda: member.release(
                [keys["cfg"], keys["bucket"], keys["holders"], keys["charges"], keys["queue"],
                 keys["waiters"], keys["needs"], member.tombstone(self.tag, self.id)],
                [self.id, self.tokens, 1 if used else 0, f"{member.channel}\n{self.tag}",
                 member.ttl_ms if abandon else 0],
            ),
            member.ttl,
            f"releasing a request of fleet {self.fleet.name!r}",
        )  # fmt: skip
