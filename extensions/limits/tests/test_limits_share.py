"""The share estimator, its rules one by one (the learner's tests run it on a shared bucket)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lovely_coordinator_limits._share import GREED, STARTUP_FLOOR, ShareEstimator

from lovely_coordinator import InvalidArgumentError


def test_alone_the_share_stays_whole() -> None:
    estimator = ShareEstimator(window=1.0)
    mark = estimator.draw(100)
    assert estimator.observe(at=0.0, remaining=900, per_minute=600, reset=1.0, mark=mark) == 900
    for second in range(1, 6):
        mark = estimator.draw(10)  # drew 10, the bucket refilled 10 and lost 10: alone
        left = estimator.observe(at=second, remaining=900, per_minute=600, reset=1.0, mark=mark)
        assert left == 900
    assert estimator.share == 1.0


def test_before_the_first_window_the_latest_answer_gives_a_rough_share() -> None:
    estimator = ShareEstimator(window=1.0)
    first, second, third = estimator.draw(10), estimator.draw(10), estimator.draw(10)
    # 40 short of full (4 s at 10 a second) when the second request was admitted, of which
    # this process drew 20: half.
    estimator.observe(at=0.2, remaining=60, per_minute=600, reset=4.0, mark=second)
    assert estimator.share == pytest.approx(0.5)
    # An answer to an earlier request (admitted before) says less: ignored.
    estimator.observe(at=0.3, remaining=90, per_minute=600, reset=1.0, mark=first)
    assert estimator.share == pytest.approx(0.5)
    # The latest request's answer replaces it: all 30 short of full were this process's.
    estimator.observe(at=0.4, remaining=70, per_minute=600, reset=3.0, mark=third)
    assert estimator.share == 1.0


def test_a_sample_is_what_this_process_drew_of_what_everyone_drew() -> None:
    estimator = ShareEstimator(window=1.0, smoothing=0.5)
    estimator.observe(at=0.0, remaining=500, per_minute=600, reset=None, mark=estimator.draw(1))
    # In 2 s the provider refilled 20 and fell by 40: everyone drew 60, this process 15.
    mark = estimator.draw(15)
    left = estimator.observe(at=2.0, remaining=460, per_minute=600, reset=5.0, mark=mark)
    assert estimator.share == pytest.approx(0.25)  # the first sample is taken as it is
    assert left == pytest.approx(0.25 * 460)
    mark = estimator.draw(30)  # now half of the 60 drawn in the next 2 s
    estimator.observe(at=4.0, remaining=420, per_minute=600, reset=5.0, mark=mark)
    assert estimator.share == pytest.approx(0.25 + 0.5 * (0.5 - 0.25))
    # Once a window has closed, rough first estimates are over.
    estimator.observe(at=4.5, remaining=0, per_minute=600, reset=50.0, mark=estimator.draw(1))
    assert estimator.share == pytest.approx(0.375)


def test_draws_since_the_request_are_not_left_to_spend_again() -> None:
    estimator = ShareEstimator()
    mark = estimator.draw(10)
    estimator.draw(25)  # sent after it; the provider's remaining does not count it yet
    assert estimator.observe(at=0.0, remaining=100, per_minute=60, reset=None, mark=mark) == 75
    estimator.draw(500)
    assert estimator.observe(at=0.1, remaining=100, per_minute=60, reset=None, mark=mark) == 0


def test_windows_shorter_than_the_window_older_marks_and_full_buckets_are_not_samples() -> None:
    estimator = ShareEstimator(window=1.0)
    first = estimator.draw(1)
    estimator.observe(at=0.0, remaining=100, per_minute=60, reset=None, mark=first)
    # Too soon after the anchor.
    estimator.observe(at=0.5, remaining=0, per_minute=60, reset=None, mark=estimator.draw(1))
    assert estimator.share == 1.0
    # A response to a request sent before the anchor's, arriving late.
    estimator.observe(at=5.0, remaining=0, per_minute=60, reset=None, mark=first - 1)
    assert estimator.share == 1.0
    # A full bucket at the end of the window: its refill was lost, nothing to learn.
    estimator.observe(at=5.0, remaining=100, per_minute=60, reset=0.0, mark=estimator.draw(1))
    assert estimator.share == 1.0
    # ... and at its start.
    estimator.observe(at=7.0, remaining=0, per_minute=60, reset=None, mark=estimator.draw(1))
    assert estimator.share == 1.0
    estimator.observe(at=9.0, remaining=0, per_minute=60, reset=None, mark=estimator.draw(1))
    assert estimator.share == pytest.approx(0.5)  # drew 1 of the 2 that refilled


def test_adjustments_change_what_was_drawn() -> None:
    estimator = ShareEstimator()
    estimator.draw(10)
    estimator.adjust(-4)
    assert estimator.drawn == 6


@given(
    steps=st.lists(
        st.tuples(
            st.floats(0, 3), st.floats(0, 1000), st.floats(0, 50), st.none() | st.floats(0, 9)
        ),
        max_size=40,
    )
)
def test_the_share_stays_in_bounds_and_nothing_left_is_negative(
    steps: list[tuple[float, float, float, float | None]],
) -> None:
    estimator = ShareEstimator(window=0.5, min_share=0.05)
    at = 0.0
    for gap, remaining, amount, reset in steps:
        at += gap
        mark = estimator.draw(amount)
        left = estimator.observe(at=at, remaining=remaining, per_minute=600, reset=reset, mark=mark)
        assert 0.0 <= left <= remaining
        assert 0.05 <= estimator.share <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, r"^window must be a positive finite number of seconds$"),
        ({"window": float("inf")}, r"^window must be a positive finite number of seconds$"),
        ({"smoothing": 1.5}, r"^smoothing must be a number in \(0, 1\]$"),
        ({"smoothing": True}, r"^smoothing must be a number in \(0, 1\]$"),
        ({"min_share": 0}, r"^min_share must be a number in \(0, 1\]$"),
    ],
)
def test_bad_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        ShareEstimator(**kwargs)


def test_a_rough_share_is_never_below_the_start_up_floor() -> None:
    """Regression (issue 19): a bucket found 95% spent (by others, long before) made the
    first answer's share 1 / 95 and held the process there for seconds."""
    estimator = ShareEstimator(window=1.0)
    mark = estimator.draw(1)
    estimator.observe(at=0.1, remaining=5, per_minute=600, reset=9.5, mark=mark)
    assert estimator.share == STARTUP_FLOOR


