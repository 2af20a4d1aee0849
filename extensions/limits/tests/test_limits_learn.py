"""The budget learner: headers to learn_budget arguments, and processes sharing one quota.

The convergence tests simulate, on a virtual clock, a provider bucket (a ten-second window
of its announced per-minute limit, as providers enforce) that several processes draw from.
Each holds the budget its learner asks for in the coordinator's own bucket arithmetic
(``lovely_coordinator._agents.bucket``: a new rate keeps what was spent; what remains only ever
lowers what is available), as ``coordinator.learn_budget`` applies it. The provider admits
each tick's requests in random order, as concurrent requests arrive, and answers after a
jittered latency with its remaining amount at admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random

import pytest
from lovely_coordinator_limits import Limit, RateLimits
from lovely_coordinator_limits._learn import GAIN, NUDGE, RESERVE, BudgetLearner, Learned, Marks

from lovely_coordinator._agents.bucket import Bucket


def test_nothing_reported_nothing_learned() -> None:
    learner = BudgetLearner()
    marks = learner.draw(100)
    assert marks == Marks(1.0, 100.0)
    learned = learner.learn(RateLimits(None, None), marks, at=0.0)
    assert learned == Learned()
    assert learned.empty


def test_a_limit_without_remaining_is_a_rate() -> None:
    learner = BudgetLearner()
    learned = learner.learn(RateLimits(Limit(600.0, None, None), None), learner.draw(5), at=0.0)
    assert learned == Learned(requests_per_minute=600.0)


def test_remaining_without_a_limit_is_an_upper_bound() -> None:
    learner = BudgetLearner()
    marks = learner.draw(5)
    learner.draw(20)  # sent after it
    learned = learner.learn(RateLimits(None, Limit(None, 100.0, 1.0)), marks, at=0.0)
    assert learned == Learned(tokens_remaining=80.0)


@pytest.mark.parametrize(
    ("remaining", "reset", "factor"),
    [
        (0.0, 10.0, 1 - GAIN * RESERVE),  # 600 a minute refills 10 a second: 100 to fill, empty
        (10.0, 9.0, 1.0),  # at the reserve
        (20.0, 8.0, 1 + GAIN * (0.2 - RESERVE)),
        (100.0, 0.0, NUDGE[1]),  # full: the most it is nudged up
    ],
)
def test_the_rate_follows_the_bucket_towards_its_reserve(
    remaining: float, reset: float, factor: float
) -> None:
    learner = BudgetLearner()
    # The process drew all of it (100 requests): its share is whole.
    marks = Marks(learner.requests.draw(100), 0.0)
    learned = learner.learn(RateLimits(Limit(600.0, remaining, reset), None), marks, at=0.0)
    assert learner.requests.share == 1.0
    assert learned.requests_per_minute == pytest.approx(600.0 * factor)


STEP = 0.01
COST = 1_000.0  # tokens a request
PER_MINUTE = 480_000.0
RATE = PER_MINUTE / 60  # the provider refills 8,000 tokens a second
CAPACITY = RATE * 10  # and holds ten seconds of it
CAP = 8  # requests in flight per process (its coordinator's concurrency cap)


@dataclass
class Process:
    learner: BudgetLearner = field(default_factory=BudgetLearner)
    bucket: Bucket | None = None  # the coordinator's token budget, once learned
    in_flight: list[tuple[float, Marks, float]] = field(default_factory=list)
    sent: int = 0
    refused: int = 0
    served: int = 0
    served_at: list[float] = field(default_factory=list)

    def learn(self, remaining: float, marks: Marks, now: float) -> None:
        limits = RateLimits(None, Limit(PER_MINUTE, remaining, (CAPACITY - remaining) / RATE))
        available = None if self.bucket is None else self.bucket.available(now)
        # Every process has more demand than its budget: calls wait whenever it is short.
        hungry = self.bucket is not None and not self.bucket.holds(COST, now)
        learned = self.learner.learn(
            limits, marks, at=now, available=(None, available), hungry=hungry
        )
        # What coordinator.learn_budget does with it, with the coordinator's own bucket.
        rate, left = learned.tokens_per_minute, learned.tokens_remaining
        assert rate is not None
        assert left is not None
        if self.bucket is None:
            self.bucket = Bucket(rate, now)
        else:
            self.bucket.resize(rate, now)
        self.bucket.lower_to(left, now)


def _simulate(
    processes: int,
    seconds: float,
    *,
    seed: int,
    latency: float = 0.5,
    starts: tuple[float, ...] = (),
    initial: float = CAPACITY,
) -> list[Process]:
    """``processes`` with more demand than the quota; process ``i`` starts at
    ``starts[i]`` (default 0); the provider's bucket holds ``initial`` at the start."""
    rng = Random(seed)
    fleet = [Process() for _ in range(processes)]
    begin = [starts[i] if i < len(starts) else 0.0 for i in range(processes)]
    provider = initial
    for tick in range(round(seconds / STEP)):
        now = tick * STEP
        provider = min(CAPACITY, provider + RATE * STEP)
        sends: list[tuple[Process, Marks]] = []
        for process, start in zip(fleet, begin, strict=True):
            if now < start:
                continue
            due = sorted((e for e in process.in_flight if e[0] <= now), key=lambda e: e[0])
            process.in_flight = [e for e in process.in_flight if e[0] > now]
            for _, marks, remaining in due:
                process.learn(remaining, marks, now)
            # Before its first answer a process knows no budget: only its cap holds it.
            while len(process.in_flight) + sum(s[0] is process for s in sends) < CAP and (
                process.bucket is None or process.bucket.holds(COST, now)
            ):
                if process.bucket is not None:
                    process.bucket.draw(COST, now)
                sends.append((process, process.learner.draw(int(COST))))
        for process, marks in rng.sample(sends, len(sends)):
            process.sent += 1
            if provider >= COST:
                provider -= COST
                process.served += 1
                process.served_at.append(now)
            else:
                process.refused += 1
                process.learner.tokens.adjust(-COST)  # the provider did not count it
            answer = now + latency * rng.uniform(0.5, 1.5)
            process.in_flight.append((answer, marks, provider))
    return fleet


