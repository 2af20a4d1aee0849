"""Model tuple arguments, validated the way the coordinator does.

``lovely_coordinator`` validates plain pairs inside its own calls but exports no helper for
it, so this module converts them once, up front, with the same errors.
"""

from __future__ import annotations

from lovely_coordinator import InvalidArgumentTypeError, ModelTuple

__all__ = ["ModelTupleLike", "as_model_tuple"]

ModelTupleLike = ModelTuple | tuple[str, str]
"""A :class:`~lovely_coordinator.ModelTuple` or a plain ``(provider, model)`` pair."""

_MESSAGE = "Model tuple provider and model must be nonempty and contain no NUL bytes"


def as_model_tuple(value: ModelTupleLike) -> ModelTuple:
    """Return ``value`` as a :class:`~lovely_coordinator.ModelTuple`.

    Raises:
        InvalidArgumentError: a part is empty or contains a NUL byte
            (``InvalidArgumentTypeError`` when ``value`` is not a pair of strings).
    """
    if isinstance(value, ModelTuple):
        return value
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidArgumentTypeError(_MESSAGE)
    return ModelTuple(value[0], value[1])
