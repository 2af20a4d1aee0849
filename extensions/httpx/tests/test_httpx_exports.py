"""The public surface of lovely_coordinator_httpx."""

from __future__ import annotations

from types import ModuleType

import lovely_coordinator_httpx
from lovely_coordinator_httpx import legacy


def test_all_is_sorted_and_complete() -> None:
    names = lovely_coordinator_httpx.__all__
    assert names == sorted(names)
    public = {
        name
        for name, value in vars(lovely_coordinator_httpx).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert set(names) == public


def test_legacy_all() -> None:
    assert legacy.__all__ == sorted(legacy.__all__)
    assert all(hasattr(legacy, name) for name in legacy.__all__)
