"""A tuple's budget alone: its buckets' arithmetic, without a scheduler (as aiolimiter
tests its bucket). The scheduler's use of it (blocks, order) is tests/agents/test_scheduler.py's."""

from __future__ import annotations

from lovely_coordinator._agents.budgets import EXPLICIT_REQUESTS, EXPLICIT_TOKENS, Budget


def test_setting_nothing_is_no_budget() -> None:
    assert Budget.set(None, None, None, 0.0) is None
    budget = Budget.set(None, 60.0, None, 0.0)
    assert Budget.set(budget, None, None, 1.0) is None


def test_a_new_dimension_starts_full_and_a_changed_one_keeps_what_was_spent() -> None:
    budget = Budget.set(None, 60.0, 600.0, 0.0)
    assert budget is not None
    assert budget.explicit == EXPLICIT_REQUESTS | EXPLICIT_TOKENS
    assert budget.requests is not None
    assert budget.tokens is not None
    assert budget.requests.available(0.0) == 60.0
    budget.draw(100, 0.0)
    assert budget.requests.available(0.0) == 59.0
    assert budget.tokens.available(0.0) == 500.0
    changed = Budget.set(budget, 120.0, None, 0.0)
    assert changed is not None
    assert changed.tokens is None
    assert changed.explicit == EXPLICIT_REQUESTS
    assert changed.requests is not None
    assert changed.requests.available(0.0) == 119.0  # one spent of the larger capacity


def test_holds_and_ready_at_agree() -> None:
    budget = Budget.set(None, 60.0, 60.0, 0.0)  # one request, one token per second
    assert budget is not None
    assert budget.holds(60, 0.0)
    assert budget.ready_at(60, 0.0) == 0.0
    budget.draw(60, 0.0)
    assert not budget.holds(1, 0.0)
    assert budget.ready_at(1, 0.0) == 1.0  # both refill one per second
    assert budget.ready_at(30, 0.0) == 30.0  # the tokens are the later of the two
    assert budget.holds(30, 30.0)


def test_refund_and_settle() -> None:
    budget = Budget.set(None, 60.0, 600.0, 0.0)
    assert budget is not None
    assert budget.requests is not None
    assert budget.tokens is not None
    budget.draw(100, 0.0)
    budget.refund(100, 0.0)
    assert budget.requests.available(0.0) == 60.0
    assert budget.tokens.available(0.0) == 600.0
    assert budget.settle(50, 0.0)
    assert budget.tokens.available(0.0) == 550.0
    assert not budget.settle(0, 0.0)
    only_requests = Budget.set(None, 60.0, None, 0.0)
    assert only_requests is not None
    assert not only_requests.settle(50, 0.0)  # no token bucket: nothing to charge


def test_learning_never_overrides_an_explicit_dimension() -> None:
    budget = Budget.set(None, 60.0, None, 0.0)
    assert budget is not None
    learned = Budget.learn(budget, 10.0, 1000.0, None, None, 0.0)
    assert learned is budget
    assert budget.requests is not None
    assert budget.requests.capacity == 60.0  # explicit: stands
    assert budget.tokens is not None
    assert budget.tokens.capacity == 1000.0  # learned
    assert budget.explicit == EXPLICIT_REQUESTS


def test_learning_remaining_only_lowers_and_needs_a_dimension() -> None:
    assert Budget.learn(None, None, None, 5.0, 5.0, 0.0) is None
    budget = Budget.learn(None, 60.0, None, 5.0, 5.0, 0.0)
    assert budget is not None
    assert budget.explicit == 0
    assert budget.tokens is None  # a remaining amount creates no dimension
    assert budget.requests is not None
    assert budget.requests.available(0.0) == 5.0
    Budget.learn(budget, None, None, 50.0, None, 0.0)
    assert budget.requests.available(0.0) == 5.0  # never raised


def test_shift_restates_the_same_instants() -> None:
    budget = Budget.set(None, None, 60.0, 0.0)  # a token a second
    assert budget is not None
    budget.draw(60, 0.0)
    assert budget.ready_at(60, 0.0) == 60.0
    budget.shift(100.0)
    assert budget.ready_at(60, 100.0) == 160.0
