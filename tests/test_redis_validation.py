"""Argument checks shared by the Redis primitives."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lovely_coordinator import InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator._redis.validation import check_key, check_prefix, check_ttl


def test_good_ttls() -> None:
    assert check_ttl(30) == 30.0
    assert isinstance(check_ttl(30), float)
    assert check_ttl(0.01) == 0.01


@pytest.mark.parametrize("ttl", [0, -1, 0.005, math.inf, math.nan])
def test_bad_ttl_values(ttl: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^ttl must be a finite number of seconds"):
        check_ttl(ttl)


@pytest.mark.parametrize("ttl", [True, "30", None])
def test_bad_ttl_types(ttl: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError):
        check_ttl(ttl)


def test_keys() -> None:
    assert check_key("c", "conversation_id") == "c"
    with pytest.raises(InvalidArgumentTypeError, match=r"^name must be a nonempty string$"):
        check_key(b"c", "name")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"^name must be a nonempty string$"):
        check_key("", "name")


def test_prefixes() -> None:
    assert check_prefix("") == ""
    with pytest.raises(InvalidArgumentTypeError, match=r"^prefix must be a string$"):
        check_prefix(None)  # type: ignore[arg-type]
