"""This process's share of a provider budget that other processes draw from too.

Several processes on one API key draw from one provider budget (a token bucket that
refills at ``per_minute / 60`` a second), and none of them sees the others. Each learns
the budget from the response headers; if each simply refilled its own bucket at the full
announced rate, together they would ask for the quota several times over (lowering a
process's bucket to the provider's ``remaining`` after each response does not prevent
that: it only says how empty the shared bucket is, not how fast the others refill theirs).

So each process estimates its *share*. Between two of its observations of the provider's
``remaining`` (at times ``t0 < t1``), the provider's bucket changed by
``refill * (t1 - t0) - drawn_by_everyone`` (while it was not full, when refill is lost),
so ``drawn_by_everyone = refill * (t1 - t0) + remaining0 - remaining1``. The process
knows what it drew itself in between; the ratio is its share. It then refills at
``share * refill`` and treats ``share * remaining`` as what is left for it. Shares that
add up to more than one make the shared bucket run dry, which shows up as a larger
``drawn_by_everyone`` and smaller samples for everyone; shares that add up to less leave
refill unused, and the samples grow: the sum settles at one without any process talking
to another.

That measurement alone keeps whatever split the processes start with: each draws at its
share, so each measures its share. To move towards shares in proportion to demand, a
process that had more demand than its share let through during a window (*hungry*: calls
waited for its budget) takes, unsmoothed, what it measured plus :data:`GREED` of what it
did not get, as long as the provider's bucket has room (more than :data:`ROOM` of its
capacity); one that drew less than its share measures less and so gives it back. Hungry
processes together ask for a little more than the whole, the measurement scales them all
back in the next window, and the smaller shares gain the most: equal demand converges to
equal shares (a process that joins a busy one gets a third of the calls within seconds).
When the bucket runs short of room, greed pauses until the measurement has brought the
sum back to one, so the over-ask stays small and the provider's 429s rare.

Until the first such window closes, each answer gives a rough estimate at once (see
``_first_sample``), so that processes starting together do not each take the whole bucket.
That estimate is never below :data:`STARTUP_FLOOR`: a provider bucket found partly spent
may have been spent long before (by others now idle, or by an earlier run), and a process
held at a tiny share sends too few requests to close its first window and learn better.

Observations are tied to what the process had drawn when it sent the request they answer
(its *mark*), not to when they arrive, so concurrent responses arriving out of order
neither double-count nor miss a draw. What it drew after that mark has not reached the
provider's count yet and is subtracted from what it may still spend.

:class:`ShareEstimator` is one budget dimension (requests or tokens) of one tuple. It is
pure: the caller passes the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

from lovely_coordinator import InvalidArgumentError

__all__ = ["Observation", "ShareEstimator"]

# A reset this close to zero means the provider's bucket is full, so refill was lost and
# the window says nothing about how much the others draw.
_FULL = 1e-3

GREED = 0.06
"""What a hungry process adds to the share it measured in a window."""
STARTUP_FLOOR = 0.25
"""The least share a rough estimate before the first window gives."""
ROOM = 0.05
"""Below this part of its capacity the provider's bucket has no room for greed."""


@final
@dataclass(frozen=True, slots=True)
class Observation:
    """One response's view of the shared bucket.

    Attributes:
        at: when it was observed (any monotonic clock, in seconds).
        remaining: the provider's remaining amount.
        mark: what this process had drawn in all, its own request included, when it sent
            the request this response answers (the value :meth:`ShareEstimator.draw`
            returned for it).
        full: the provider said its bucket was full (reset 0).
        room: the provider's bucket held more than :data:`ROOM` of its capacity.
    """

    at: float
    remaining: float
    mark: float
    full: bool
    room: bool = True


