"""The pure half-open breaker with additive recovery: a Hypothesis state machine against a
simple model, and the rules spelled out one by one."""

from __future__ import annotations

from dataclasses import dataclass
from random import Random

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from lovely_coordinator_limits import Backoff
from lovely_coordinator_limits._breaker import PROBE_LIMIT, Breaker, Close, Restore

from lovely_coordinator import ModelTuple

TUPLES = [ModelTuple("openai", "gpt-4o"), ModelTuple("anthropic", "claude")]
BACKOFF = Backoff(base=1.0, factor=2.0, max_delay=60.0, jitter=0.5)

hints = st.none() | st.floats(-5.0, 500.0)
limits = st.none() | st.integers(1, 8)
times = st.none() | st.floats(0.0, 1000.0)
ceilings = st.integers(1, 8)


@dataclass
class Expected:
    failures: int
    saved: int | None
    closed_at: float | None = None
    cap: int | None = None  # None while probing
    successes: int = 0


class BreakerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.breaker = Breaker(BACKOFF, Random(0))
        self.model: dict[ModelTuple, Expected] = {}

    @rule(
        t=st.sampled_from(TUPLES),
        hint=hints,
        gate_open=st.booleans(),
        current=limits,
        started_at=times,
    )
    def limit(
        self,
        t: ModelTuple,
        hint: float | None,
        gate_open: bool,
        current: int | None,
        started_at: float | None,
    ) -> None:
        expected = self.model.get(t)
        decision = self.breaker.on_limit(
            t, hint=hint, gate_open=gate_open, current_limit=current, started_at=started_at
        )
        clipped = None if hint is None else min(max(hint, 0.0), BACKOFF.max_delay)
        if decision is not None:
            assert 0.0 <= decision.reopen_after <= BACKOFF.max_delay
        straggler = (
            expected is not None
            and started_at is not None
            and expected.closed_at is not None
            and started_at < expected.closed_at
        )
        if expected is None:
            assert isinstance(decision, Close)
            assert decision.limit == PROBE_LIMIT
            if clipped is not None:
                assert decision.reopen_after == clipped
            else:
                assert 0.5 <= decision.reopen_after <= 1.0
            self.model[t] = Expected(failures=1, saved=current)
        elif not gate_open or straggler:
            # Still closed, or admitted before the closure: a hint may extend, never escalate.
            assert decision == (None if clipped is None else Close(clipped, limit=None))
        elif expected.cap is not None:
            # Recovering: halve the cap, wait for the server, start the backoff over.
            halved = expected.cap // 2
            assert isinstance(decision, Close)
            assert decision.limit == max(halved, PROBE_LIMIT)
            if clipped is not None:
                assert decision.reopen_after == clipped
            expected.failures, expected.successes = 1, 0
            expected.cap = halved if halved > PROBE_LIMIT else None
        else:
            expected.failures += 1
            assert isinstance(decision, Close)
            assert decision.limit == PROBE_LIMIT
            floor = (1 - BACKOFF.jitter) * BACKOFF.nominal(expected.failures - 1)
            assert decision.reopen_after >= max(floor, clipped or 0.0)

    @rule(t=st.sampled_from(TUPLES), at=st.floats(0.0, 1000.0))
    def closed(self, t: ModelTuple, at: float) -> None:
        self.breaker.closed(t, at)
        if t in self.model:
            self.model[t].closed_at = at

    @rule(t=st.sampled_from(TUPLES), gate_open=st.booleans(), started_at=times, ceiling=ceilings)
    def success(
        self, t: ModelTuple, gate_open: bool, started_at: float | None, ceiling: int
    ) -> None:
        expected = self.model.get(t)
        decision = self.breaker.on_success(
            t, gate_open=gate_open, started_at=started_at, ceiling=ceiling
        )
        proves = (
            expected is not None
            and gate_open
            and (
                started_at is None or expected.closed_at is None or started_at >= expected.closed_at
            )
        )
        if not proves:
            assert decision is None
            return
        assert expected is not None
        current = expected.cap if expected.cap is not None else PROBE_LIMIT
        expected.successes += 1
        if expected.successes < current:
            assert decision is None
            return
        target = expected.saved if expected.saved is not None else ceiling
        if current + 1 >= target:
            assert decision == Restore(expected.saved)
            del self.model[t]
        else:
            assert decision == Restore(current + 1, done=False)
            expected.cap, expected.successes = current + 1, 0

    @invariant()
    def episodes_match(self) -> None:
        for t in TUPLES:
            episode = self.breaker.episode(t)
            expected = self.model.get(t)
            if expected is None:
                assert episode is None
            else:
                assert episode is not None
                assert episode.failures == expected.failures >= 1
                assert episode.saved_limit == expected.saved
                assert episode.closed_at == expected.closed_at
                assert episode.cap == expected.cap
                assert episode.successes == expected.successes
                assert episode.cap is None or episode.cap > PROBE_LIMIT


TestBreakerMachine = BreakerMachine.TestCase


