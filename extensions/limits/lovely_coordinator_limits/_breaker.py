"""The per-tuple half-open breaker with additive recovery, as a pure state machine.

The handler feeds it events (a limit, a success) plus what it can see of the coordinator
(is the gate open? the tuple's cap, the global cap) and applies the :class:`Close` or
:class:`Restore` it returns. No clock, no coordinator, no I/O: every decision is testable
on its own.

An *episode* starts when a limit hits a tuple that has none:

- closed: the gate is shut for ``reopen_after`` seconds and the tuple's cap set to 1, so
  that when the coordinator reopens the gate by itself exactly one request goes through;
- half-open (*probing*): the gate has reopened; the next request is the probe. Another
  limit closes the gate again, for longer (exponential backoff, never shorter than the
  server's hint);
- *recovering*: the probe succeeded, and the cap grows back one step at a time: after as
  many successes as the current cap (about one round trip of full use), it goes up by
  one. Giving the whole cap back at the first success would let every queued request
  through at once, which is how the next storm starts. A limit while recovering halves the
  cap (to the probe, when it reaches 1) and closes the gate for the server's wait, without
  escalating the backoff: the probe had succeeded. When the cap reaches the one saved at
  the start of the episode (the global cap, if the tuple had none), the saved cap is
  restored and the episode ends.

Only requests that started after the last closure count (so were let through by the
reopened gate, not admitted before the trouble): limits reported while the gate is still
closed, or by requests that started before the last closure, can extend the closure with a
later server hint but never escalate it, and their successes prove nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import final

from lovely_coordinator import ModelTuple

from ._backoff import Backoff

__all__ = ["PROBE_LIMIT", "Breaker", "Close", "Episode", "Restore"]

# The cap that makes a reopened gate half-open: one request at a time.
PROBE_LIMIT = 1


@final
@dataclass(frozen=True, slots=True)
class Close:
    """Close the tuple for ``reopen_after`` seconds; set its cap to ``limit`` unless None."""

    reopen_after: float
    limit: int | None = PROBE_LIMIT


@final
@dataclass(frozen=True, slots=True)
class Restore:
    """Set the tuple's cap to ``limit``; ``done``: the episode is over (``limit`` may be None)."""

    limit: int | None
    done: bool = True


@final
@dataclass(slots=True)
class Episode:
    """A tuple's trouble since its first limit.

    Invariants: ``failures >= 1``; ``closed_at`` is the clock time of the last closure
    applied (``None`` until the first is); ``cap`` is ``None`` while probing, else the
    cap in force while recovering (``>= 2``), with ``0 <= successes < cap``.
    """

    failures: int
    saved_limit: int | None
    closed_at: float | None = None
    cap: int | None = None
    successes: int = 0


@final
class Breaker:
    """Decides, for each tuple, when to close, how long for, and how the cap comes back."""

    def __init__(self, backoff: Backoff, rng: Random) -> None:
        self._backoff = backoff
        self._rng = rng
        # Invariant: a tuple has an entry exactly while an episode is open for it.
        self._episodes: dict[ModelTuple, Episode] = {}

    def episode(self, t: ModelTuple) -> Episode | None:
        """The open episode of ``t``, if any (live object: do not mutate)."""
        return self._episodes.get(t)

    def on_limit(
        self,
        t: ModelTuple,
        *,
        hint: float | None,
        gate_open: bool,
        current_limit: int | None,
        started_at: float | None = None,
    ) -> Close | None:
        """A request on ``t`` hit a provider limit; ``hint`` is the server's wait, if any.

        ``started_at`` (when known) tells a request admitted before the last closure, whose
        limit says nothing about the probe, from the probe itself.
        """
        cap = self._backoff.max_delay
        hinted = None if hint is None else min(max(hint, 0.0), cap)
        episode = self._episodes.get(t)
        if episode is None:
            self._episodes[t] = Episode(failures=1, saved_limit=current_limit)
            return Close(hinted if hinted is not None else self._backoff.delay(0, self._rng))
        if not gate_open or _before(started_at, episode.closed_at):
            # A request admitted before the closure: a fresh server hint may push the
            # reopen later (the coordinator never shortens a closure), nothing more.
            return None if hinted is None else Close(hinted, limit=None)
        if episode.cap is not None:
            # Recovering: multiplicative decrease, and the server's wait (the probe had
            # succeeded, so this is no reason to back off for longer).
            halved = episode.cap // 2
            episode.failures = 1
            episode.successes = 0
            episode.cap = halved if halved > PROBE_LIMIT else None
            wait = hinted if hinted is not None else self._backoff.delay(0, self._rng)
            return Close(wait, limit=max(halved, PROBE_LIMIT))
        # Half-open and the probe failed: longer each time, and never shorter than the hint.
        episode.failures += 1
        backoff = self._backoff.delay(episode.failures - 1, self._rng)
        return Close(max(backoff, hinted or 0.0))

    def closed(self, t: ModelTuple, at: float) -> None:
        """Record that a :class:`Close` was applied at clock time ``at``."""
        episode = self._episodes.get(t)
        if episode is not None:
            episode.closed_at = at

    def on_success(
        self, t: ModelTuple, *, gate_open: bool, started_at: float | None, ceiling: int
    ) -> Restore | None:
        """A request on ``t`` succeeded; ``started_at`` is when it started, if known.

        ``ceiling`` is the global cap (``max_concurrency``): recovery of a tuple that had
        no cap of its own ends there.
        """
        episode = self._episodes.get(t)
        if episode is None or not gate_open:
            return None
        if _before(started_at, episode.closed_at):
            return None  # admitted before the closure: says nothing about recovery
        current = episode.cap if episode.cap is not None else PROBE_LIMIT
        episode.successes += 1
        if episode.successes < current:
            return None
        target = episode.saved_limit if episode.saved_limit is not None else ceiling
        grown = current + 1
        if grown >= target:
            del self._episodes[t]
            return Restore(episode.saved_limit)
        episode.cap = grown
        episode.successes = 0
        return Restore(grown, done=False)


def _before(started_at: float | None, closed_at: float | None) -> bool:
    """Whether a request that started at ``started_at`` was admitted before the closure."""
    return started_at is not None and closed_at is not None and started_at < closed_at
