"""The registries: nonempty keys, replace on rebind, unbind that removes only its own binding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lovely_coordinator import InvalidArgumentError, ParentNotification, SessionContext
from lovely_coordinator._agents.registries import CoordinatorRegistries
from lovely_coordinator._base.errors import InvalidArgumentTypeError

KEY_MESSAGE = r"^Coordinator registry keys must be nonempty$"


class Resident:
    def stop(self) -> None:
        pass

    def dispose(self) -> None:
        pass


def route(notification: ParentNotification) -> None:
    pass


# (bind, get) pairs for the three registries, with a value factory for each.
REGISTRIES: list[tuple[str, str, Callable[[], Any]]] = [
    ("bind_resident", "get_resident", Resident),
    ("bind_notification_route", "get_notification_route", lambda: lambda n: None),
    ("bind_session_context", "get_session_context", lambda: SessionContext(1, True)),
]
registry_ids = [bind.removeprefix("bind_") for bind, _, _ in REGISTRIES]


@pytest.mark.parametrize(("bind", "get", "make"), REGISTRIES, ids=registry_ids)
def test_bind_get_unbind(bind: str, get: str, make: Callable[[], Any]) -> None:
    registries = CoordinatorRegistries()
    value = make()
    assert getattr(registries, get)("k") is None
    unbind = getattr(registries, bind)("k", value)
    assert getattr(registries, get)("k") == value
    assert getattr(registries, get)("other") is None
    unbind()
    assert getattr(registries, get)("k") is None
    unbind()  # a second call is harmless
    assert getattr(registries, get)("k") is None


@pytest.mark.parametrize(("bind", "get", "make"), REGISTRIES, ids=registry_ids)
def test_rebind_replaces_and_the_stale_unbind_leaves_the_new_binding(
    bind: str, get: str, make: Callable[[], Any]
) -> None:
    registries = CoordinatorRegistries()
    first, second = make(), make()
    unbind_first = getattr(registries, bind)("k", first)
    unbind_second = getattr(registries, bind)("k", second)
    assert getattr(registries, get)("k") is not None
    unbind_first()
    assert getattr(registries, get)("k") == second
    unbind_second()
    assert getattr(registries, get)("k") is None


@pytest.mark.parametrize(("bind", "get", "make"), REGISTRIES, ids=registry_ids)
def test_rebinding_the_same_value_is_a_new_binding(
    bind: str, get: str, make: Callable[[], Any]
) -> None:
    # Identity of the *binding*, not of the value: an old unbind must not remove a later
    # bind of the very same object (e.g. a runtime that re-registers itself).
    registries = CoordinatorRegistries()
    value = make()
    unbind_old = getattr(registries, bind)("k", value)
    unbind_new = getattr(registries, bind)("k", value)
    unbind_old()
    assert getattr(registries, get)("k") == value
    unbind_new()
    assert getattr(registries, get)("k") is None


@pytest.mark.parametrize(("bind", "get", "make"), REGISTRIES, ids=registry_ids)
def test_keys_must_be_nonempty_strings(bind: str, get: str, make: Callable[[], Any]) -> None:
    registries = CoordinatorRegistries()
    getattr(registries, bind)("k", make())
    with pytest.raises(InvalidArgumentError, match=KEY_MESSAGE) as caught:
        getattr(registries, bind)("", make())
    assert not isinstance(caught.value, TypeError)
    with pytest.raises(InvalidArgumentError, match=KEY_MESSAGE):
        getattr(registries, get)("")
    for bad in (None, 1, b"k", ("k",)):
        with pytest.raises(InvalidArgumentTypeError, match=KEY_MESSAGE):
            getattr(registries, bind)(bad, make())
        with pytest.raises(InvalidArgumentTypeError, match=KEY_MESSAGE):
            getattr(registries, get)(bad)
    assert getattr(registries, get)("k") is not None
    assert registries.resident_count == (1 if bind == "bind_resident" else 0)


def test_registries_are_independent() -> None:
    registries = CoordinatorRegistries()
    registries.bind_resident("k", Resident())
    assert registries.get_notification_route("k") is None
    assert registries.get_session_context("k") is None


def test_resident_count_and_change_hook() -> None:
    seen: list[int] = []
    registries = CoordinatorRegistries(lambda: seen.append(registries.resident_count))
    unbind_a = registries.bind_resident("a", Resident())
    unbind_b = registries.bind_resident("b", Resident())
    assert registries.resident_count == 2
    registries.bind_notification_route("a", route)
    registries.bind_session_context("a", SessionContext(0, False))
    unbind_a()
    unbind_a()  # no change, no call
    unbind_b()
    assert registries.resident_count == 0
    assert seen == [1, 2, 1, 0]


def test_a_resident_may_be_any_object_but_none() -> None:
    registries = CoordinatorRegistries()
    resident: Any = 42
    registries.bind_resident("k", resident)
    assert registries.get_resident("k") is resident
    with pytest.raises(InvalidArgumentTypeError, match=r"^A resident agent must not be None$"):
        registries.bind_resident("k", None)  # type: ignore[arg-type]
    assert registries.get_resident("k") is resident


def test_a_route_must_be_callable() -> None:
    registries = CoordinatorRegistries()
    with pytest.raises(InvalidArgumentTypeError, match=r"^A notification route must be callable$"):
        registries.bind_notification_route("k", "not callable")  # type: ignore[arg-type]
    assert registries.get_notification_route("k") is None


@pytest.mark.anyio
async def test_an_async_route_is_stored_as_is() -> None:
    with anyio.fail_after(5):
        registries = CoordinatorRegistries()
        delivered: list[ParentNotification] = []

        async def deliver(notification: ParentNotification) -> None:
            await anyio.lowlevel.checkpoint()
            delivered.append(notification)

        registries.bind_notification_route("parent", deliver)
        found = registries.get_notification_route("parent")
        assert found is deliver
        notification = ParentNotification("n1", "task-1", "done")
        await deliver(notification)
        assert delivered == [notification]


@pytest.mark.anyio
async def test_session_context_is_a_validated_copy() -> None:
    with anyio.fail_after(5):
        registries = CoordinatorRegistries()
        dispose = anyio.Event()
        ctx = SessionContext(2, True, dispose)
        registries.bind_session_context("s", ctx)
        stored = registries.get_session_context("s")
        assert stored == ctx
        assert stored is not ctx
        # Forcing the caller's frozen object changes nothing stored.
        object.__setattr__(ctx, "depth", -1)
        assert registries.get_session_context("s") == SessionContext(2, True, dispose)
        # The dispose event is shared on purpose: it is the session's signal.
        assert stored is not None
        assert stored.dispose is dispose
        dispose.set()
        await stored.dispose.wait()


def test_session_context_depth_accepts_int_subclasses_but_bool() -> None:
    # Issue 17 (CONTRACT §5b): numpy's ints were refused.
    numpy = pytest.importorskip("numpy")
    ctx = SessionContext(numpy.int64(2), True)
    assert ctx == SessionContext(2, True)
    assert type(ctx.depth) is int
    registries = CoordinatorRegistries()
    registries.bind_session_context("s", SessionContext(numpy.uint8(0), False))
    assert registries.get_session_context("s") == SessionContext(0, False)
    for bad, error in ((True, InvalidArgumentTypeError), (numpy.int64(-1), InvalidArgumentError)):
        with pytest.raises(error, match=r"^Managed session depth must be a nonnegative integer$"):
            SessionContext(bad, True)


def test_session_context_type_and_depth_are_validated() -> None:
    registries = CoordinatorRegistries()
    with pytest.raises(
        InvalidArgumentTypeError, match=r"^A session context must be a SessionContext$"
    ):
        registries.bind_session_context("s", {"depth": 1, "allow_agents": True})  # type: ignore[arg-type]
    forged = SessionContext(0, True)
    object.__setattr__(forged, "depth", -3)
    with pytest.raises(
        InvalidArgumentError, match=r"^Managed session depth must be a nonnegative integer$"
    ):
        registries.bind_session_context("s", forged)
    assert registries.get_session_context("s") is None


# A model-based check over random sequences of binds and unbinds on a few keys.
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.sampled_from("abc")),
        st.tuples(st.just("unbind"), st.integers(min_value=0, max_value=30)),
    ),
    max_size=40,
)


@given(_steps)
def test_unbind_removes_only_its_own_binding(steps: list[tuple[str, Any]]) -> None:
    registries = CoordinatorRegistries()
    unbinds: list[tuple[str, Resident, Callable[[], None]]] = []
    model: dict[str, Resident] = {}
    for op, arg in steps:
        if op == "bind":
            resident = Resident()
            unbinds.append((arg, resident, registries.bind_resident(arg, resident)))
            model[arg] = resident
        elif unbinds:
            key, resident, unbind = unbinds[arg % len(unbinds)]
            unbind()
            if model.get(key) is resident:
                del model[key]
        for key in "abc":
            assert registries.get_resident(key) is model.get(key)
        assert registries.resident_count == len(model)
