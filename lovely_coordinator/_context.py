"""Context variables: the current permit, and the context a subscriber's callback runs in.

``run(...)``, ``permit(...)`` and a reservation's ``run`` make their permit current for the
body and for every task started inside it; ``with_lent_permit``/``lending()`` look it up
to lend it while the body waits on other agents.

The current permit needs nothing beyond the standard library: a ``ContextVar`` set in the
caller's task is copied into every task it starts (asyncio tasks and trio/anyio task groups
copy the context at spawn), and resetting it with its token restores the outer value.

The variable holds a chain of frames rather than one permit, because permits of two
coordinators nest (an agent run, inside it a run on the Bash pool): ``current_permit()``
is the innermost one, while a coordinator lends the innermost permit *it* issued.

``subscribe()`` callbacks run later, from the event loop, where the context is whatever
the loop gives them (on asyncio the notifying task's, on trio the system context). Bound
with :func:`bind_to_snapshot`, a callback runs in the context of its ``subscribe()`` call,
as a ``Future.add_done_callback`` callback does.

(``contextvars-extras`` was pinned for this module and is no longer a dependency. Its one
tool that fits, ``bind_to_snapshot_context``, has the semantics wanted here, but its 0.7.0
release, frozen upstream, drops every positional argument given at call time (and passes
those given at binding twice), so it cannot call ``callback(statistics)``; the same
semantics take three lines of :mod:`contextvars`.)
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token, copy_context
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from ._coordinator import AgentPermit

__all__ = ["bind_to_snapshot", "current_permit", "enter_permit", "exit_permit", "find_permit"]

P = ParamSpec("P")
R = TypeVar("R")


# A frame of the chain: (permit, the coordinator that issued it, the enclosing frame).
# A plain tuple: entering a permit is on the hot path of every acquire.
_Frame = tuple["AgentPermit", object, "_Frame | None"]

_current: ContextVar[_Frame | None] = ContextVar("lovely_coordinator_permit", default=None)


def current_permit() -> AgentPermit | None:
    """The permit the calling code runs under (the innermost one), or ``None``.

    Set by ``AgentCoordinator.run``/``permit`` and ``AgentReservation.run`` for their body
    and every task started in it. A permit stays current after it is released (until its
    body ends); check ``permit.state`` when that matters.
    """
    frame = _current.get()
    return None if frame is None else frame[0]


def enter_permit(permit: AgentPermit, owner: object) -> Token[_Frame | None]:
    """Make ``permit`` (issued by ``owner``) current; returns the token for :func:`exit_permit`."""
    return _current.set((permit, owner, _current.get()))


def exit_permit(token: Token[_Frame | None], permit: AgentPermit) -> None:
    """Undo the matching :func:`enter_permit` of ``permit``, as far as it is safe to.

    In the context the permit was entered in, the outer value is restored (the token's
    reset). An exit may run in another context, though: frameworks enter a stream's context
    manager in one task and exit it in another (pydantic-ai does), and ``ContextVar.reset``
    refuses a token from a different context. There, if ``permit`` is what that context
    sees as current (it was copied from inside the body), its enclosing frame becomes
    current again; otherwise that context never saw the permit (or has entered another one
    since) and is left alone. Never raises, so the caller's release always happens.
    """
    try:
        _current.reset(token)
    except ValueError:  # a token of another context (RuntimeError, reused, cannot happen)
        frame = _current.get()
        if frame is not None and frame[0] is permit:
            _current.set(frame[2])


def find_permit(owner: object) -> AgentPermit | None:
    """The innermost current permit issued by ``owner``, or ``None``."""
    frame = _current.get()
    while frame is not None:
        if frame[1] is owner:
            return frame[0]
        frame = frame[2]
    return None


def bind_to_snapshot(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` bound to a snapshot of the calling context, taken now.

    Every call of the result runs ``fn`` in its *own fresh copy* of that snapshot: it sees
    the context variables as they were at binding, whatever context the call comes from,
    and what one call sets is gone by the next. (``Future.add_done_callback`` instead
    reuses one context for every call; for a callback called again and again, each call
    starting from the same snapshot is the least surprising, and a fresh copy can never be
    "already entered" by a call still running.)
    """
    snapshot = copy_context()

    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        return snapshot.copy().run(fn, *args, **kwargs)

    return bound
