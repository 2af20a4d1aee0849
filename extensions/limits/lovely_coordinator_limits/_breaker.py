"""The per-tuple half-open breaker, as a pure state machine.

The handler feeds it events (a limit, a success) plus what it can see of the coordinator
(is the gate open? what is the tuple's cap?) and applies the :class:`Close` or
:class:`Restore` it returns. No clock, no coordinator, no I/O: every decision is testable
on its own.

An *episode* starts when a limit hits a tuple that has none:

- closed: the gate is shut for ``reopen_after`` seconds and the tuple's cap set to 1, so
  that when the coordinator reopens the gate by itself exactly one request goes through;
- half-open: the gate has reopened; the next request is the probe.
  A success of a request that started after the last closure (so it was let through by
  the reopened gate, not admitted before the trouble) ends the episode: the old cap is
  restored and the backoff forgotten. A limit closes the gate again, for longer.

Limits reported while the gate is still closed, or by requests that started before the
last closure, come from requests that were already running; they can extend the closure
with a later server hint but never escalate it.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import final

from lovely_coordinator import ModelTuple

from ._backoff import Backoff

__all__ = ["Breaker", "Close", "Episode", "Restore"]

# The cap that makes a reopened gate half-open: one request at a time.
PROBE_LIMIT = 1


@final
@dataclass(frozen=True, slots=True)
class Close:
    """Close the tuple for ``reopen_after`` seconds and cap it at one request."""

    reopen_after: float


@final
@dataclass(frozen=True, slots=True)
class Restore:
    """The episode is over: give the tuple back its cap from before (``None``: no cap)."""

    limit: int | None


@final
@dataclass(slots=True)
class Episode:
    """A tuple's trouble since its first limit.

    Invariants: ``failures >= 1``; ``closed_at`` is the clock time of the last closure
    applied (``None`` until the first is).
    """

    failures: int
    saved_limit: int | None
    closed_at: float | None = None


@final
class Breaker:
    """Decides, for each tuple, when to close, how long for, and when trouble is over."""

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
            return None if hinted is None else Close(hinted)
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
        self, t: ModelTuple, *, gate_open: bool, started_at: float | None
    ) -> Restore | None:
        """A request on ``t`` succeeded; ``started_at`` is when it started, if known."""
        episode = self._episodes.get(t)
        if episode is None or not gate_open:
            return None
        if _before(started_at, episode.closed_at):
            return None  # admitted before the closure: says nothing about recovery
        del self._episodes[t]
        return Restore(episode.saved_limit)


def _before(started_at: float | None, closed_at: float | None) -> bool:
    """Whether a request that started at ``started_at`` was admitted before the closure."""
    return started_at is not None and closed_at is not None and started_at < closed_at
