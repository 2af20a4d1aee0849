"""Is this failure a provider limit?

A *provider limit* is a refusal that waiting fixes and that applies to everything sent to the
same ``(provider, model)``: a rate limit, an exhausted quota, a billing or usage cap. It is
the signal to close that tuple's gate. Everything else is an ordinary failure of one
request: network errors, timeouts, server errors (5xx), an overloaded service (HTTP 529,
Anthropic's ``overloaded_error``), a prompt that does not fit the context window, bad
credentials.

The rules, strongest first:

1. Exception types of the openai and anthropic SDKs (matched by class name along the MRO,
   so neither SDK needs to be installed): ``RateLimitError`` and ``PaymentRequiredError``
   are limits; the overloaded, server, connection, timeout and authentication errors are not.
2. An HTTP status (``status_code`` on the error, or on its ``response``, as with
   ``httpx.HTTPStatusError``): 429, and 402 (payment required, a billing limit), are
   limits unless the text rules one out (e.g. says the service is overloaded); 408, 401,
   5xx and 529 never are. Other statuses defer to the text, so a 400 "credit balance is
   too low" counts as a billing limit.
3. The text of the error (its message and, for SDK errors, its JSON body):
   a "never" phrase (overloaded, context window, bad API key) wins over a limit phrase
   (quota, billing, usage limit, 429, RESOURCE_EXHAUSTED, rate limit, too many requests);
   a limit phrase wins over incidental noise, so "HTTP 429 after an upstream timeout" is a
   limit. Anything else is not a limit.

An error that none of these decides is judged by its cause (``__cause__``, then
``__context__``); an exception group is a limit when any of its members is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

__all__ = ["is_limit_message", "is_limit_status", "is_provider_limit"]

_LIMIT_TEXT = re.compile(
    r"quota|billing|credit balance|usage[ _-]?limit|\b429\b|resource[ _-]?exhausted"
    r"|rate[ _-]?limit|too[ _-]?many[ _-]?requests",
    re.IGNORECASE,
)
# Phrases that mean waiting will not help, or that the service as a whole is struggling
# rather than refusing this account: they win over any limit phrase in the same text.
_NEVER_TEXT = re.compile(
    r"overloaded|\b529\b|context[ _-]?(?:window|length)|maximum context|prompt is too long"
    r"|(?:invalid|incorrect)[ _-]?(?:x-)?api[ _-]?key|authentication|unauthori[sz]ed",
    re.IGNORECASE,
)

# Anthropic's PaymentRequiredError (402) is a billing limit.
_LIMIT_TYPES = frozenset({"RateLimitError", "PaymentRequiredError"})
# Only types whose meaning is certain; the rest (BadRequestError, PermissionDeniedError, ...)
# fall through to the status and text rules, since a 400 or 403 may well be about billing.
_NEVER_TYPES = frozenset(
    {
        "OverloadedError",
        "InternalServerError",
        "APIConnectionError",
        "APITimeoutError",
        "RequestTimeoutError",
        "AuthenticationError",
        "CredentialsError",
    }
)
# Statuses that are never a limit, whatever the body says: a request timeout, bad
# credentials, and the server-side family (Anthropic's 529 overloaded included).
_NEVER_STATUSES = frozenset({401, 408})
# Statuses that are a limit unless the text rules it out: too many requests, and payment
# required (a billing limit, as Anthropic's PaymentRequiredError says by its type).
_LIMIT_STATUSES = frozenset({402, 429})

# How far to follow __cause__/__context__ before giving up (chains are short in practice;
# the bound also guards against cycles).
_MAX_CHAIN = 8


def is_limit_message(text: str) -> bool:
    """Whether a bare error message describes a provider limit.

    Args:
        text: any error text (case does not matter).

    Returns:
        True when the text names a limit (quota, billing, usage limit, 429,
        RESOURCE_EXHAUSTED, rate limit, too many requests) and nothing that rules one out
        (overloaded, 529, context window, a bad API key).
    """
    return _verdict_from_text(text) is True


def is_limit_status(status: int, text: str = "") -> bool:
    """Whether an HTTP error response is a provider limit.

    Args:
        status: the response's status code.
        text: the response body or error message, if known.

    Returns:
        True for 429 and 402 (unless ``text`` rules it out, e.g. says overloaded), False
        for 401, 408, 5xx and 529, and for other statuses whatever
        :func:`is_limit_message` says about ``text``.
    """
    verdict = _verdict_from_status(status, text)
    if verdict is None:
        return is_limit_message(text)
    return verdict


def is_provider_limit(error: BaseException | str) -> bool:
    """Whether a failure is a provider limit, the signal to close its tuple's gate.

    Args:
        error: an exception (from the openai or anthropic SDK, httpx, pydantic-ai, or
            anything else) or a bare message.

    Returns:
        True when the rules in this module's docstring say so.
    """
    if isinstance(error, str):
        return is_limit_message(error)
    return _verdict(error, depth=0) is True


def _verdict(error: BaseException, *, depth: int) -> bool | None:
    if isinstance(error, BaseExceptionGroup):
        members = [_verdict(member, depth=depth + 1) for member in error.exceptions]
        if any(members):
            return True
        return False if False in members else None
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & _LIMIT_TYPES:
        # A RateLimitError whose text says "overloaded" is the service struggling, not us.
        return _NEVER_TEXT.search(_text_of(error)) is None
    if names & _NEVER_TYPES:
        return False
    status = _status_of(error)
    text = _text_of(error)
    if status is not None:
        verdict = _verdict_from_status(status, text)
        if verdict is not None:
            return verdict
    verdict = _verdict_from_text(text)
    if verdict is not None:
        return verdict
    if isinstance(error, TimeoutError | ConnectionError):
        return False
    if depth < _MAX_CHAIN:
        cause = error.__cause__ if error.__cause__ is not None else error.__context__
        if cause is not None and cause is not error:
            return _verdict(cause, depth=depth + 1)
    return None


def _verdict_from_status(status: int, text: str) -> bool | None:
    if status in _LIMIT_STATUSES:
        return _NEVER_TEXT.search(text) is None
    if status in _NEVER_STATUSES or status >= 500:
        return False
    return None


def _verdict_from_text(text: str) -> bool | None:
    if _NEVER_TEXT.search(text):
        return False
    if _LIMIT_TEXT.search(text):
        return True
    return None


def _status_of(error: BaseException) -> int | None:
    status = getattr(error, "status_code", None)
    if type(status) is int:
        return status
    status = getattr(getattr(error, "response", None), "status_code", None)
    return status if type(status) is int else None


def _text_of(error: BaseException) -> str:
    return " ".join(_texts_of(error))


def _texts_of(error: BaseException) -> Iterator[str]:
    yield str(error)
    # SDK errors carry the provider's JSON error body; its "type"/"status" fields
    # ("rate_limit_error", "RESOURCE_EXHAUSTED") are often clearer than the message.
    body = getattr(error, "body", None)
    if isinstance(body, str):
        yield body
    elif body is not None:
        try:
            text = json.dumps(body, default=str)
        except ValueError:  # a circular structure: nothing more to learn from it
            return
        yield text
