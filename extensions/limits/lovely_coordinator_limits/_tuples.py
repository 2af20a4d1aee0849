"""Model tuple arguments: the coordinator's own helpers, re-exported.

``lovely_coordinator`` exports ``ModelTupleLike`` and ``as_model_tuple``; this package
re-exports them under its own name for code written against earlier releases of it, so
a tuple is validated by one rule with one message everywhere.
"""

from __future__ import annotations

from lovely_coordinator import ModelTupleLike as ModelTupleLike
from lovely_coordinator import as_model_tuple as as_model_tuple

__all__ = ["ModelTupleLike", "as_model_tuple"]
