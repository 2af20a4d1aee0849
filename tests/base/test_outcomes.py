"""_base/outcomes: what stops the program and what failed, as lanes and turns both read it."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from lovely_coordinator._base.outcomes import failures_of, is_fatal

from .outcome_helpers import Abort, a_stray_cancellation

pytestmark = pytest.mark.anyio


async def test_failures_of_strips_cancellations() -> None:
    with anyio.fail_after(5):
        stray = await a_stray_cancellation()
    error = ValueError("x")
    assert failures_of(error) is error
    assert failures_of(stray) is None
    assert failures_of(BaseExceptionGroup("only", [stray])) is None
    mixed = failures_of(BaseExceptionGroup("mixed", [stray, error]))
    assert isinstance(mixed, ExceptionGroup)
    assert mixed.exceptions == (error,)


def test_only_keyboard_interrupt_and_system_exit_are_fatal() -> None:
    assert is_fatal(KeyboardInterrupt())
    assert is_fatal(SystemExit(0))
    assert is_fatal(BaseExceptionGroup("g", [ValueError(), SystemExit(1)]))
    assert not is_fatal(Abort())
    assert not is_fatal(GeneratorExit())
    assert not is_fatal(BaseExceptionGroup("g", [ValueError(), Abort()]))
