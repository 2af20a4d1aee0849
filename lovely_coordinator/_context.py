"""The current permit: which agent permit the running code executes under.

``run(...)``, ``permit(...)`` and a reservation's ``run`` make their permit current for the
body and for every task started inside it; ``with_lent_permit``/``lending()`` look it up
to lend it while the body waits on other agents.

The standard library's :mod:`contextvars` is all this needs, so it is what is used:
a ``ContextVar`` set in the caller's task is copied into every task it starts (asyncio
tasks and trio/anyio task groups copy the context at spawn), and resetting it with its
token restores the outer value. ``contextvars-extras`` (a pinned dependency, reserved
for use behind this module) would add nothing here: its registries and descriptors solve
*declaring many variables*, and this module declares one.

The variable holds a chain of frames rather than one permit, because permits of two
coordinators nest (an agent run, inside it a run on the Bash pool): ``current_permit()``
is the innermost one, while a coordinator lends the innermost permit *it* issued.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._coordinator import AgentPermit

__all__ = ["current_permit", "enter_permit", "exit_permit", "find_permit"]


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
