"""The one place the library touches ``contextvars-extras``.

The package is frozen upstream, so every use goes through this module: swapping it for
the standard library's ``contextvars`` is an edit here and nowhere else.
"""

from __future__ import annotations

__all__: list[str] = []
