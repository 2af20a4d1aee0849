"""_base/outcomes: what stops the program and what failed, as lanes and turns both read it."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from lovely_coordinator._base.outcomes import failures_of, is_fatal

pytestmark = pytest.mark.anyio


class Abort(BaseException):
    """What frameworks raise to abort a run: a BaseException that is no cancellation."""


async def a_stray_cancellation() -> BaseException:
    """A real cancellation of the backend, caught from a scope that is gone since."""
    with anyio.CancelScope() as inner:
        inner.cancel()
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class() as cancelled:
            return cancelled
    raise AssertionError("the cancelled checkpoint returned")


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
