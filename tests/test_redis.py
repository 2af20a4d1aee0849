"""The public module lovely_coordinator.redis: its exports."""

from __future__ import annotations

import lovely_coordinator.redis as public
from lovely_coordinator import CoordinatorError


def test_all_is_sorted_and_complete() -> None:
    assert public.__all__ == sorted(public.__all__)
    assert set(public.__all__) >= {
        "FencedLog",
        "RedisGates",
        "RedisLease",
        "RedisLocker",
        "RedisPermitPool",
        "StaleFenceError",
    }
    for name in public.__all__:
        # Every public exception lives in the one error module.
        module = (
            "lovely_coordinator._base.errors"
            if name.endswith("Error")
            else "lovely_coordinator._redis."
        )
        assert getattr(public, name).__module__.startswith(module)


def test_stale_fence_error_is_a_coordinator_error() -> None:
    assert issubclass(public.StaleFenceError, CoordinatorError)
