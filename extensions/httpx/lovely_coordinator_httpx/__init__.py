"""An httpx transport that sends each model request through ``coordinator.request()``.

:class:`CoordinatedTransport` (and its sync twin :class:`CoordinatedSyncTransport`, for sync
clients in any number of threads) maps each model call to its ``(provider, model)`` tuple and its
token estimate, holds one model request of the coordinator for it until the response body
is closed (streams included), settles it from the usage the body reports, learns the
tuple's budget from the rate-limit headers, and retries 429s after the tuple's gate (closed
by the shared :class:`~lovely_coordinator_limits.ProviderLimitHandler`) reopens.

It is built on ``httpx2``, the HTTP client of current openai and anthropic SDKs; the same
transport for clients of the older ``httpx`` is in :mod:`lovely_coordinator_httpx.legacy`.
"""

from ._transport import CoordinatedSyncTransport as CoordinatedSyncTransport
from ._transport import CoordinatedTransport as CoordinatedTransport
from ._transport import TransportOptions as TransportOptions
from ._tuples import DEFAULT_PROVIDERS as DEFAULT_PROVIDERS
from ._tuples import RequestLike as RequestLike
from ._tuples import TupleFor as TupleFor
from ._tuples import tuple_for_request as tuple_for_request

__all__ = [
    "CoordinatedSyncTransport",
    "CoordinatedTransport",
    "DEFAULT_PROVIDERS",
    "RequestLike",
    "TransportOptions",
    "TupleFor",
    "tuple_for_request",
]
