"""What user bodies raise in the lanes and turns tests: aborts and stray cancellations."""

from __future__ import annotations

import anyio
import anyio.lowlevel


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
