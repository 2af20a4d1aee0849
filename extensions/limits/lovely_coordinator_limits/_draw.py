"""Draw: what one admitted model request took from its tuple's budget, as the handler sees it.

A coordinator's ``request()`` admits a call and draws its estimate from the tuple's budget;
the :class:`Draw` the handler keeps for it remembers what this process had drawn in all at
that moment (its marks, for the share estimate of ``_share``) and keeps both books — the
coordinator's budget and the handler's estimate — in step when the charge changes: settled
from the usage the response reports, or given back when the provider refused the call.

Layers stacked on one call (a pydantic-ai model over an httpx transport) share one
``ModelRequest`` (the coordinator joins them) and so one :class:`Draw`: the first layer to
track the request *owns* it (it ends it, and it alone retries the call); the layers below
settle it and learn from its headers.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, final

from lovely_coordinator import ModelTuple

from ._learn import BudgetLearner, Marks

__all__ = ["Draw", "ModelRequestLike"]

# The most a coordinator's budget counts (its ``settle`` refuses more). A provider that
# reports more usage than that reports garbage; it is charged this much rather than
# failing the call that read it.
_MOST_TOKENS = 2**53


class ModelRequestLike(Protocol):
    """The part of ``lovely_coordinator.ModelRequest`` a draw uses."""

    @property
    def tuple(self) -> ModelTuple: ...

    @property
    def acceptance_order(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    def settle(self, tokens: int) -> None: ...


@final
class Draw:
    """One admitted request's charge (created by ``ProviderLimitHandler.track``).

    Attributes:
        request: the coordinator's model request.
        marks: what this process had drawn in all when it was admitted, itself included.
        started_at: when it was admitted (on the coordinator's clock).
    """

    __slots__ = ("_charged", "_learner", "_lock", "_refused", "marks", "request", "started_at")

    def __init__(
        self,
        request: ModelRequestLike,
        learner: BudgetLearner,
        started_at: float,
        lock: AbstractContextManager[object] | None = None,
    ):
        self.request = request
        self.started_at = started_at
        self._learner = learner
        # The handler's lock: the learner is shared by every call of the tuple, which
        # may settle from any thread (a sync client's, a finalizer's).
        self._lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        self._charged = request.tokens
        self._refused = False
        self.marks: Marks = learner.draw(self._charged)

    @property
    def tuple(self) -> ModelTuple:
        """The model tuple the call goes to."""
        return self.request.tuple

    @property
    def charged(self) -> int:
        """The tokens it is charged now."""
        return self._charged

    def settle(self, tokens: int) -> None:
        """The call used ``tokens`` (from its usage): charge that instead of the estimate.

        A count above 2**53, more than a budget counts, is charged as 2**53.

        Raises:
            InvalidArgumentError: ``tokens`` is not an int ≥ 0 (nothing changed).
        """
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > _MOST_TOKENS:
            tokens = _MOST_TOKENS
        with self._lock:
            self.request.settle(tokens)
            self._learner.tokens.adjust(tokens - self._charged)
            self._charged = tokens

    def refused(self) -> None:
        """The provider refused the call (a 429): it cost nothing there. Idempotent.

        Its tokens go back to the budget; the request it counted stays counted by the
        coordinator (what was drawn stays spent), but not in this process's share.
        """
        with self._lock:
            if self._refused:
                return
            self._refused = True
            self.settle(0)
            self._learner.requests.adjust(-1)
