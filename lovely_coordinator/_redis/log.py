"""The Redis primitives' logger, and how they name an error in a log line.

Everything goes to ``lovely_coordinator.redis`` (no handler is installed: the application
decides). Lines name objects (a conversation id, a pool's name, a tuple) and errors, never
what a log entry or a request carries, and never a client's connection settings, which may
hold credentials.
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["describe", "log"]

log: Final = logging.getLogger("lovely_coordinator.redis")


def describe(exc: BaseException) -> str:
    """``Class: message`` (redis-py 8's ``repr`` shows only a category and the class)."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
