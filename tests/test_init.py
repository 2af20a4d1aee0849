"""The top-level package exports exactly its public names, sorted, and every contract name."""

from __future__ import annotations

import types

import lovely_coordinator

# CONTRACT §1's import list.
CONTRACT_NAMES = {
    "AGENT_COORDINATOR_VERSION",
    "ModelTuple",
    "AgentCoordinator",
    "AgentPermit",
    "AgentReservation",
    "SessionContext",
    "ParentNotification",
    "ResidentAgent",
    "CoordinatorStatistics",
    "TupleStatistics",
    "CoordinatorConfig",
    "create_agent_coordinator",
    "get_agent_coordinator",
    "get_bash_coordinator",
    "current_permit",
    "CoordinatorError",
    "InvalidArgumentError",
    "TupleSuspendedError",
    "ReservationCancelledError",
    "ReservationUsedError",
    "PermitReleasedError",
    "IncompatibleCoordinatorError",
    # CONTRACT §5.
    "ModelTupleLike",
    "as_model_tuple",
    "ModelRequest",
    "CoordinatorBusyError",
    "UsageError",
}


def test_all_is_sorted_and_unique() -> None:
    assert lovely_coordinator.__all__ == sorted(set(lovely_coordinator.__all__))


def test_all_is_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(lovely_coordinator).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(lovely_coordinator.__all__) == public


def test_all_covers_the_contract() -> None:
    assert set(lovely_coordinator.__all__) >= CONTRACT_NAMES


def test_every_name_resolves_to_a_library_object() -> None:
    for name in lovely_coordinator.__all__:
        value = getattr(lovely_coordinator, name)
        assert value is not None
        if name == "ModelTupleLike":  # a type alias (a union), not a library object
            assert lovely_coordinator.ModelTuple in value.__args__
        elif name != "AGENT_COORDINATOR_VERSION":
            assert value.__module__.startswith("lovely_coordinator."), name


def test_every_exception_derives_from_coordinator_error() -> None:
    for name in lovely_coordinator.__all__:
        value = getattr(lovely_coordinator, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, lovely_coordinator.CoordinatorError), name
