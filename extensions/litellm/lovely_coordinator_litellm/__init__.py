"""litellm integration for lovely-coordinator.

:func:`install` routes every httpx-based litellm provider (``openai/``, ``anthropic/``
and the others litellm calls over httpx) through coordinated transports: each model
request is one ``coordinator.request()`` within the caps and budgets, 429s are parked
and retried, budgets are learned from the rate-limit headers, usage is settled.
"""

from ._install import Installation as Installation
from ._install import install as install

__all__ = ["Installation", "install"]
