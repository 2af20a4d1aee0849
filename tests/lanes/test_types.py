"""The lanes' configuration and outcome records (CONTRACT §2)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction
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


# --- every pydantic entry point, and numbers by the library's one rule --------------------


@pytest.mark.parametrize(
    "validate",
    [
        pytest.param(lambda: LanesConfig.model_validate_json('{"max_concurrent": 0}'), id="json"),
        pytest.param(lambda: LanesConfig.model_validate_json("{not json"), id="bad-json"),
        pytest.param(
            lambda: LanesConfig.model_validate_json('{"max_concurrent": 1, "turn_timeout": 1e999}'),
            id="json-infinity",
        ),
        pytest.param(
            lambda: LanesConfig.model_validate_strings({"max_concurrent": "zero"}), id="strings"
        ),
        pytest.param(
            lambda: LanesConfig(max_concurrent=2).model_copy(update={"max_concurrent": 0}),
            id="copy",
        ),
        pytest.param(
            lambda: LanesConfig(max_concurrent=2).model_copy(update={"turn_timeout": -1}),
            id="copy-timeout",
        ),
        pytest.param(
            lambda: LanesConfig(max_concurrent=2).model_copy(update={"max_running": 1}),
            id="copy-unknown-field",
        ),
    ],
)
def test_every_validating_entry_point_raises_lanes_config_invalid(
    validate: Callable[[], object],
) -> None:
    """model_validate_json and model_validate_strings used to raise bare pydantic errors,
    and model_copy(update=...) did not validate at all."""
    with pytest.raises(LanesConfigInvalid, match=r"^Invalid lanes config: ") as info:
        validate()
    assert type(info.value) is LanesConfigInvalid
    assert info.value.errors


def test_valid_json_and_copies_validate() -> None:
    config = LanesConfig.model_validate_json('{"max_concurrent": 3, "turn_timeout": 2.5}')
    assert config == LanesConfig(max_concurrent=3, turn_timeout=2.5)
    assert config.model_copy(update={"max_queued": 0}).max_queued == 0
    assert config.model_copy() == config


class IntSubclass(int):
    pass


class FloatSubclass(float):
    pass


class Index:
    """An integer by ``operator.index`` only, like ``numpy.int64``."""

    def __index__(self) -> int:
        return 3


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"max_concurrent": IntSubclass(2)}, (2, None, None)),
        ({"max_concurrent": Index(), "max_queued": Index()}, (3, 3, None)),
        ({"max_concurrent": 1, "max_queued": IntSubclass(0)}, (1, 0, None)),
        ({"max_concurrent": 1, "turn_timeout": FloatSubclass(0.5)}, (1, None, 0.5)),
        ({"max_concurrent": 1, "turn_timeout": IntSubclass(2)}, (1, None, 2.0)),
        ({"max_concurrent": 1, "turn_timeout": Fraction(1, 4)}, (1, None, 0.25)),
        ({"max_concurrent": 1, "turn_timeout": 10**300}, (1, None, 1e300)),
        ({"max_concurrent": 10**400}, (10**400, None, None)),
    ],
)
def test_numbers_follow_the_one_rule(
    settings: dict[str, object], expected: tuple[object, object, object]
) -> None:
    config = LanesConfig(**settings)
    assert (config.max_concurrent, config.max_queued, config.turn_timeout) == expected
    assert type(config.max_concurrent) is int
    assert config.turn_timeout is None or type(config.turn_timeout) is float


@pytest.mark.parametrize(
    "settings",
    [
        {"max_concurrent": 1, "turn_timeout": 10**400},  # too large to be a float
        {"max_concurrent": 1, "turn_timeout": -(10**400)},
        {"max_concurrent": 1, "turn_timeout": FloatSubclass("nan")},
        {"max_concurrent": 1, "turn_timeout": FloatSubclass("inf")},
        {"max_concurrent": 1, "max_queued": FloatSubclass(1.0)},
    ],
)
def test_numbers_out_of_the_rule_are_lanes_config_invalid(settings: dict[str, object]) -> None:
    with pytest.raises(LanesConfigInvalid, match=r"^Invalid lanes config: "):
        LanesConfig(**settings)
