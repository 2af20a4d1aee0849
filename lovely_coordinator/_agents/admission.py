"""The admission hook: an outer authority a model request passes before the local scheduler.

A fleet (``lovely_coordinator.redis.RedisFleet``) shares budgets, tuple limits and gates
across processes. It composes with a coordinator through this one seam, so that
``coordinator.request()`` is unchanged for its callers (the httpx transport, the
pydantic-ai model, user code): while a hook is attached, a request for a tuple the hook
*governs* is first admitted by the hook, then by the local scheduler as always.

How the two admissions compose, and why it keeps §9's promises:

* **Outer first, holding nothing local.** The hook's wait (for the fleet's gate, budget and
  limit) happens before the request exists locally: it holds no local slot, and no place in
  the local lines. If the task holds a permit of the coordinator, the hook lends it for the
  duration of its wait (``AgentPermit.lend``): its slot serves other waiters meanwhile (a
  request of a sibling task in flight on that slot keeps it until it ends, as for any lend),
  and it is taken back when the hook admits, in the order ``CoordinatorConfig.reacquire``
  says. So a request waiting on the fleet never keeps a slot idle.
* **Order.** The request's acceptance order is drawn *before* the outer wait (unless given),
  so once the fleet admits it, it enters the local lines ahead of work accepted after it,
  and requests of one tuple reach the fleet in the order they were made (the hook keeps a
  process-local line per tuple for its first attempt).
* **Learning.** While a hook is attached, ``learn_budget`` (the extensions' header
  learning) teaches the hook's budget, which the provider's figures describe: one budget
  shared by every process, not this process's share of it.
* **Threads.** ``request_sync`` (a thread without an event loop) is admitted by the hook
  the same way, the calling thread blocking meanwhile (within its timeout).
* **Then local.** The local scheduler admits the request as any other (global cap, tuple
  cap, local budget, local gate, §9). Its outer admission is held meanwhile; once inside, the
  call's ``settle()`` is passed on to the hook, and leaving the request releases both.
  A request that never got past the local admission (cancelled, refused) gives its outer
  admission back unused, so the hook refunds what it drew.

The hook is looked up per coordinator (a weak mapping, one hook per coordinator at a time).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .._base.errors import UsageError
from .._base.types import ModelTuple

if TYPE_CHECKING:
    from .core import CoordinatorCore

__all__ = ["Admission", "Admitted", "admit", "admit_blocking", "attach", "attached"]


class Admitted(Protocol):
    """One request's outer admission, held until :meth:`release`."""

    def settle(self, tokens: int) -> None:
        """The call's actual usage (already validated) replaces its charge; never raises."""

    def release(self, *, used: bool) -> None:
        """Give the admission back; never waits (a request's exit may run in sync code or
        a finalizer), from any thread, never raises. ``used=False``: the call was never
        made, so what it drew is refunded."""


class Admission(Protocol):
    """What a coordinator consults for each request (see the module docstring)."""

    def governs(self, t: ModelTuple) -> bool:
        """Whether requests for ``t`` need this hook's admission (sync, cheap)."""

    def learn(
        self,
        t: ModelTuple,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        requests_remaining: float | None,
        tokens_remaining: float | None,
        *,
        answering: object | None = None,
    ) -> None:
        """What ``learn_budget`` was told (validated), for the hook's own budget; sync,
        from any thread, never raises. The coordinator's own budget is then left alone.
        ``answering``: the ``ModelRequest`` whose response reported the figures, if known
        (the limits extension passes it)."""

    def document(self) -> dict[str, object]:
        """The hook's latest view as plain JSON data, for the statistics endpoint (sync,
        from any thread, never raises; the hook refreshes it in the background)."""

    def admit_blocking(
        self, t: ModelTuple, tokens: int, *, reject: bool, timeout: float | None
    ) -> Admitted | None:
        """:meth:`admit` for a thread without an event loop (``request_sync``): blocks
        the calling thread.

        Raises:
            AdmissionTimeoutError: not admitted within ``timeout`` (nothing held).
        """

    async def admit(self, t: ModelTuple, tokens: int, *, reject: bool) -> Admitted | None:
        """Wait (cancellably) until admitted; ``None`` if ``t`` turned out not governed.

        Raises:
            TupleSuspendedError: ``reject`` and the hook's gate for ``t`` is closed.
            UsageError: the hook cannot serve the calling event loop.
        """


# Keyed by the coordinator's core, which both the public coordinator (attach, learn,
# the statistics endpoint) and its requests (admit) reach.
_hooks: weakref.WeakKeyDictionary[object, Admission] = weakref.WeakKeyDictionary()


def _key(coordinator: object) -> object:
    return getattr(coordinator, "_core", coordinator)


def attach(coordinator: object, hook: Admission) -> Callable[[], None]:
    """Attach ``hook`` to ``coordinator``; returns the detach (identity-safe, idempotent).

    Raises:
        UsageError: another hook is attached already (one fleet per coordinator).
    """
    coordinator = _key(coordinator)
    if coordinator in _hooks:
        raise UsageError("this coordinator is already attached to a fleet")
    _hooks[coordinator] = hook

    def detach() -> None:
        if _hooks.get(coordinator) is hook:
            del _hooks[coordinator]

    return detach


def attached(coordinator: object) -> Admission | None:
    """The hook attached to ``coordinator``, if any."""
    return _hooks.get(_key(coordinator))


def admit_blocking(
    coordinator: CoordinatorCore,
    t: ModelTuple,
    tokens: int,
    order: int | None,
    reject: bool,
    deadline: float | None,
) -> tuple[Admitted | None, int | None]:
    """:func:`admit` for ``request_sync`` (blocks the calling thread); ``deadline`` is on
    ``time.monotonic()``."""
    hook = _hooks.get(coordinator) if _hooks else None
    if hook is None or not hook.governs(t):
        return None, order
    if order is None:
        with coordinator._lock:
            order = coordinator._scheduler.next_order()
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    return hook.admit_blocking(t, tokens, reject=reject, timeout=timeout), order


async def admit(
    coordinator: CoordinatorCore, t: ModelTuple, tokens: int, order: int | None, reject: bool
) -> tuple[Admitted | None, int | None]:
    """The outer admission of a request, if a hook governs ``t``, and its acceptance order.

    The order is drawn here, before the wait, when the request is governed and none was
    given (see the module docstring); otherwise ``order`` is returned unchanged.
    """
    hook = _hooks.get(coordinator) if _hooks else None
    if hook is None or not hook.governs(t):
        return None, order
    if order is None:
        with coordinator._lock:
            order = coordinator._scheduler.next_order()
    admitted = await hook.admit(t, tokens, reject=reject)
    return admitted, order
