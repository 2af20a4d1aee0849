"""The turn queues' protocols and constants (``_turns/types``).

The protocols are structural, so the conformance of the library's own implementations is
checked statically: ``mypy --strict`` (run over the tests by CI) fails on the functions
below as soon as ``RedisLocker``, ``RedisLease`` or ``anyio.Event`` lose the shape the
registry relies on. Their behaviour is tested with a real server in tests/redis/test_locker.py.
"""

from __future__ import annotations

import anyio
import pytest

from lovely_coordinator._turns.types import RELEASE_TIMEOUT
from lovely_coordinator.redis import RedisLease, RedisLocker
from lovely_coordinator.turns import DEFAULT_MAX_QUEUED, Lease, LeaseSignal, Locker

pytestmark = pytest.mark.anyio


def as_lease_signal(event: anyio.Event) -> LeaseSignal:
    return event


def as_lease(lease: RedisLease) -> Lease:
    return lease


def as_locker(locker: RedisLocker) -> Locker:
    return locker


async def test_an_anyio_event_is_a_lease_signal() -> None:
    event = anyio.Event()
    signal = as_lease_signal(event)
    assert not signal.is_set()
    event.set()
    assert signal.is_set()
    await signal.wait()


def test_constants() -> None:
    assert DEFAULT_MAX_QUEUED == 10  # the contract's value (CONTRACT §3)
    assert RELEASE_TIMEOUT == 30.0