def test_escalation_doubles_without_jitter() -> None:
    breaker = Breaker(Backoff(base=1.0, max_delay=100.0, jitter=0.0), Random(0))
    t = TUPLES[0]
    assert breaker.on_limit(t, hint=None, gate_open=True, current_limit=None) == Close(1.0)
    assert breaker.on_limit(t, hint=None, gate_open=False, current_limit=1) is None
    assert breaker.on_limit(t, hint=None, gate_open=True, current_limit=1) == Close(2.0)
    assert breaker.on_limit(t, hint=None, gate_open=True, current_limit=1) == Close(4.0)
    # A server hint longer than the backoff wins; a shorter one does not shorten it.
    assert breaker.on_limit(t, hint=30.0, gate_open=True, current_limit=1) == Close(30.0)
    assert breaker.on_limit(t, hint=0.1, gate_open=True, current_limit=1) == Close(16.0)
    assert breaker.on_limit(t, hint=1e9, gate_open=True, current_limit=1) == Close(100.0)


def test_a_limit_of_a_request_admitted_before_the_closure_does_not_escalate() -> None:
    breaker = Breaker(Backoff(base=1.0, max_delay=100.0, jitter=0.0), Random(0))
    t = TUPLES[0]
    breaker.on_limit(t, hint=None, gate_open=True, current_limit=None)
    breaker.closed(t, 50.0)
    assert breaker.on_limit(t, hint=None, gate_open=True, current_limit=1, started_at=49.0) is None
    assert breaker.on_limit(t, hint=9.0, gate_open=True, current_limit=1, started_at=49.0) == Close(
        9.0, limit=None
    )
    episode = breaker.episode(t)
    assert episode is not None
    assert episode.failures == 1
    assert breaker.on_limit(
        t, hint=None, gate_open=True, current_limit=1, started_at=50.0
    ) == Close(2.0)


def test_success_of_a_request_admitted_before_the_closure_is_ignored() -> None:
    breaker = Breaker(BACKOFF, Random(0))
    t = TUPLES[1]
    breaker.on_limit(t, hint=5.0, gate_open=True, current_limit=3)
    breaker.closed(t, 100.0)
    assert breaker.on_success(t, gate_open=False, started_at=110.0, ceiling=8) is None
    assert breaker.on_success(t, gate_open=True, started_at=99.0, ceiling=8) is None
    assert breaker.on_success(t, gate_open=True, started_at=100.0, ceiling=8) == Restore(
        2, done=False
    )
    assert breaker.on_success(t, gate_open=True, started_at=101.0, ceiling=8) is None
    assert breaker.on_success(t, gate_open=True, started_at=101.0, ceiling=8) == Restore(3)
    assert breaker.episode(t) is None
    assert breaker.on_success(t, gate_open=True, started_at=None, ceiling=8) is None


@pytest.mark.parametrize("t", TUPLES)
def test_tuples_are_independent(t: ModelTuple) -> None:
    breaker = Breaker(BACKOFF, Random(0))
    breaker.on_limit(t, hint=1.0, gate_open=True, current_limit=None)
    other = next(u for u in TUPLES if u != t)
    assert breaker.episode(other) is None
    assert breaker.on_success(other, gate_open=True, started_at=None, ceiling=4) is None


def test_recovery_is_additive_up_to_the_global_cap() -> None:
    """Without a cap of its own, a tuple grows back one step per round of successes (as
    many as the cap), and the episode ends at the global cap with no tuple cap at all."""
    breaker = Breaker(Backoff(jitter=0.0), Random(0))
    t = TUPLES[0]
    breaker.on_limit(t, hint=1.0, gate_open=True, current_limit=None)
    breaker.closed(t, 0.0)
    decisions = [breaker.on_success(t, gate_open=True, started_at=1.0, ceiling=5) for _ in range(9)]
    assert decisions == [
        Restore(2, done=False),  # the probe
        None,
        Restore(3, done=False),
        None,
        None,
        Restore(4, done=False),
        None,
        None,
        None,
    ]
    assert breaker.on_success(t, gate_open=True, started_at=1.0, ceiling=5) == Restore(None)
    assert breaker.episode(t) is None


def test_a_limit_while_recovering_halves_the_cap_without_escalating() -> None:
    breaker = Breaker(Backoff(base=1.0, max_delay=100.0, jitter=0.0), Random(0))
    t = TUPLES[0]
    breaker.on_limit(t, hint=None, gate_open=True, current_limit=8)
    breaker.on_limit(t, hint=None, gate_open=True, current_limit=1)  # a failed probe: 2 s
    breaker.closed(t, 0.0)
    for _ in range(1 + 2 + 3 + 4):  # probe, then rounds at 2, 3 and 4
        breaker.on_success(t, gate_open=True, started_at=1.0, ceiling=8)
    episode = breaker.episode(t)
    assert episode is not None
    assert episode.cap == 5
    # The server's wait, not the escalated backoff (the probe had succeeded).
    assert breaker.on_limit(t, hint=0.5, gate_open=True, current_limit=5) == Close(0.5, limit=2)
    assert (episode.cap, episode.failures, episode.successes) == (2, 1, 0)
    breaker.closed(t, 2.0)
    assert breaker.on_limit(t, hint=None, gate_open=True, current_limit=2, started_at=3.0) == Close(
        1.0, limit=PROBE_LIMIT
    )
    probing = breaker.episode(t)
    assert probing is not None
    assert probing.cap is None  # probing again
    # A failed probe escalates from the start of the backoff again.
    assert breaker.on_limit(t, hint=None, gate_open=True, current_limit=1) == Close(2.0)
