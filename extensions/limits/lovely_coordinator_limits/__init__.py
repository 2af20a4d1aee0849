"""Provider limits for lovely-coordinator: recognise them, read the wait, close the gate.

- :func:`is_provider_limit` (and :func:`is_limit_message`, :func:`is_limit_status`) tell a
  rate limit, quota or billing cap from an ordinary failure.
- :func:`retry_delay` and the parsers beside it read how long the provider asks to wait.
- :class:`ProviderLimitHandler` closes the ``(provider, model)`` gate of a coordinator for
  that long (or an exponential :class:`Backoff` with jitter) and reopens it half-open.
- :mod:`lovely_coordinator_limits.testing` is a local fake provider for tests.
"""

from ._backoff import Backoff as Backoff
from ._classify import is_limit_message as is_limit_message
from ._classify import is_limit_status as is_limit_status
from ._classify import is_provider_limit as is_provider_limit
from ._delay import delay_from_body as delay_from_body
from ._delay import delay_from_headers as delay_from_headers
from ._delay import parse_duration as parse_duration
from ._delay import parse_retry_after as parse_retry_after
from ._delay import parse_timestamp as parse_timestamp
from ._delay import retry_delay as retry_delay
from ._handler import LimitState as LimitState
from ._handler import ProviderLimitHandler as ProviderLimitHandler
from ._tuples import ModelTupleLike as ModelTupleLike
from ._tuples import as_model_tuple as as_model_tuple

__all__ = [
    "Backoff",
    "LimitState",
    "ModelTupleLike",
    "ProviderLimitHandler",
    "as_model_tuple",
    "delay_from_body",
    "delay_from_headers",
    "is_limit_message",
    "is_limit_status",
    "is_provider_limit",
    "parse_duration",
    "parse_retry_after",
    "parse_timestamp",
    "retry_delay",
]
