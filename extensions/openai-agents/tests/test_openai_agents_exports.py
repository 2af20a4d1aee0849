"""The public surface of lovely_coordinator_openai_agents."""

from __future__ import annotations

import lovely_coordinator_openai_agents


def test_all_is_sorted_and_complete() -> None:
    names = lovely_coordinator_openai_agents.__all__
    assert names == sorted(names)
    public = {n for n in vars(lovely_coordinator_openai_agents) if not n.startswith("_")}
    assert set(names) == public
