"""An httpx transport that runs model requests under lovely-coordinator permits.

:class:`CoordinatedTransport` maps each request to its ``(provider, model)`` tuple, holds a
permit for it until the response body is closed (streams included), and reports provider
limits to a :class:`~lovely_coordinator_limits.ProviderLimitHandler`, which closes the
tuple's gate until the provider's requested wait has passed.

It is built on ``httpx2``, the HTTP client of current openai and anthropic SDKs; the same
transport for clients of the older ``httpx`` is in :mod:`lovely_coordinator_httpx.legacy`.
"""

from ._transport import CoordinatedTransport as CoordinatedTransport
from ._tuples import DEFAULT_PROVIDERS as DEFAULT_PROVIDERS
from ._tuples import RequestLike as RequestLike
from ._tuples import TupleFor as TupleFor
from ._tuples import tuple_for_request as tuple_for_request

__all__ = [
    "CoordinatedTransport",
    "DEFAULT_PROVIDERS",
    "RequestLike",
    "TupleFor",
    "tuple_for_request",
]