@final
class ShareEstimator:
    """Estimates this process's share of one provider budget (see the module docstring).

    Args:
        window: the shortest time between two observations compared, in seconds; longer
            windows average more draws and so jitter less, shorter ones adapt faster.
        smoothing: the weight of a new sample against the estimate, in (0, 1]; the first
            window's sample is taken as it is.
        min_share: the least share ever assumed, so a process that was idle while others
            were busy still gets requests through to measure again.

    Raises:
        InvalidArgumentError: an argument is out of range.
    """

    def __init__(self, *, window: float = 1.0, smoothing: float = 0.5, min_share: float = 0.02):
        if not _positive(window):
            raise InvalidArgumentError("window must be a positive finite number of seconds")
        if not _positive(smoothing) or smoothing > 1:
            raise InvalidArgumentError("smoothing must be a number in (0, 1]")
        if not _positive(min_share) or min_share > 1:
            raise InvalidArgumentError("min_share must be a number in (0, 1]")
        self._window = float(window)
        self._smoothing = float(smoothing)
        self._min_share = float(min_share)
        # Invariants: min_share <= share <= 1; drawn only changes through draw/adjust;
        # anchor, once set, is the newest observation (by mark) that a window started from;
        # windowed once a window closed; first_mark is the highest mark a rough sample used;
        # hungry: some observation since the anchor said calls waited for the budget.
        self._share = 1.0
        self._hungry = False
        self._windowed = False
        self._first_mark = 0.0
        self._drawn = 0.0
        self._anchor: Observation | None = None

    @property
    def share(self) -> float:
        """The current estimate, in ``[min_share, 1]`` (1 until the first sample)."""
        return self._share

    @property
    def drawn(self) -> float:
        """Everything this process has drawn so far (adjustments included)."""
        return self._drawn

    def draw(self, amount: float) -> float:
        """Record that this process drew ``amount`` (a request admitted); returns its mark."""
        self._drawn += amount
        return self._drawn

    def adjust(self, delta: float) -> None:
        """Correct what was drawn (usage settled, or a request the provider refused)."""
        self._drawn += delta

    def observe(
        self,
        *,
        at: float,
        remaining: float,
        per_minute: float,
        reset: float | None,
        mark: float,
        hungry: bool = False,
    ) -> float:
        """Take one response's ``remaining`` into account.

        Args:
            at: the current time.
            remaining: the provider's remaining amount, from the response.
            per_minute: the provider's limit per minute.
            reset: seconds until the provider's bucket is full, if it said.
            mark: the mark of the request this response answers.
            hungry: calls of this process are waiting for its budget right now.

        Returns:
            What this process may still spend now: its share of ``remaining`` less what
            it drew since ``mark`` (never below zero).
        """
        capacity = remaining + (reset or 0.0) * per_minute / 60.0
        room = reset is None or remaining > ROOM * capacity
        observation = Observation(at, remaining, mark, reset is not None and reset <= _FULL, room)
        self._hungry = self._hungry or hungry
        anchor = self._anchor
        if anchor is None:
            self._anchor = observation
        elif mark > anchor.mark and at - anchor.at >= self._window:
            if not (observation.full or anchor.full):
                self._sample(anchor, observation, per_minute / 60.0)
            self._anchor = observation
            self._hungry = False
        if not self._windowed and reset is not None and mark > self._first_mark:
            self._first_mark = mark
            self._first_sample(reset * per_minute / 60.0, mark)
        return max(0.0, self._share * remaining - max(0.0, self._drawn - mark))

    def _first_sample(self, deficit: float, own: float) -> None:
        # Until the first window closes, each answer to a request sent later than any
        # answered before gives a rough share at once: the bucket is short of full by
        # ``deficit`` (reset times refill), roughly what everyone drew since it was last
        # full, of which this process drew ``own``. Without it, processes that start
        # together would each take the whole bucket until their first window closes. The
        # latest request's answer counts the most draws, so it replaces the earlier ones.
        # A process alone whose own requests were admitted out of order looks like a
        # smaller share for a moment; the windows that follow (and the learner's reserve
        # control) correct that.
        if deficit > own > 0:
            self._share = min(1.0, max(STARTUP_FLOOR, own / deficit))
        else:
            self._share = 1.0

    def _sample(self, start: Observation, end: Observation, refill: float) -> None:
        own = end.mark - start.mark
        everyone = refill * (end.at - start.at) + start.remaining - end.remaining
        # Everyone drew no more than this process did (or the bucket only grew): others
        # are idle, so this process may take it all.
        sample = 1.0 if everyone <= own else own / everyone
        sample = min(1.0, max(self._min_share, sample))
        if self._hungry and end.room:
            sample += GREED * (1.0 - sample)  # asks for more: see the module docstring
        elif self._windowed:  # rough first estimates are replaced, not averaged in
            sample = self._share + self._smoothing * (sample - self._share)
        self._share = min(1.0, max(self._min_share, sample))
        self._windowed = True


def _positive(value: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
