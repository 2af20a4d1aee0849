"""_context: the current permit, innermost first, and each coordinator's own permit."""

from __future__ import annotations

import contextvars
from typing import cast

import anyio
import pytest

from lovely_coordinator._context import (
    bind_to_snapshot,
    current_permit,
    enter_permit,
    exit_permit,
    find_permit,
)
from lovely_coordinator._coordinator import AgentPermit


def fake() -> AgentPermit:
    # The context only stores and returns permits; any object stands in for one here.
    return cast(AgentPermit, object())


def test_nothing_is_current_outside_a_permit() -> None:
    assert current_permit() is None
    assert find_permit(object()) is None


def test_frames_nest_and_restore() -> None:
    agents, bash = object(), object()
    agent_permit, bash_permit = fake(), fake()
    outer = enter_permit(agent_permit, agents)
    inner = enter_permit(bash_permit, bash)
    assert current_permit() is bash_permit
    assert find_permit(agents) is agent_permit  # a coordinator finds the permit it issued
    assert find_permit(bash) is bash_permit
    exit_permit(inner, bash_permit)
    assert current_permit() is agent_permit
    assert find_permit(bash) is None
    exit_permit(outer, agent_permit)
    assert current_permit() is None


@pytest.mark.anyio
async def test_tasks_started_inside_inherit_the_permit() -> None:
    with anyio.fail_after(5):
        owner = object()
        parent = fake()
        seen: list[object] = []

        async def child() -> None:
            seen.append(current_permit())
            own = fake()
            token = enter_permit(own, owner)  # the child's own: never seen by the parent
            exit_permit(token, own)

        token = enter_permit(parent, owner)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
        finally:
            exit_permit(token, parent)
        assert seen == [parent]
        assert current_permit() is None


def test_exit_in_another_context_restores_only_where_the_permit_is_current() -> None:
    owner = object()
    outer, inner = fake(), fake()
    outer_token = enter_permit(outer, owner)
    inner_token = enter_permit(inner, owner)
    copied = contextvars.copy_context()  # a task started in the body: the permit is current
    exit_permit(outer_token, outer)  # same context: a plain reset
    assert current_permit() is None

    def exit_inner_in_the_copy() -> object:
        exit_permit(inner_token, inner)  # a foreign token: no ValueError escapes
        return current_permit()

    assert copied.run(exit_inner_in_the_copy) is outer  # the enclosing frame is current again

    def exit_where_never_seen() -> object:
        exit_permit(inner_token, inner)
        return current_permit()

    unrelated = contextvars.Context()
    assert unrelated.run(exit_where_never_seen) is None  # left alone


_value: contextvars.ContextVar[int] = contextvars.ContextVar("value", default=0)


def test_bind_to_snapshot_runs_each_call_in_a_fresh_copy_of_the_snapshot() -> None:
    def bump(by: int) -> int:
        _value.set(_value.get() + by)
        return _value.get()

    token = _value.set(10)
    bound = bind_to_snapshot(bump)
    _value.reset(token)  # later changes of the caller's context are not seen
    assert bound(1) == 11
    assert bound(2) == 12  # not 13: the first call's change did not outlive it
    assert _value.get() == 0  # and never leaks into the calling context
    assert contextvars.Context().run(bound, 5) == 15  # whatever context it is called from
