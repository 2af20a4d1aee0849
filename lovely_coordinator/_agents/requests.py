"""Model requests: one call to a provider, admitted by ``AgentCoordinator.request`` (§5).

A request is a ticket of its own in the scheduler (``RequestTicket``): it waits for the
gate, the budget and a slot, where the slot may be its task's current permit (see
``scheduler.py``). The request the running code is inside is a context variable, shared
by every copy of the library (``permits.py``), so that a request entered again by the
same task (an SDK call inside a framework's coordinated request) joins it instead of
counting the call twice. Child tasks never join: that would bypass the cap.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Final, final

import anyio.lowlevel

from .._base.backend import current_task
from .._base.errors import UsageError
from .._base.process_wide import process_wide
from .._base.types import ModelTuple
from .._base.validate import as_index
from . import admission as _admission
from .permits import CONTEXT_VERSION, find_permit, restore
from .tickets import GRANTED, RequestTicket

if TYPE_CHECKING:
    from .core import CoordinatorCore

__all__ = ["MAX_TOKENS", "TOKENS_MESSAGE", "ModelRequest", "RequestContext", "as_tokens"]

TOKENS_MESSAGE: Final = "tokens must be a nonnegative integer"
# Buckets count in floats: above 2**53 a charge is no longer exact, and far above it
# no longer representable (an OverflowError in the middle of a grant).
MAX_TOKENS: Final = 2**53


def as_tokens(value: object) -> int:
    """A token count: an int in ``[0, MAX_TOKENS]``."""
    return as_index(value, TOKENS_MESSAGE, minimum=0, maximum=MAX_TOKENS)


# (request, its coordinator, the task that entered it, the enclosing frame).
RequestFrame = tuple["ModelRequest", object, object, "RequestFrame | None"]

current_request_var: ContextVar[RequestFrame | None] = process_wide(
    "current request",
    CONTEXT_VERSION,
    lambda: ContextVar("lovely_coordinator_request", default=None),
)


@final
class ModelRequest:
    """One call to a provider, admitted by ``AgentCoordinator.request`` (CONTRACT §5).

    Attributes:
        tuple: the model tuple the call goes to.
        acceptance_order: the order it was admitted with.
        tokens: its current token charge: the estimate it was admitted with, or what it
            was last settled at.
    """

    __slots__ = ("_coordinator", "_order", "_outer", "_settled", "_ticket")

    def __init__(
        self,
        coordinator: CoordinatorCore,
        ticket: RequestTicket,
        outer: _admission.Admitted | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._outer = outer  # its admission by a fleet (see _agents/admission.py)
        self._ticket = ticket
        self._order = ticket.accepted
        self._settled = 0  # its largest settlement so far (for instruments' token counts)

    def __repr__(self) -> str:
        return f"<ModelRequest {self.tuple} order={self._order} tokens={self.tokens}>"

    @property
    def tuple(self) -> ModelTuple:
        return self._ticket.tuple_state.tuple

    @property
    def acceptance_order(self) -> int:
        return self._order

    @property
    def tokens(self) -> int:
        return self._ticket.tokens

    def settle(self, tokens: int) -> None:
        """The call's real usage replaces its charge: the difference is refunded or
        charged to the tuple's token budget at once. May be called again; the last value
        counts. (A bucket may go below zero; later requests then wait longer.)

        Raises:
            InvalidArgumentError: ``tokens`` is not an int in [0, 2**53] (nothing changed).
        """
        value = as_tokens(tokens)
        increase = value - self._settled if value > self._settled else 0
        self._coordinator._settle(self._ticket, value, increase)
        if self._outer is not None:
            self._outer.settle(value)
        if increase:
            self._settled = value


@final
class RequestContext(RequestTicket):
    """What ``AgentCoordinator.request`` returns: ``async with`` it around one call.

    It *is* the request's ticket, and the ticket is its own parker: one object per call
    (the :class:`ModelRequest` handle is made only once the call is admitted).
    """

    __slots__ = (
        "_coordinator",
        "_current",
        "_entered",
        "_frame",
        "_joined",
        "_order",
        "_request",
        "_t",
        "_token",
    )

    def __init__(
        self,
        coordinator: CoordinatorCore,
        t: ModelTuple,
        tokens: int,
        order: int | None,
        reject: bool,
        current: bool = True,
    ) -> None:
        RequestTicket.__init__(self, reject, tokens)
        self._coordinator = coordinator
        self._current = current
        self._t = t
        self._order = order
        self._entered = False
        self._joined = False
        self._request: ModelRequest | None = None
        self._frame: RequestFrame | None = None
        self._token: Token[RequestFrame | None] | None = None

    async def __aenter__(self) -> ModelRequest:
        if self._entered:
            raise UsageError("a request() context manager can be entered only once")
        self._entered = True
        coordinator = self._coordinator
        await anyio.lowlevel.checkpoint_if_cancelled()
        task = current_task()
        frame = current_request_var.get()
        while frame is not None:
            outer = frame[0]
            if (
                frame[1] is coordinator
                and frame[2] is task
                and outer._ticket.state == GRANTED
                and outer.tuple == self._t
            ):
                # The same task, inside a request of the same call: it is that call.
                self._joined = True
                self._request = outer
                await anyio.lowlevel.cancel_shielded_checkpoint()
                return outer
            frame = frame[3]
        outside, order = await _admission.admit(
            coordinator, self._t, self.tokens, self._order, self.reject
        )
        try:
            permit = find_permit(coordinator)
            cover = None if permit is None else permit._ticket
            coordinator._enqueue_request(self, self._t, order, cover)
            # Parker.wait, inlined: one coroutine frame less per parked waiter.
            lock = coordinator._lock
            try:
                await self.sleep(lock)
            except BaseException:
                self.cancelled(coordinator, self, lock)
                raise
            self.outcome()
        except BaseException:
            if outside is not None:
                outside.release(used=False)
            raise
        request = self._request = ModelRequest(coordinator, self, outside)
        if self._current:
            frame = self._frame = (request, coordinator, task, current_request_var.get())
            self._token = current_request_var.set(frame)
        return request

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        request = self._request
        assert request is not None
        if self._joined:
            self._request = None
            return
        frame, token = self._frame, self._token
        # (the handle and the frame refer back to this object: no cycle outlives the call)
        self._request = self._frame = self._token = None
        try:
            if token is not None:
                assert frame is not None
                restore(current_request_var, frame, token)
        finally:
            if self.state == GRANTED:
                self._coordinator._release(self)
            if request._outer is not None:
                request._outer.release(used=True)  # never waits (sent in the background)
