"""Who runs next in each conversation: the synchronous core of the turn queues.

A conversation is *busy* from the moment a turn is admitted for it until its last turn
ends; only busy conversations are stored, so memory follows the number of conversations
with work, never the number ever seen. A busy conversation has exactly one *current*
item (the turn its runner is taking: acquiring the lease, running, or releasing) and a
FIFO of *pending* items behind it.

Every method here is synchronous and either changes the state completely or raises
before changing anything. Because lookup and change happen in one step with no await in
between, a submission can never race the forgetting of an idle conversation (the bug of
the Go original, where a submit that looked a queue up just before it was forgotten
started a second runner for the same conversation).

Items are opaque. The caller (the async registry) keeps its own per-item flags, such as
"dropped"; a dropped item stays pending, counting against ``max_queued`` and in later
positions, until :meth:`TurnTable.advance` reaches it and the caller skips it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar, final, get_args

from .._base.errors import (
    ConversationBusyError,
    DrainingError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    QueueFullError,
)
from .._base.validate import as_index

__all__ = [
    "Admission",
    "MULTITASK_MODES",
    "Multitask",
    "TurnStatistics",
    "TurnTable",
    "check_conversation_id",
    "check_max_queued",
    "check_multitask",
]

T = TypeVar("T")

Multitask = Literal["enqueue", "reject", "interrupt", "replace_queued"]
"""A double-texting mode: what ``submit``/``run`` do when the conversation is busy."""
MULTITASK_MODES: Final[tuple[Multitask, ...]] = get_args(Multitask)


@final
@dataclass(frozen=True, slots=True)
class TurnStatistics:
    """A snapshot of a :class:`~lovely_coordinator.turns.TurnRegistry`.

    Attributes:
        conversations: conversations with a running or waiting turn.
        running: turns that have started and are not done: the turn at the head of each
            busy conversation, from its start (lease acquisition included) until it is
            done (lease release included). A busy conversation has exactly one, so today
            this equals ``conversations``.
        waiting: turns queued behind a running one, dropped ones not yet reached
            included (they hold their place until then), as :meth:`waiting` counts them.
        draining: whether the registry refuses new turns (after ``drain()``, or once
            its block was left).
    """

    conversations: int
    running: int
    waiting: int
    draining: bool


@final
@dataclass(frozen=True, slots=True)
class Admission(Generic[T]):
    """What :meth:`TurnTable.admit` decided; the caller carries out the side effects.

    Attributes:
        position: 0 when the item became current (the caller must start a runner for the
            conversation), else its 1-based place among the pending items.
        interrupted: the current item to cancel (``multitask="interrupt"``), if any.
        dropped: pending items removed by ``interrupt``/``replace_queued``, in queue order;
            they will never be reached and must be finished as dropped now.
    """

    position: int
    interrupted: T | None = None
    dropped: tuple[T, ...] = ()


_NOTHING_PENDING: Final[tuple[()]] = ()


@final
class _Conversation(Generic[T]):
    __slots__ = ("current", "pending")

    def __init__(self, current: T) -> None:
        self.current = current
        # Most conversations never queue a turn, and an empty deque costs ~600 bytes:
        # it is made on the first wait.
        self.pending: deque[T] | tuple[()] = _NOTHING_PENDING


def check_max_queued(value: object) -> int:
    """Validate ``max_queued``: an int ≥ 0 by the library's one rule (not ``bool``)."""
    return as_index(value, "max_queued must be a nonnegative integer", minimum=0)


def check_conversation_id(value: object) -> str:
    """Validate a conversation id: a nonempty ``str``."""
    if not isinstance(value, str):
        raise InvalidArgumentTypeError("conversation_id must be a nonempty string")
    if not value:
        raise InvalidArgumentError("conversation_id must be a nonempty string")
    return value


def check_multitask(value: object) -> Multitask:
    """Validate a double-texting mode."""
    for mode in MULTITASK_MODES:
        if value == mode and isinstance(value, str):
            return mode
    raise InvalidArgumentError(
        "multitask must be one of 'enqueue', 'reject', 'interrupt', 'replace_queued'"
    )


