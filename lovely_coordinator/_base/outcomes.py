"""How lanes and turns read the outcome of user code: what stops the program, what failed.

Both run user bodies that may raise anything. Two questions decide what they do with it,
and they must get the same answer in both places: does the outcome carry a request to stop
the program (never contained: it is re-raised after the bookkeeping), and what is left of
it once the cancellations are taken out (a body cancelled from outside did not fail).
"""

from __future__ import annotations

from typing import Final

import anyio

__all__ = ["failures_of", "is_fatal"]

# What a user body may raise but no runner may swallow.
_FATAL: Final = (KeyboardInterrupt, SystemExit)


def is_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` is (or carries) ``KeyboardInterrupt`` or ``SystemExit``."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(_FATAL) is not None
    return isinstance(exc, _FATAL)


def failures_of(exc: BaseException) -> BaseException | None:
    """``exc`` without its cancellations: None if it is nothing but cancellations.

    Only the running backend's cancellation class counts (call it inside the event loop).
    """
    cancelled = anyio.get_cancelled_exc_class()
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(cancelled)[1]
    return None if isinstance(exc, cancelled) else exc
