"""The public surface of lovely_coordinator_pydantic_ai."""

from __future__ import annotations

import lovely_coordinator_pydantic_ai


def test_all_is_sorted_and_complete() -> None:
    names = lovely_coordinator_pydantic_ai.__all__
    assert names == sorted(names)
    public = {n for n in vars(lovely_coordinator_pydantic_ai) if not n.startswith("_")}
    assert set(names) == public