@final
class TurnTable(Generic[T]):
    """The turn queues of every busy conversation of one registry.

    Invariants (checked by :meth:`check_invariants`):
        * a conversation is stored iff it is busy, i.e. it has a current item;
        * ``len(pending) <= max_queued`` for every stored conversation, and ``pending`` is
          either the shared empty tuple or a nonempty deque;
        * ``_waiting`` is the total number of pending items;
        * no item appears twice anywhere in the table;
        * once ``draining`` is set it stays set, and :meth:`admit` admits nothing.
    """

    __slots__ = ("_conversations", "_draining", "_waiting", "max_queued")

    def __init__(self, max_queued: int) -> None:
        self.max_queued = check_max_queued(max_queued)
        self._draining = False
        self._waiting = 0  # pending items over all conversations, for statistics()
        self._conversations: dict[str, _Conversation[T]] = {}

    @property
    def draining(self) -> bool:
        """Set by :meth:`drain`; from then on :meth:`admit` refuses everything."""
        return self._draining

    def drain(self) -> None:
        """Refuse every later admission (idempotent; there is no way back)."""
        self._draining = True

    def statistics(self) -> TurnStatistics:
        """Counts of busy conversations, their current and pending items, and draining."""
        busy = len(self._conversations)
        return TurnStatistics(busy, busy, self._waiting, self._draining)

    def __len__(self) -> int:
        """The number of busy conversations."""
        return len(self._conversations)

    def busy(self) -> tuple[str, ...]:
        """The busy conversations, oldest first."""
        return tuple(self._conversations)

    def current(self, conversation_id: str) -> T | None:
        """The item whose turn the conversation is taking, or None when idle."""
        conversation = self._conversations.get(conversation_id)
        return None if conversation is None else conversation.current

    def pending(self, conversation_id: str) -> tuple[T, ...]:
        """The items waiting behind the current one, in order."""
        conversation = self._conversations.get(conversation_id)
        return () if conversation is None else tuple(conversation.pending)

    def waiting(self, conversation_id: str) -> int:
        """How many items wait (dropped ones included until they are reached)."""
        conversation = self._conversations.get(conversation_id)
        return 0 if conversation is None else len(conversation.pending)

    def admit(self, conversation_id: str, item: T, multitask: Multitask) -> Admission[T]:
        """Admit ``item`` for the conversation according to the double-texting mode.

        ``enqueue`` starts the item if the conversation is idle, else queues it at the
        tail. ``reject`` only ever starts it. ``interrupt`` also asks for the current item
        to be cancelled, and ``interrupt``/``replace_queued`` first drop every pending item,
        so the new one is next.

        Raises:
            DrainingError: after :attr:`draining` was set.
            ConversationBusyError: ``reject`` while an item is current or pending.
            QueueFullError: the item would have to wait and ``max_queued`` items already
                wait (after the drop, for ``interrupt``/``replace_queued``).
        """
        if self._draining:
            raise DrainingError
        conversation = self._conversations.get(conversation_id)
        if conversation is None:
            self._conversations[conversation_id] = _Conversation(item)
            return Admission(position=0)
        if multitask == "reject":
            raise ConversationBusyError
        replacing = multitask in ("interrupt", "replace_queued")
        already_waiting = 0 if replacing else len(conversation.pending)
        if already_waiting >= self.max_queued:
            raise QueueFullError
        # From here on nothing can fail: the state changes completely.
        dropped: tuple[T, ...] = tuple(conversation.pending) if replacing else ()
        self._waiting += 1 - len(dropped)
        if replacing or not conversation.pending:
            conversation.pending = deque((item,))
        else:
            assert isinstance(conversation.pending, deque)
            conversation.pending.append(item)
        interrupted = conversation.current if multitask == "interrupt" else None
        return Admission(len(conversation.pending), interrupted, dropped)

    def advance(self, conversation_id: str, finished: T) -> T | None:
        """End the current item's turn and make the next pending item current.

        Returns the new current item, or None when nothing waited: the conversation is
        then idle and forgotten, in the same step.
        """
        conversation = self._conversations[conversation_id]
        assert conversation.current is finished, "only the current item's turn can end"
        pending = conversation.pending
        if not pending:
            del self._conversations[conversation_id]
            if not self._conversations:
                # A dict never shrinks; a fresh one gives a burst's capacity back.
                self._conversations = {}
            return None
        assert isinstance(pending, deque)
        conversation.current = pending.popleft()
        self._waiting -= 1
        if not pending:
            conversation.pending = _NOTHING_PENDING
        return conversation.current

    def forget(self, conversation_id: str) -> tuple[T, ...]:
        """Remove a conversation outright (shutdown); returns its current then pending items."""
        conversation = self._conversations.pop(conversation_id, None)
        if conversation is None:
            return ()
        self._waiting -= len(conversation.pending)
        return (conversation.current, *conversation.pending)

    def check_invariants(self) -> None:
        """Assert the invariants in the class docstring (used by the tests; a pure read)."""
        seen: set[int] = set()
        assert self._waiting == sum(len(c.pending) for c in self._conversations.values())
        for conversation in self._conversations.values():
            assert len(conversation.pending) <= self.max_queued
            assert conversation.pending is _NOTHING_PENDING or (
                isinstance(conversation.pending, deque) and conversation.pending
            )
            for item in (conversation.current, *conversation.pending):
                assert id(item) not in seen, "an item is in the table twice"
                seen.add(id(item))
