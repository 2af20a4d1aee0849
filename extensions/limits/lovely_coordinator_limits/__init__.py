"""Provider limits for lovely-coordinator: recognise them, read the wait, close the gate.

- :func:`is_provider_limit` (and :func:`is_limit_message`, :func:`is_limit_status`) tell a
  rate limit, quota or billing cap from an ordinary failure.
- :func:`retry_delay` and the parsers beside it read how long the provider asks to wait.
- :func:`estimate_tokens` sizes a request before it is sent, :class:`UsageMeter` reads
  what it used from the response as it passes, and :func:`rate_limits_from_headers` what
  the provider says about its budgets.
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
from ._draw import Draw as Draw
from ._draw import ModelRequestLike as ModelRequestLike
from ._estimate import CHARS_PER_TOKEN as CHARS_PER_TOKEN
from ._estimate import Tokenizer as Tokenizer
from ._estimate import estimate_tokens as estimate_tokens
from ._estimate import output_limit as output_limit
from ._estimate import prompt_text as prompt_text
from ._estimate import text_tokens as text_tokens
from ._estimate import tiktoken_tokenizer as tiktoken_tokenizer
from ._handler import LimitState as LimitState
from ._handler import ProviderLimitHandler as ProviderLimitHandler
from ._ratelimit import Limit as Limit
from ._ratelimit import RateLimits as RateLimits
from ._ratelimit import rate_limits_from_headers as rate_limits_from_headers
from ._tuples import ModelTupleLike as ModelTupleLike
from ._tuples import as_model_tuple as as_model_tuple
from ._usage import Usage as Usage
from ._usage import UsageMeter as UsageMeter
from ._usage import usage_from_body as usage_from_body
from ._usage import usage_from_json as usage_from_json

__all__ = [
    "Backoff",
    "CHARS_PER_TOKEN",
    "Draw",
    "Limit",
    "LimitState",
    "ModelRequestLike",
    "ModelTupleLike",
    "ProviderLimitHandler",
    "RateLimits",
    "Tokenizer",
    "Usage",
    "UsageMeter",
    "as_model_tuple",
    "delay_from_body",
    "delay_from_headers",
    "estimate_tokens",
    "is_limit_message",
    "is_limit_status",
    "is_provider_limit",
    "output_limit",
    "parse_duration",
    "parse_retry_after",
    "parse_timestamp",
    "prompt_text",
    "rate_limits_from_headers",
    "retry_delay",
    "text_tokens",
    "tiktoken_tokenizer",
    "usage_from_body",
    "usage_from_json",
]
