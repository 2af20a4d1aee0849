"""CoordinatorConfig: defaults, every validation rule, and errors that are always ours."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from lovely_coordinator import CoordinatorConfig, InvalidArgumentError, ModelTuple

PREFIX = "Invalid coordinator config: "
TUPLE_MESSAGE = "Model tuple provider and model must be nonempty and contain no NUL bytes"


def test_defaults() -> None:
    config = CoordinatorConfig()
    assert config.max_concurrency == 4
    assert config.tuple_limits == {}
    assert config.reacquire == "fresh"
    assert CoordinatorConfig() == config


def test_valid_values() -> None:
    config = CoordinatorConfig(
        max_concurrency=1, tuple_limits={("openai", "gpt-4o"): 2}, reacquire="original"
    )
    assert config.max_concurrency == 1
    assert config.reacquire == "original"
    # Plain pairs become validated model tuples.
    [key] = config.tuple_limits
    assert type(key) is ModelTuple
    assert config.tuple_limits == {ModelTuple("openai", "gpt-4o"): 2}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_concurrency": 0}, "max_concurrency: Input should be greater than or equal to 1"),
        ({"max_concurrency": -3}, "max_concurrency: Input should be greater than or equal to 1"),
        # bool, floats and numeric strings are not ints here.
        ({"max_concurrency": True}, "max_concurrency: Input should be a valid integer"),
        ({"max_concurrency": 2.0}, "max_concurrency: Input should be a valid integer"),
        ({"max_concurrency": "2"}, "max_concurrency: Input should be a valid integer"),
        ({"reacquire": "latest"}, "reacquire: Input should be 'fresh' or 'original'"),
        ({"tuple_limits": [1]}, "tuple_limits: Input should be a valid dictionary"),
        (
            {"tuple_limits": {("p", "m"): 0}},
            "tuple_limits.ModelTuple('p', 'm'): Input should be greater than or equal to 1",
        ),
        (
            {"tuple_limits": {("p", "m"): True}},
            "tuple_limits.ModelTuple('p', 'm'): Input should be a valid integer",
        ),
        ({"tuple_limits": {("p", ""): 1}}, f"tuple_limits: Value error, {TUPLE_MESSAGE}"),
        ({"tuple_limits": {"p/m": 1}}, f"tuple_limits: Value error, {TUPLE_MESSAGE}"),
        ({"bogus": 1}, "bogus: Extra inputs are not permitted"),
    ],
)
def test_invalid_fields(fields: dict[str, Any], message: str) -> None:
    makers: list[Callable[[], CoordinatorConfig]] = [
        lambda: CoordinatorConfig(**fields),
        lambda: CoordinatorConfig.model_validate(fields),
    ]
    for make in makers:
        with pytest.raises(InvalidArgumentError) as caught:
            make()
        error = caught.value
        assert str(error) == PREFIX + message
        assert isinstance(error.__cause__, ValidationError)
        # pydantic's structured details travel with the error.
        [detail] = error.errors
        assert ".".join(str(part) for part in detail["loc"]) == message.split(":")[0]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        CoordinatorConfig(max_concurrency=0, reacquire="x")
    assert str(caught.value) == (
        PREFIX + "max_concurrency: Input should be greater than or equal to 1; "
        "reacquire: Input should be 'fresh' or 'original'"
    )
    assert [d["loc"] for d in caught.value.errors] == [("max_concurrency",), ("reacquire",)]


def test_json_input_is_validated_the_same_way() -> None:
    assert CoordinatorConfig.model_validate_json('{"max_concurrency": 2}').max_concurrency == 2
    with pytest.raises(InvalidArgumentError) as caught:
        CoordinatorConfig.model_validate_json('{"max_concurrency": 0}')
    assert (
        str(caught.value) == PREFIX + "max_concurrency: Input should be greater than or equal to 1"
    )


def test_the_config_is_frozen() -> None:
    config = CoordinatorConfig()
    with pytest.raises(ValidationError):
        config.max_concurrency = 3
    assert config.max_concurrency == 4
