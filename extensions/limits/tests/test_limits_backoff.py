"""Exponential backoff with jitter."""

from __future__ import annotations

import math
import re
from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lovely_coordinator_limits import Backoff

from lovely_coordinator import InvalidArgumentError

backoffs = st.builds(
    Backoff,
    base=st.floats(0.001, 10.0),
    factor=st.floats(1.0, 10.0),
    max_delay=st.floats(10.0, 10_000.0),
    jitter=st.floats(0.0, 0.99),
)


@given(backoffs, st.integers(0, 10_000), st.integers())
def test_delay_is_within_bounds(backoff: Backoff, attempt: int, seed: int) -> None:
    nominal = backoff.nominal(attempt)
    delay = backoff.delay(attempt, Random(seed))
    assert backoff.base <= nominal <= backoff.max_delay
    assert (1 - backoff.jitter) * nominal <= delay <= nominal
    assert delay > 0


@given(backoffs, st.integers(0, 5_000))
def test_nominal_never_shrinks(backoff: Backoff, attempt: int) -> None:
    assert backoff.nominal(attempt) <= backoff.nominal(attempt + 1)


def test_nominal_doubles_up_to_the_cap() -> None:
    backoff = Backoff(base=1.0, factor=2.0, max_delay=10.0, jitter=0.0)
    assert [backoff.nominal(n) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.nominal(10**9) == 10.0
    assert backoff.delay(2, Random(1)) == 4.0


def test_jitter_spreads_delays() -> None:
    backoff = Backoff(jitter=0.5)
    rng = Random(7)
    delays = {backoff.delay(3, rng) for _ in range(20)}
    assert len(delays) == 20
    assert all(4.0 <= d <= 8.0 for d in delays)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base": 0.0}, "Backoff base must be a positive finite number"),
        ({"base": math.inf}, "Backoff base must be a positive finite number"),
        ({"factor": 0.5}, "Backoff factor must be a finite number >= 1"),
        ({"max_delay": 0.5}, "Backoff max_delay must be a finite number >= base"),
        ({"max_delay": math.nan}, "Backoff max_delay must be a finite number >= base"),
        ({"jitter": 1.0}, "Backoff jitter must be in [0, 1)"),
        ({"jitter": True}, "Backoff jitter must be in [0, 1)"),
    ],
)
def test_invalid_fields(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^{re.escape(message)}$"):
        Backoff(**kwargs)


def test_negative_attempt() -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"^Backoff attempt must be a nonnegative integer$"
    ):
        Backoff().nominal(-1)
