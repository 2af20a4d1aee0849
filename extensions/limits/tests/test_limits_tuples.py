"""Model tuple arguments."""

from __future__ import annotations

import pytest
from lovely_coordinator_limits import as_model_tuple

from lovely_coordinator import InvalidArgumentError, InvalidArgumentTypeError, ModelTuple

MESSAGE = r"^Model tuple provider and model must be nonempty and contain no NUL bytes$"


def test_pairs_become_model_tuples() -> None:
    t = ModelTuple("openai", "gpt-4o")
    assert as_model_tuple(t) is t
    converted = as_model_tuple(("openai", "gpt-4o"))
    assert type(converted) is ModelTuple
    assert converted == t


@pytest.mark.parametrize("bad", [("openai", ""), ("", "m"), ("a\0b", "m")])
def test_bad_parts(bad: tuple[str, str]) -> None:
    with pytest.raises(InvalidArgumentError, match=MESSAGE):
        as_model_tuple(bad)


@pytest.mark.parametrize("bad", [("openai",), ("a", "b", "c"), ["a", "b"], "ab", ("a", 1)])
def test_wrong_shapes(bad: object) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=MESSAGE):
        as_model_tuple(bad)  # type: ignore[arg-type]
