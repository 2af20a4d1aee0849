"""The coordinator's process-wide registries: residents, notification routes, session contexts.

Every copy of the library in a process reaches the same coordinator, so these maps are
where one extension instance finds what another one bound: the live runtime of a task
(a *resident*), the function that delivers a notification into a parent's conversation
(a *route*), and the depth and permissions of a managed session (a *session context*).

Each ``bind_*`` returns an unbind function that removes *its own* binding and nothing
else. Binding is by token, not by value: every bind stores a fresh :class:`_Binding`, and
its unbind deletes the key only while that very token is still stored. So a stale unbind
(from an instance that was replaced, or a duplicate call) can never remove a newer
binding, even when the newer binding holds the same object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, final

from .._base.errors import InvalidArgumentError, InvalidArgumentTypeError
from .._base.types import ParentNotification, ResidentAgent, SessionContext

__all__ = ["CoordinatorRegistries", "NotificationRoute", "Unbind"]

T = TypeVar("T")

NotificationRoute = Callable[[ParentNotification], object | Awaitable[object]]
"""Delivers a :class:`ParentNotification` into a parent agent; sync or async."""

Unbind = Callable[[], None]
"""Removes the binding it was returned for, if it is still the current one. Idempotent."""

_KEY_MESSAGE = "Coordinator registry keys must be nonempty"


def _check_key(key: object) -> str:
    if type(key) is not str:
        raise InvalidArgumentTypeError(_KEY_MESSAGE)
    if not key:
        raise InvalidArgumentError(_KEY_MESSAGE)
    return key


@final
class _Binding(Generic[T]):
    """One bind call's entry; its identity is what the matching unbind looks for."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


@final
class _Registry(Generic[T]):
    """A map from nonempty string keys to values, with token-checked unbinding.

    Invariant: ``_bindings`` holds at most one binding per key, the one from the most
    recent bind that has not been unbound.
    """

    __slots__ = ("_bindings", "_on_change")

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._bindings: dict[str, _Binding[T]] = {}
        self._on_change = on_change

    def __len__(self) -> int:
        return len(self._bindings)

    def bind(self, key: str, value: T) -> Unbind:
        binding = _Binding(value)
        self._bindings[key] = binding
        self._on_change()

        def unbind() -> None:
            if self._bindings.get(key) is binding:
                del self._bindings[key]
                self._on_change()

        return unbind

    def get(self, key: str) -> T | None:
        binding = self._bindings.get(key)
        return None if binding is None else binding.value


def _unchanged() -> None:
    pass


class CoordinatorRegistries:
    """The three registries (the coordinator's public methods for them).

    All methods are synchronous and never wait. Keys are nonempty strings. Invalid
    arguments raise before anything is stored.

    ``on_change`` runs after every change to the resident registry (the only one
    statistics report): a coordinator passes the hook that publishes its statistics.
    """

    def __init__(self, on_change: Callable[[], None] = _unchanged) -> None:
        self._residents: _Registry[ResidentAgent] = _Registry(on_change)
        self._routes: _Registry[NotificationRoute] = _Registry(_unchanged)
        self._session_contexts: _Registry[SessionContext] = _Registry(_unchanged)

    @property
    def resident_count(self) -> int:
        """How many residents are bound."""
        return len(self._residents)

    def bind_resident(self, key: str, resident: ResidentAgent) -> Unbind:
        """Register ``resident`` (the live runtime of a task) under ``key``, replacing any other.

        Any object is accepted; the :class:`ResidentAgent` protocol describes what callers
        of :meth:`get_resident` will expect of it.

        Returns:
            An unbind function that removes this binding if it is still the current one.

        Raises:
            InvalidArgumentError: ``key`` is empty (an :class:`InvalidArgumentTypeError`
                when it is not a ``str``), or ``resident`` is ``None`` (which
                :meth:`get_resident` uses to mean "absent").
        """
        key = _check_key(key)
        if resident is None:
            raise InvalidArgumentTypeError("A resident agent must not be None")
        return self._residents.bind(key, resident)

    def get_resident(self, key: str) -> ResidentAgent | None:
        """The resident bound under ``key``, or ``None``.

        Raises:
            InvalidArgumentError: ``key`` is empty or not a ``str``.
        """
        return self._residents.get(_check_key(key))

    def bind_notification_route(self, key: str, route: NotificationRoute) -> Unbind:
        """Register ``route`` (sync or async, called with a :class:`ParentNotification`).

        Returns:
            An unbind function that removes this binding if it is still the current one.

        Raises:
            InvalidArgumentError: ``key`` is empty; an :class:`InvalidArgumentTypeError`
                when ``key`` is not a ``str`` or ``route`` is not callable.
        """
        key = _check_key(key)
        if not callable(route):
            raise InvalidArgumentTypeError("A notification route must be callable")
        return self._routes.bind(key, route)

    def get_notification_route(self, key: str) -> NotificationRoute | None:
        """The route bound under ``key``, or ``None``.

        Raises:
            InvalidArgumentError: ``key`` is empty or not a ``str``.
        """
        return self._routes.get(_check_key(key))

    def bind_session_context(self, session_id: str, ctx: SessionContext) -> Unbind:
        """Register the context of the managed session ``session_id``.

        What is stored is a copy equal to ``ctx``; nothing the caller does to its own
        objects afterwards changes it. (``ctx.dispose`` is an event and is shared on
        purpose: setting it is how a session announces its disposal.)

        Returns:
            An unbind function that removes this binding if it is still the current one.

        Raises:
            InvalidArgumentError: ``session_id`` is empty, or the context's depth is not a
                nonnegative integer; an :class:`InvalidArgumentTypeError` when
                ``session_id`` is not a ``str`` or ``ctx`` is not a :class:`SessionContext`.
        """
        session_id = _check_key(session_id)
        if not isinstance(ctx, SessionContext):
            raise InvalidArgumentTypeError("A session context must be a SessionContext")
        # SessionContext is frozen, but object.__setattr__ can still reach it; a fresh,
        # re-validated instance makes the stored value independent of the caller's.
        stored = SessionContext(ctx.depth, ctx.allow_agents, ctx.dispose)
        return self._session_contexts.bind(session_id, stored)

    def get_session_context(self, session_id: str) -> SessionContext | None:
        """The context bound for ``session_id``, or ``None``.

        Raises:
            InvalidArgumentError: ``session_id`` is empty or not a ``str``.
        """
        return self._session_contexts.get(_check_key(session_id))
