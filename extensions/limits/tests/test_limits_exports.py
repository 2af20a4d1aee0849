"""The public surface of lovely_coordinator_limits."""

from __future__ import annotations

import lovely_coordinator_limits
from lovely_coordinator_limits import testing


def test_all_is_sorted_and_complete() -> None:
    names = lovely_coordinator_limits.__all__
    assert names == sorted(names)
    public = {n for n in vars(lovely_coordinator_limits) if not n.startswith("_")}
    assert set(names) == public - {"testing"}
    assert testing.__all__ == sorted(testing.__all__)
