"""Argument checks shared by the Redis primitives."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
import redis
import redis.asyncio

from lovely_coordinator import InvalidArgumentError, InvalidArgumentTypeError
from lovely_coordinator._base.errors import UsageError
from lovely_coordinator._redis.validation import (
    check_client,
    check_fence,
    check_key,
    check_prefix,
    check_seconds,
    check_ttl,
    require_asyncio,
)

TTL = r"^ttl must be a number of seconds from 0\.01 to 1e9$"


def test_good_ttls() -> None:
    assert check_ttl(30) == 30.0
    assert isinstance(check_ttl(30), float)
    assert check_ttl(0.01) == 0.01
    assert check_ttl(Fraction(1, 2)) == 0.5  # any real number
    assert check_ttl(1e9) == 1e9


@pytest.mark.parametrize("ttl", [0, -1, 0.005, math.inf, math.nan, 1e9 + 1, 1e16, 10**400])
def test_bad_ttl_values(ttl: float) -> None:
    with pytest.raises(InvalidArgumentError, match=TTL):
        check_ttl(ttl)


@pytest.mark.parametrize("ttl", [True, "30", None])
def test_bad_ttl_types(ttl: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=TTL):
        check_ttl(ttl)


def test_seconds() -> None:
    assert check_seconds(0, "reopen_after") == 0.0
    message = r"^reopen_after must be a number of seconds from 0 to 1e9$"
    for bad in (-0.1, math.inf, 1e306, 10**400):
        with pytest.raises(InvalidArgumentError, match=message):
            check_seconds(bad, "reopen_after")
    with pytest.raises(InvalidArgumentTypeError, match=message):
        check_seconds(True, "reopen_after")


def test_fences() -> None:
    assert check_fence(0) == 0
    assert check_fence(2**70) == 2**70  # any size: compared exactly by the scripts
    with pytest.raises(InvalidArgumentTypeError):
        check_fence(True)
    with pytest.raises(InvalidArgumentError, match=r"^fence must be a nonnegative integer$"):
        check_fence(-1)


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


def test_clients() -> None:
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1")
    assert check_client(client) is client
    with pytest.raises(InvalidArgumentTypeError, match=r"not Redis \(this module is asyncio-only"):
        check_client(redis.Redis())
    with pytest.raises(InvalidArgumentTypeError, match=r"not str \(make one with"):
        check_client("redis://127.0.0.1:1")


def test_outside_an_asyncio_loop_a_call_says_so() -> None:
    with pytest.raises(UsageError, match=r"^lovely_coordinator.redis is asyncio-only, and no"):
        require_asyncio()
