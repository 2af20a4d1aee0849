"""_agents/permits: the current-permit chain, innermost first, and each coordinator's own permit.

(Permits, reservations and requests themselves are exercised through the coordinator in
tests/agents/test_coordinator.py; this file covers the context machinery they share.)
"""

from __future__ import annotations

import contextvars
from typing import cast

import anyio
import pytest

from lovely_coordinator import AgentPermit, current_permit
from lovely_coordinator._agents.permits import _current, _enter, find_permit
from lovely_coordinator._agents.permits import restore as _exit


class _Fake:
    """The chain only stores and returns permits; this stands in for one."""

    def __init__(self, owner: object) -> None:
        self._coordinator = owner


def fake(owner: object) -> AgentPermit:
    return cast(AgentPermit, _Fake(owner))


def test_nothing_is_current_outside_a_permit() -> None:
    assert current_permit() is None
    assert find_permit(object()) is None


def test_frames_nest_and_restore() -> None:
    agents, bash = object(), object()
    agent_permit, bash_permit = fake(agents), fake(bash)
    outer = _enter(agent_permit)
    inner = _enter(bash_permit)
    assert current_permit() is bash_permit
    assert find_permit(agents) is agent_permit  # a coordinator finds the permit it issued
    assert find_permit(bash) is bash_permit
    _exit(_current, *inner)
    assert current_permit() is agent_permit
    assert find_permit(bash) is None
    _exit(_current, *outer)
    assert current_permit() is None


@pytest.mark.anyio
async def test_tasks_started_inside_inherit_the_permit() -> None:
    with anyio.fail_after(5):
        owner = object()
        parent = fake(owner)
        seen: list[object] = []

        async def child() -> None:
            seen.append(current_permit())
            own = fake(owner)
            entered = _enter(own)  # the child's own: never seen by the parent
            _exit(_current, *entered)

        entered = _enter(parent)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
        finally:
            _exit(_current, *entered)
        assert seen == [parent]
        assert current_permit() is None


def test_exit_in_another_context_restores_only_where_the_permit_is_current() -> None:
    owner = object()
    outer, inner = fake(owner), fake(owner)
    outer_entered = _enter(outer)
    inner_entered = _enter(inner)
    copied = contextvars.copy_context()  # a task started in the body: the permit is current

    def exit_inner_in_the_copy() -> object:
        _exit(_current, *inner_entered)
        return current_permit()

    assert copied.run(exit_inner_in_the_copy) is outer  # the enclosing frame is current again

    def exit_where_never_seen() -> object:
        _exit(_current, *inner_entered)
        return current_permit()

    unrelated = contextvars.Context()
    assert unrelated.run(exit_where_never_seen) is None  # left alone
    _exit(_current, *inner_entered)
    _exit(_current, *outer_entered)
    assert current_permit() is None


def test_an_exit_out_of_order_takes_only_its_own_frame_away() -> None:
    owner, other = object(), object()
    first, second, third = fake(owner), fake(other), fake(owner)
    entered = [_enter(first), _enter(second), _enter(third)]
    _exit(_current, *entered[0])  # out of order: the frames entered after it stay current
    assert current_permit() is third
    _exit(_current, *entered[2])
    assert current_permit() is second
    assert find_permit(owner) is None  # first is gone from the chain
    _exit(_current, *entered[1])
    assert current_permit() is None
