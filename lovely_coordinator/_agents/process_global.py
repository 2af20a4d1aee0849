"""The process-global coordinators, shared by every copy of the library in the process.

An agent runtime may load this library more than once: a vendored copy inside an
extension, a second copy after a hot reload. They must all schedule against one pool, so
the coordinator cannot live in a module global (each copy has its own). It lives instead
on a *sentinel*: a bare module object registered in ``sys.modules`` under a fixed key that
no copy will ever import by name. The sentinel carries ``AGENT_COORDINATOR_VERSION`` and
the coordinator; a copy that finds a sentinel checks both the version and the shape of
the coordinator before using it, and refuses loudly rather than schedule through an
object it does not understand.

Creation is race-free without a lock: the complete sentinel is built first and then
published with ``dict.setdefault``, which is atomic. If two threads (or two copies, which
could never share a lock) race on the first call, exactly one sentinel wins and both
return its coordinator; the loser's unused coordinator is simply dropped. A coordinator
holds no resources until it is used, so building one that loses costs nothing.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Final

from .._base.errors import IncompatibleCoordinatorError
from .._base.validate import as_index
from .controls import LIMIT_MESSAGE
from .coordinator import (
    AGENT_COORDINATOR_VERSION,
    DEFAULT_LIMIT,
    AgentCoordinator,
    create_agent_coordinator,
)

__all__ = ["get_agent_coordinator", "get_bash_coordinator"]

# Fixed forever: every copy and every version of the library must find the same entry.
# They are not importable names, so nothing can shadow them by accident.
AGENT_KEY: Final = "__lovely_coordinator_process_global_agent_coordinator__"
BASH_KEY: Final = "__lovely_coordinator_process_global_bash_coordinator__"

# What a coordinator found on a sentinel must offer: everything of CONTRACT §1 that its
# users call. Attributes are checked for presence, methods also for being callable.
_ATTRIBUTES: Final = ("max_concurrency", "active_count", "queued_count", "resident_count")
_METHODS: Final = (
    "next_acceptance_order",
    "set_max_concurrency",
    "set_tuple_limit",
    "set_budget",
    "request",
    "close_tuple",
    "open_tuple",
    "is_tuple_open",
    "tuple_reopens_at",
    "acquire",
    "permit",
    "run",
    "reserve",
    "with_lent_permit",
    "lending",
    "statistics",
    "subscribe",
    "watch",
    "bind_resident",
    "get_resident",
    "bind_notification_route",
    "get_notification_route",
    "bind_session_context",
    "get_session_context",
    # What the first-party extensions call on the coordinator they are given, which is
    # often this one (tests/agents/test_process_global.py scans their source to keep this
    # list whole).
    "learn_budget",
    "tuple_statistics",
    "add_instrument",
    "request_sync",
)

# The last sentinel (and its coordinator) this copy found compatible, per key, so that
# repeated calls skip the shape check. Keyed on identity: a replaced sentinel is checked.
_verified: dict[str, tuple[object, object]] = {}

# The keys whose ignored max_concurrency was already warned about (once is enough).
_warned: set[str] = set()

_log = logging.getLogger("lovely_coordinator")


def get_agent_coordinator(max_concurrency: int = DEFAULT_LIMIT) -> AgentCoordinator:
    """The process-global agent coordinator, created by the first call in the process.

    Every copy of the library in the process (vendored, reloaded) gets the same object:
    an instance of the class of whichever copy created it, so use it through its methods
    rather than ``isinstance`` checks against your copy's :class:`AgentCoordinator`.

    Args:
        max_concurrency: the limit used if this call creates the coordinator (4 by
            default); later calls ignore it (use ``set_max_concurrency`` to change the
            limit), and log a warning, once, when an explicit value differs from the
            coordinator's. It is validated on every call, so a bad value fails the same way
            whichever call comes first.

    Raises:
        InvalidArgumentError: ``max_concurrency`` is not an int ≥ 1.
        IncompatibleCoordinatorError: another copy of the library, of an incompatible
            version, created the process-global coordinator.
    """
    return _get(AGENT_KEY, max_concurrency, "Lovely Agents")


def get_bash_coordinator(max_concurrency: int = DEFAULT_LIMIT) -> AgentCoordinator:
    """The process-global coordinator of background processes (bash), independent of agents.

    Same rules as :func:`get_agent_coordinator`: its slots, gates and queue are its own;
    residents of background processes still bind in the agent coordinator.

    Raises:
        InvalidArgumentError: ``max_concurrency`` is not an int ≥ 1.
        IncompatibleCoordinatorError: the process-global bash coordinator is incompatible.
    """
    return _get(BASH_KEY, max_concurrency, "Lovely Bash")


def _get(key: str, max_concurrency: int, label: str) -> AgentCoordinator:
    explicit = max_concurrency is not DEFAULT_LIMIT
    limit = as_index(max_concurrency, LIMIT_MESSAGE)
    sentinel = sys.modules.get(key)
    if sentinel is None:
        fresh = types.ModuleType(key, f"The process-global {label} coordinator.")
        fresh.AGENT_COORDINATOR_VERSION = AGENT_COORDINATOR_VERSION  # type: ignore[attr-defined]
        fresh.coordinator = create_agent_coordinator(limit)  # type: ignore[attr-defined]
        sentinel = sys.modules.setdefault(key, fresh)
        explicit = explicit and sentinel is not fresh  # ours won: nothing was ignored
    coordinator = getattr(sentinel, "coordinator", None)
    verified = _verified.get(key)
    if verified is None or verified[0] is not sentinel or verified[1] is not coordinator:
        if not _compatible(sentinel, coordinator):
            raise IncompatibleCoordinatorError(f"Incompatible process-global {label} coordinator")
        _verified[key] = (sentinel, coordinator)
    if explicit and key not in _warned:
        current = getattr(coordinator, "max_concurrency", None)
        if current != limit:
            _warned.add(key)
            _log.warning(
                "get_%s_coordinator(max_concurrency=%d) ignored: the process-global %s "
                "coordinator already exists with max_concurrency=%s; call "
                "set_max_concurrency() to change it",
                "agent" if key == AGENT_KEY else "bash",
                limit,
                label,
                current,
            )
    # It is an AgentCoordinator in shape, possibly another copy's class.
    return coordinator  # type: ignore[return-value]


def _is_version(value: object) -> bool:
    return type(value) is int and value == AGENT_COORDINATOR_VERSION


def _compatible(sentinel: object, coordinator: object) -> bool:
    if not isinstance(sentinel, types.ModuleType) or coordinator is None:
        return False
    if not _is_version(getattr(sentinel, "AGENT_COORDINATOR_VERSION", None)):
        return False
    if not _is_version(getattr(coordinator, "version", None)):
        return False
    if not all(hasattr(coordinator, name) for name in _ATTRIBUTES):
        return False
    return all(callable(getattr(coordinator, name, None)) for name in _METHODS)