def _window(hungry: bool, reset: float) -> ShareEstimator:
    estimator = ShareEstimator(window=1.0, smoothing=0.5)
    estimator.observe(at=0.0, remaining=500, per_minute=600, reset=None, mark=estimator.draw(1))
    # In 2 s the provider refilled 20 and fell by 40: everyone drew 60, this process 15.
    mark = estimator.draw(15)
    estimator.observe(
        at=2.0, remaining=500 - 40, per_minute=600, reset=reset, mark=mark, hungry=hungry
    )
    return estimator


def test_a_hungry_process_asks_for_part_of_what_it_did_not_get() -> None:
    assert _window(False, 5.0).share == pytest.approx(0.25)
    assert _window(True, 5.0).share == pytest.approx(0.25 + GREED * 0.75)
    # The provider's bucket without room (460 of 460 + 1000 s * 10 a second): no greed.
    assert _window(True, 1000.0).share == pytest.approx(0.25)


def test_hunger_counts_for_the_window_it_was_seen_in() -> None:
    estimator = ShareEstimator(window=1.0, smoothing=0.5)
    estimator.observe(at=0.0, remaining=500, per_minute=600, reset=None, mark=estimator.draw(1))
    estimator.observe(
        at=0.5, remaining=490, per_minute=600, reset=5.0, mark=estimator.draw(5), hungry=True
    )
    estimator.observe(at=2.0, remaining=460, per_minute=600, reset=5.0, mark=estimator.draw(10))
    assert estimator.share == pytest.approx(0.25 + GREED * 0.75)
    # The next window saw no hunger: smoothed towards what it measured (half of 60).
    estimator.observe(at=4.0, remaining=420, per_minute=600, reset=5.0, mark=estimator.draw(30))
    first = 0.25 + GREED * 0.75
    assert estimator.share == pytest.approx(first + 0.5 * (0.5 - first))
