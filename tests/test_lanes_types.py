"""The lanes' configuration and outcome records (CONTRACT §2)."""

from __future__ import annotations

import dataclasses
import math
from typing import get_args

import pytest

from lovely_coordinator import CoordinatorError, InvalidArgumentError
from lovely_coordinator.lanes import (
    ActivationFailed,
    ActivationInterrupted,
    ActivationSucceeded,
    Exit,
    LanesConfig,
    LanesConfigInvalid,
)


@pytest.mark.parametrize(
    "settings",
    [
        {"max_concurrent": 0},
        {"max_concurrent": 1.5},
        {"max_concurrent": math.inf},
        {"max_concurrent": True},
        {"max_concurrent": "2"},
        {"max_concurrent": 1, "max_queued": -1},
        {"max_concurrent": 1, "max_queued": 0.5},
        {"max_concurrent": 1, "turn_timeout": 0},
        {"max_concurrent": 1, "turn_timeout": -1.0},
        {"max_concurrent": 1, "turn_timeout": math.nan},
        {"max_concurrent": 1, "turn_timeout": math.inf},
        {"max_concurrent": 1, "turn_timeout": True},
    ],
)
def test_invalid_config_raises_lanes_config_invalid(settings: dict[str, object]) -> None:
    with pytest.raises(LanesConfigInvalid, match=r"^Invalid lanes config: ") as info:
        LanesConfig(**settings)
    assert type(info.value) is LanesConfigInvalid  # never a bare pydantic error
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, CoordinatorError)
    assert info.value.errors


def test_config_missing_and_unknown_fields_are_lanes_config_invalid() -> None:
    with pytest.raises(LanesConfigInvalid, match="max_concurrent"):
        LanesConfig()
    with pytest.raises(LanesConfigInvalid, match="max_running"):
        LanesConfig(max_concurrent=1, max_running=2)
    with pytest.raises(LanesConfigInvalid):
        LanesConfig.model_validate({"max_concurrent": 0})


def test_valid_config_and_bounds() -> None:
    config = LanesConfig(max_concurrent=1, max_queued=0, turn_timeout=600)
    assert (config.max_concurrent, config.max_queued, config.turn_timeout) == (1, 0, 600.0)
    assert LanesConfig(max_concurrent=3) == LanesConfig(max_concurrent=3, max_queued=None)
    assert LanesConfig(max_concurrent=2**70).max_concurrent == 2**70


def test_outcomes_are_frozen_values_and_exit_is_their_union() -> None:
    cause = ValueError("boom")
    outcomes: list[Exit] = [
        ActivationSucceeded("a"),
        ActivationFailed("b", cause),
        ActivationInterrupted("c", "timeout"),
    ]
    assert [type(outcome) for outcome in outcomes] == list(get_args(Exit))
    assert outcomes[1] == ActivationFailed("b", cause)
    assert outcomes[2] != ActivationInterrupted("c", "cancel")
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcomes[0].key = "z"  # type: ignore[misc]