@pytest.mark.parametrize("processes", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_processes_share_one_quota(processes: int, seed: int) -> None:
    seconds = 20.0
    fleet = _simulate(processes, seconds, seed=seed)
    sent = sum(p.sent for p in fleet)
    refused = sum(p.refused for p in fleet)
    served = sum(p.served for p in fleet) * COST
    # The bench's targets: 1 process <= 1% refused and >= 90% of the quota served;
    # 3 processes <= 5% and >= 85%.
    assert refused / sent <= (0.01 if processes == 1 else 0.05)
    assert served >= (0.90 if processes == 1 else 0.85) * (CAPACITY + RATE * seconds)


def _jain(values: list[int]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_demand_converges_to_equal_shares(seed: int) -> None:
    """Regression (issue 19): four processes at equal demand kept their start-up shares
    (0.38/0.38/0.13/0.11); the bench's bar is Jain's index >= 0.9 after 20 s."""
    fleet = _simulate(4, 25.0, seed=seed)
    calls = [sum(20.0 <= t < 25.0 for t in p.served_at) for p in fleet]
    assert _jain(calls) >= 0.9, calls


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_process_joining_a_busy_one_gets_its_share_within_seconds(seed: int) -> None:
    """Regression (issue 19): a process joining another with equal demand kept 6-20% of
    the calls; the bar is >= 30% within 10 s."""
    first, joiner = _simulate(2, 20.0, seed=seed, starts=(0.0, 10.0))
    mine = sum(18.0 <= t < 20.0 for t in joiner.served_at)
    theirs = sum(18.0 <= t < 20.0 for t in first.served_at)
    assert mine / (mine + theirs) >= 0.3, (mine, theirs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_start_on_a_partly_spent_quota_is_not_held_back(seed: int) -> None:
    """Regression (issue 19): a process that started while 5% of the quota remained learned
    a share of ~2% and was held below the announced rate for seconds."""
    (process,) = _simulate(1, 10.0, seed=seed, initial=0.05 * CAPACITY)
    # Its first seconds: the rough share was ~3% (held to 3-4 calls in seconds 1-3 of 16
    # the refill allows); at least the start-up floor's quarter now, and more as soon as
    # its first window closes.
    early = sum(1.0 <= t < 3.0 for t in process.served_at)
    assert early * COST >= 0.35 * RATE * 2.0, early
    served = sum(3.0 <= t < 10.0 for t in process.served_at)
    assert served * COST >= 0.9 * RATE * 7.0  # then the whole refill


def test_a_new_rate_never_moves_what_is_available_up_nor_into_debt() -> None:
    """A coordinator budget keeps what was spent when its rate changes; the learner restates
    what is available on a raise and cuts the rate only as far as its lowering absorbs."""
    learner = BudgetLearner()
    full = Limit(600.0, 100.0, 0.0)  # a provider bucket of 100 (10 s), full: nudged to 1.5
    first = learner.learn(RateLimits(full, None), learner.draw(0), at=0.0)
    assert first.requests_per_minute == pytest.approx(900.0)
    # Emptier now (a lower rate is wanted), and 50 are available: the cut is limited to
    # what lowering to the allowance takes anyway.
    marks = learner.draw(0)
    emptier = learner.learn(
        RateLimits(Limit(600.0, 10.0, 9.0), None), marks, at=0.1, available=(50.0, None)
    )
    assert emptier.requests_remaining is not None
    assert emptier.requests_per_minute == pytest.approx(900.0 - (50.0 - emptier.requests_remaining))
    # Fuller again (a higher rate): what is available is restated, never raised.
    fuller = learner.learn(RateLimits(full, None), learner.draw(0), at=0.2, available=(3.0, None))
    assert fuller.requests_per_minute is not None
    assert emptier.requests_per_minute is not None
    assert fuller.requests_per_minute > emptier.requests_per_minute
    assert fuller.requests_remaining is not None
    assert fuller.requests_remaining <= 3.0
