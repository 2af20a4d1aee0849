"""Value types shared by the coordinator's public API.

These are plain immutable values: safe to hash, compare, store and hand between tasks.
Validation happens once, at construction, and raises :class:`InvalidArgumentError`
(or its ``TypeError`` subclass) with the contract's message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Self, runtime_checkable

from .errors import InvalidArgumentError, InvalidArgumentTypeError
from .validate import as_index

if TYPE_CHECKING:
    import anyio

__all__ = [
    "CoordinatorStatistics",
    "ModelTuple",
    "ModelTupleLike",
    "ParentNotification",
    "ResidentAgent",
    "SessionContext",
    "TupleStatistics",
    "as_model_tuple",
]

_TUPLE_MESSAGE = "Model tuple provider and model must be nonempty and contain no NUL bytes"
_DEPTH_MESSAGE = "Managed session depth must be a nonnegative integer"


class _ModelTupleFields(NamedTuple):
    provider: str
    model: str


class ModelTuple(_ModelTupleFields):
    """A ``(provider, model)`` pair: the unit that rate limits and gates apply to.

    It *is* a tuple (a ``NamedTuple``), so it is frozen, hashable and ordered, and
    ``ModelTuple("openai", "gpt-4o") == ("openai", "gpt-4o")``. Wherever the library takes
    a model tuple it also takes a plain pair of strings.

    Raises:
        InvalidArgumentError: a part is empty or contains a NUL byte (a
            :class:`InvalidArgumentTypeError` when a part is not a ``str``).
    """

    __slots__ = ()

    def __new__(cls, provider: str, model: str) -> ModelTuple:
        if not isinstance(provider, str) or not isinstance(model, str):
            raise InvalidArgumentTypeError(_TUPLE_MESSAGE)
        if not provider or not model or "\0" in provider or "\0" in model:
            raise InvalidArgumentError(_TUPLE_MESSAGE)
        return super().__new__(cls, provider, model)

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Self:  # type: ignore[override]
        # NamedTuple builds instances here (also for ``_replace``) without calling
        # ``__new__``; route it through the validation.
        values = tuple(iterable)
        if len(values) != 2:
            raise InvalidArgumentTypeError(_TUPLE_MESSAGE)
        return cls(*values)

    def __repr__(self) -> str:
        return f"ModelTuple({self.provider!r}, {self.model!r})"

    def __str__(self) -> str:
        return f"{self.provider}/{self.model}"


ModelTupleLike = ModelTuple | tuple[str, str]
"""What the API accepts where it needs a model tuple."""


def as_model_tuple(value: ModelTupleLike) -> ModelTuple:
    """Return ``value`` as a validated :class:`ModelTuple` (cheap when it already is one)."""
    if type(value) is ModelTuple:
        return value
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidArgumentTypeError(_TUPLE_MESSAGE)
    return ModelTuple(value[0], value[1])


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a managed agent session may do: its nesting depth and whether it may spawn agents.

    Attributes:
        depth: 0 for a root session, parent depth + 1 for a child.
        allow_agents: whether this session may start sub-agents.
        dispose: set when the session is being disposed (``None`` if it never is).

    Raises:
        InvalidArgumentError: ``depth`` is not an int ≥ 0 (any ``int`` subclass or
            ``operator.index`` value but ``bool``; it is stored as a plain ``int``).
    """

    depth: int
    allow_agents: bool
    dispose: anyio.Event | None = None

    def __post_init__(self) -> None:
        # Any int subclass but bool, numpy's included (CONTRACT §5b), stored as an int.
        object.__setattr__(self, "depth", as_index(self.depth, _DEPTH_MESSAGE, minimum=0))
        if type(self.allow_agents) is not bool:
            raise InvalidArgumentTypeError("Managed session allow_agents must be a bool")


@dataclass(frozen=True, slots=True)
class ParentNotification:
    """A message delivered to a parent agent through a notification route.

    Attributes:
        id: identifies this notification (for deduplication by the receiver).
        task_ref: the child task or agent the notification is about.
        content: the payload, usually the child's result text.
    """

    id: str
    task_ref: str
    content: object


@runtime_checkable
class ResidentAgent(Protocol):
    """An agent that stays resident between inputs and can be reached through the registry.

    A resident may also offer ``input(content, delivery, **options)`` to accept a follow-up
    input; that method is optional, so it is not part of this protocol's required surface.
    Both methods may be plain functions or coroutine functions.
    """

    def stop(self) -> object | Awaitable[object]: ...

    def dispose(self) -> object | Awaitable[object]: ...


@dataclass(frozen=True, slots=True)
class TupleStatistics:
    """A snapshot of one model tuple's scheduling state.

    Attributes:
        tuple: the model tuple.
        active: slots taken on it: permits granted and not yet released (lent ones
            excluded) and model requests on a slot of their own.
        queued: waiters on it (eligible, inactive reservations, gated, capped, budgeted
            and reacquiring).
        limit: its per-tuple cap, or ``None``.
        open: whether its gate is open.
        reopens_at: the anyio clock time its gate reopens by itself, or ``None``.
        requests_available: requests its budget holds now (may be negative: a debt), or
            ``None`` without a requests budget.
        tokens_available: tokens its budget holds now, or ``None`` without a tokens budget.
        reopens_in: seconds until its gate reopens by itself, or ``None``.
        lent: its permits currently lent (their slot given back while their holder waits),
            reacquiring ones included.
    """

    tuple: ModelTuple
    active: int
    queued: int
    limit: int | None
    open: bool
    reopens_at: float | None
    requests_available: float | None = None
    tokens_available: float | None = None
    reopens_in: float | None = None
    lent: int = 0


@dataclass(frozen=True, slots=True)
class CoordinatorStatistics:
    """A snapshot of a coordinator's state, returned by ``statistics()`` and ``watch()``.

    Attributes:
        max_concurrency: the global cap.
        active: granted slots (granted but unrun reservations included, lent permits excluded).
        queued: every waiter, whatever it waits for.
        lent: permits currently lent (their slot given back while their holder waits).
        residents: bound resident agents.
        tuples: one entry per tuple that is closed, capped, budgeted, or has active,
            queued or lent work, sorted by tuple.
    """

    max_concurrency: int
    active: int
    queued: int
    lent: int
    residents: int
    tuples: tuple[TupleStatistics, ...]
