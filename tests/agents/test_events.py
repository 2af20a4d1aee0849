"""_agents/events: the gate and budget log records (CONTRACT §7), as caplog sees them."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from trio.testing import MockClock

from lovely_coordinator import ModelTuple, create_agent_coordinator

T = ModelTuple("openai", "gpt-4o")

MOCK = [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")]


def fact(record: logging.LogRecord, name: str) -> Any:
    """One of a record's ``extra`` facts."""
    return record.__dict__[name]


def gates(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "lovely_coordinator.gates"]


@pytest.mark.anyio
async def test_a_gate_closing_staying_closed_and_reopening(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # (async: a timed closure needs a running loop; nothing here awaits)
    coordinator = create_agent_coordinator(1)
    with caplog.at_level(logging.DEBUG, "lovely_coordinator"):
        coordinator.close_tuple(T, reopen_after=14)
        coordinator.close_tuple(T, reopen_after=30)  # later: replaces the reopen time
        coordinator.close_tuple(T, reopen_after=1)  # earlier: ignored
        coordinator.close_tuple(T)  # until open_tuple
        coordinator.open_tuple(T)
        coordinator.open_tuple(T)  # already open: nothing to say
    now = anyio.current_time()
    closed, later, ignored, untimed, reopened = gates(caplog)
    assert [r.levelno for r in (closed, later, ignored, untimed, reopened)] == [
        logging.INFO,
        logging.INFO,
        logging.DEBUG,
        logging.INFO,
        logging.INFO,
    ]
    assert (
        closed.getMessage()
        == f"gate of openai/gpt-4o closed until {fact(closed, 'reopens_at'):.2f} (in 14.0 s)"
    )
    assert fact(closed, "model_tuple") == T
    assert fact(closed, "reopens_in") == pytest.approx(14.0)
    assert fact(closed, "reopens_at") == pytest.approx(now + 14, abs=1)
    assert later.getMessage().startswith("gate of openai/gpt-4o stays closed, now until ")
    assert fact(later, "reopens_in") == pytest.approx(30.0, abs=1)
    assert "already closed" in ignored.getMessage()
    assert "never shortened" in ignored.getMessage()
    assert untimed.getMessage() == (
        "gate of openai/gpt-4o stays closed, now until open_tuple() opens it"
    )
    assert fact(untimed, "reopens_at") is None
    assert reopened.getMessage() == "gate of openai/gpt-4o reopened (open_tuple)"
    assert fact(reopened, "reason") == "open_tuple"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", MOCK)
async def test_a_timed_gate_reopening_by_itself(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(60):
        coordinator = create_agent_coordinator(1)
        with caplog.at_level(logging.INFO, "lovely_coordinator"):
            coordinator.close_tuple(T, reopen_after=14)
            await anyio.sleep(15)
        assert coordinator.is_tuple_open(T)
        last = gates(caplog)[-1]
        assert last.getMessage() == "gate of openai/gpt-4o reopened (reopen time reached)"
        assert fact(last, "reason") == "reopen time reached"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", MOCK)
@pytest.mark.parametrize(
    ("budget", "tokens", "dimension"),
    [
        ({"requests_per_minute": 1}, 0, "requests"),
        ({"tokens_per_minute": 100}, 80, "tokens"),
        ({"requests_per_minute": 1, "tokens_per_minute": 100}, 80, "requests and tokens"),
    ],
)
async def test_a_budget_holding_requests_back(
    budget: dict[str, float], tokens: int, dimension: str, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(600):
        coordinator = create_agent_coordinator(4)
        coordinator.set_budget(T, **budget)
        with caplog.at_level(logging.DEBUG, "lovely_coordinator.budgets"):
            async with coordinator.request(T, tokens=tokens):
                pass
            assert caplog.records == []  # the first one fits
            async with anyio.create_task_group() as tg:

                async def second() -> None:
                    async with coordinator.request(T, tokens=tokens):
                        pass

                tg.start_soon(second)
                await wait_all_tasks_blocked()
                (record,) = caplog.records
                assert record.levelno == logging.DEBUG
                assert fact(record, "dimension") == dimension
                assert fact(record, "model_tuple") == T
                assert fact(record, "ready_in") > 0
                message = record.getMessage()
                assert message.startswith("budget of openai/gpt-4o exhausted (")
                for part in dimension.split(" and "):
                    assert f"{part}: " in message
                assert f"(in {fact(record, 'ready_in'):.1f} s)" in message


@pytest.mark.anyio
async def test_nothing_is_formatted_while_the_loggers_are_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(5):
        coordinator = create_agent_coordinator(1)
        coordinator.set_budget(T, requests_per_minute=1)
        with caplog.at_level(logging.WARNING, "lovely_coordinator"):
            coordinator.close_tuple(T, reopen_after=5)
            coordinator.open_tuple(T)
            async with coordinator.request(T):
                pass
            with anyio.move_on_after(0.01):
                async with coordinator.request(T):
                    pass
        assert caplog.records == []


def test_the_library_installs_no_handler() -> None:
    for name in ("lovely_coordinator", "lovely_coordinator.gates", "lovely_coordinator.budgets"):
        assert logging.getLogger(name).handlers == []
