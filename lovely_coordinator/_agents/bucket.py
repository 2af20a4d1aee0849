"""A token bucket on a caller-supplied clock: the arithmetic of a budget dimension.

A provider's limit of *N per minute* is a bucket of capacity ``N`` that refills
continuously at ``N / 60`` per second and starts full. Nothing here reads a clock: every
method takes ``now`` (seconds on whatever clock the caller uses), so the scheduler can run
on an event loop's clock, on trio's ``MockClock`` or on a test's virtual one.

The rules (CONTRACT §5):

* A bucket *holds* an amount when what is available is at least that amount. The amount a
  draw must wait for is capped at the capacity: a draw larger than the bucket waits until
  it is full, then takes it below zero. So while a bucket is below zero every draw waits,
  a draw of zero included.
* A refund never lifts a bucket above its capacity; a charge may take it below zero.
* Changing the capacity keeps what was already spent: the available amount moves by the
  change in capacity and never ends above the new capacity (:meth:`Bucket.resize`). A rate
  learned from the provider keeps what is available instead (:meth:`Bucket.rerate`).

Why a tolerance: a timer armed for the instant a draw becomes affordable fires at exactly
that instant, but ``level + rate * (t - stamp)`` evaluated there may come out a few ulps
short. Treating "short by less than a billionth of the capacity" as affordable means a
wake-up armed for a draw always finds it affordable (a wake-up that granted nothing would
re-arm for an instant a rounding error later, forever in the worst case).
"""

from __future__ import annotations

from typing import Final, final

__all__ = ["Bucket"]

_SECONDS_PER_MINUTE: Final = 60.0
_TOLERANCE: Final = 1e-9


@final
class Bucket:
    """One budget dimension of one tuple (requests or tokens per minute).

    Invariants:
        * ``capacity > 0`` and finite; ``rate == capacity / 60``.
        * ``level <= capacity`` (it may be negative: a debt).
        * The available amount at ``now >= stamp`` is
          ``min(capacity, level + rate * (now - stamp))``.
    """

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, per_minute: float, now: float) -> None:
        self.capacity = per_minute
        self.rate = per_minute / _SECONDS_PER_MINUTE
        self.level = per_minute  # full when set
        self.stamp = now

    def __repr__(self) -> str:
        return f"<Bucket {self.level:g}/{self.capacity:g} at {self.stamp:g}>"

    def available(self, now: float) -> float:
        """What the bucket holds at ``now`` (may be negative)."""
        if now <= self.stamp:
            return self.level
        return min(self.capacity, self.level + self.rate * (now - self.stamp))

    def _settle_at(self, now: float) -> None:
        # Fold the refill up to ``now`` into ``level``; a clock that went backwards
        # (another loop's clock, mid-move) refills nothing rather than un-refilling.
        if now > self.stamp:
            self.level = self.available(now)
            self.stamp = now

    def need(self, amount: float) -> float:
        """What must be available before ``amount`` may be drawn."""
        return amount if amount < self.capacity else self.capacity

    def holds(self, amount: float, now: float) -> bool:
        """Whether ``amount`` may be drawn at ``now``."""
        return self.available(now) >= self.need(amount) - _TOLERANCE * self.capacity

    def ready_at(self, amount: float, now: float) -> float:
        """The earliest instant ≥ ``now`` at which ``amount`` may be drawn."""
        missing = self.need(amount) - self.available(now)
        if missing <= _TOLERANCE * self.capacity:
            return now
        return max(now, self.stamp) + missing / self.rate

    def draw(self, amount: float, now: float) -> None:
        """Take ``amount`` (the caller checked :meth:`holds`); may end below zero."""
        self._settle_at(now)
        self.level -= amount

    def adjust(self, change: float, now: float) -> None:
        """Charge (``change > 0``) or refund (``change < 0``) at once; never above capacity."""
        self._settle_at(now)
        self.level = min(self.capacity, self.level - change)

    def lower_to(self, amount: float, now: float) -> None:
        """Make at most ``amount`` available (never more than there is)."""
        self._settle_at(now)
        if amount < self.level:
            self.level = amount

    def resize(self, per_minute: float, now: float) -> None:
        """A new per-minute amount; what was spent stays spent."""
        self._settle_at(now)
        self.level = min(per_minute, self.level + (per_minute - self.capacity))
        self.capacity = per_minute
        self.rate = per_minute / _SECONDS_PER_MINUTE

    def rerate(self, per_minute: float, now: float) -> None:
        """A new per-minute amount learned from the provider; what is available stays
        (at most the new capacity): a learned rate moves with every response, and keeping
        what was spent would turn each cut into a debt."""
        self._settle_at(now)
        self.level = min(per_minute, self.level)
        self.capacity = per_minute
        self.rate = per_minute / _SECONDS_PER_MINUTE

    def shift(self, delta: float) -> None:
        """Restate the bucket on a clock ``delta`` seconds ahead (the same instant)."""
        self.stamp += delta
