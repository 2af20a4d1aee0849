"""The shared value types: validation rules, exact messages, immutability, equality."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from lovely_coordinator import (
    CoordinatorStatistics,
    InvalidArgumentError,
    ModelTuple,
    ParentNotification,
    ResidentAgent,
    SessionContext,
    TupleStatistics,
)
from lovely_coordinator._base.errors import InvalidArgumentTypeError
from lovely_coordinator._base.types import as_model_tuple

TUPLE_MESSAGE = r"^Model tuple provider and model must be nonempty and contain no NUL bytes$"
DEPTH_MESSAGE = r"^Managed session depth must be a nonnegative integer$"


def test_model_tuple_is_a_frozen_ordered_hashable_pair() -> None:
    t = ModelTuple("openai", "gpt-4o")
    assert (t.provider, t.model) == ("openai", "gpt-4o")
    assert t == ("openai", "gpt-4o")
    assert hash(t) == hash(("openai", "gpt-4o"))
    assert {t: 1}[("openai", "gpt-4o")] == 1  # type: ignore[index]
    assert sorted([ModelTuple("b", "a"), ModelTuple("a", "z"), ModelTuple("a", "b")]) == [
        ("a", "b"),
        ("a", "z"),
        ("b", "a"),
    ]
    assert repr(t) == "ModelTuple('openai', 'gpt-4o')"
    assert str(t) == "openai/gpt-4o"
    with pytest.raises(AttributeError):
        t.provider = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        t.extra = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("provider", "model"),
    [("", "m"), ("p", ""), ("", ""), ("p\0x", "m"), ("p", "m\0"), ("\0", "\0")],
)
def test_model_tuple_rejects_empty_parts_and_nul_bytes(provider: str, model: str) -> None:
    with pytest.raises(InvalidArgumentError, match=TUPLE_MESSAGE) as caught:
        ModelTuple(provider, model)
    assert not isinstance(caught.value, TypeError)
    with pytest.raises(InvalidArgumentError, match=TUPLE_MESSAGE):
        as_model_tuple((provider, model))


@pytest.mark.parametrize(("provider", "model"), [(None, "m"), ("p", 1), (b"p", "m")])
def test_model_tuple_parts_must_be_strings(provider: Any, model: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=TUPLE_MESSAGE):
        ModelTuple(provider, model)


def test_model_tuple_cannot_be_made_invalid_through_namedtuple_helpers() -> None:
    t = ModelTuple("p", "m")
    with pytest.raises(InvalidArgumentError, match=TUPLE_MESSAGE):
        t._replace(model="")
    with pytest.raises(InvalidArgumentError, match=TUPLE_MESSAGE):
        ModelTuple._make(["p", "m\0"])
    assert t._replace(model="n") == ModelTuple("p", "n")
    assert type(t._replace(model="n")) is ModelTuple
    assert ModelTuple._make(["p", "m"]) == t


def test_as_model_tuple() -> None:
    t = ModelTuple("p", "m")
    assert as_model_tuple(t) is t
    converted = as_model_tuple(("p", "m"))
    assert type(converted) is ModelTuple
    assert converted == t
    for bad in (["p", "m"], ("p",), ("p", "m", "x"), "pm", None):
        with pytest.raises(InvalidArgumentTypeError, match=TUPLE_MESSAGE):
            as_model_tuple(bad)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_session_context() -> None:
    with anyio.fail_after(5):
        dispose = anyio.Event()
        ctx = SessionContext(depth=2, allow_agents=True, dispose=dispose)
        assert (ctx.depth, ctx.allow_agents, ctx.dispose) == (2, True, dispose)
        assert ctx == SessionContext(2, True, dispose)
        assert SessionContext(0, False).dispose is None
        with pytest.raises(dataclasses.FrozenInstanceError):
            ctx.depth = 3  # type: ignore[misc]
        assert ctx.dispose is not None
        dispose.set()
        await ctx.dispose.wait()


def test_session_context_depth_must_be_a_nonnegative_int() -> None:
    with pytest.raises(InvalidArgumentError, match=DEPTH_MESSAGE) as caught:
        SessionContext(-1, True)
    assert not isinstance(caught.value, TypeError)
    for bad in (True, 1.0, "1", None):
        with pytest.raises(InvalidArgumentTypeError, match=DEPTH_MESSAGE):
            SessionContext(bad, True)  # type: ignore[arg-type]


def test_session_context_allow_agents_must_be_a_bool() -> None:
    with pytest.raises(
        InvalidArgumentTypeError, match=r"^Managed session allow_agents must be a bool$"
    ):
        SessionContext(0, 1)  # type: ignore[arg-type]


def test_parent_notification_is_a_frozen_value() -> None:
    n = ParentNotification("n1", "task-1", {"text": "done"})
    assert (n.id, n.task_ref, n.content) == ("n1", "task-1", {"text": "done"})
    assert n == ParentNotification("n1", "task-1", {"text": "done"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.content = "other"  # type: ignore[misc]


def test_resident_agent_protocol_needs_stop_and_dispose() -> None:
    class Sync:
        def stop(self) -> None:
            pass

        def dispose(self) -> None:
            pass

    class Async:
        async def stop(self) -> None:
            pass

        async def dispose(self) -> None:
            pass

    class StopOnly:
        def stop(self) -> None:
            pass

    assert isinstance(Sync(), ResidentAgent)
    assert isinstance(Async(), ResidentAgent)
    assert not isinstance(StopOnly(), ResidentAgent)


def test_statistics_are_frozen_snapshots() -> None:
    t = TupleStatistics(ModelTuple("p", "m"), 1, 2, None, False, 12.5)
    stats = CoordinatorStatistics(4, 1, 2, 0, 3, (t,))
    assert stats.tuples[0].reopens_at == 12.5
    assert stats == CoordinatorStatistics(4, 1, 2, 0, 3, (t,))
    assert hash(stats) == hash(CoordinatorStatistics(4, 1, 2, 0, 3, (t,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.active = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.open = True  # type: ignore[misc]
