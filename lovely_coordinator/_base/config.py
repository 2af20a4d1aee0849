"""Validated configuration (pydantic is used here, never on the hot path).

:class:`ValidatedConfig` is the one base of every configuration model of the library. It
turns pydantic's ``ValidationError`` into the library's own error (carrying pydantic's
details) on *every* entry point that validates: the constructor, ``model_validate``,
``model_validate_json``, ``model_validate_strings`` and ``model_copy(update=...)``, which
pydantic itself does not validate at all. (``model_construct`` skips validation by
design; whoever consumes a config re-checks its values, see ``AgentCoordinator``.)

Field types follow the library's one rule for numbers (``_validate.py``): integers are
any ``int`` but ``bool`` or anything ``operator.index`` accepts (``numpy.int64``), seconds
any real number; both are stored as plain ``int`` / ``float``.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import operator
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)

from .errors import InvalidArgumentError
from .types import ModelTuple, as_model_tuple

__all__ = [
    "CoordinatorConfig",
    "NonNegativeIndex",
    "PositiveIndex",
    "PositiveSeconds",
    "ReacquireOrder",
    "ValidatedConfig",
]

ReacquireOrder = Literal["fresh", "original"]


def _from_strings(info: ValidationInfo) -> bool:
    # pydantic-core types ``mode`` as "python" | "json", but model_validate_strings runs
    # with "string".
    mode: object = getattr(info, "mode", None)
    return mode == "string"


def _plain_index(value: object, info: ValidationInfo) -> object:
    # numpy.int64 and friends are integers by operator.index but not int subclasses, so
    # pydantic's strict int would refuse them; hand it a plain int instead. Everything
    # else (bool, str, float, ...) goes on to pydantic's own strict check and message,
    # except a string given to model_validate_strings, which is parsed here (a before-
    # validator's result reaches pydantic's check as a plain Python value).
    if isinstance(value, str) and _from_strings(info):
        with contextlib.suppress(ValueError):
            return int(value)
        return value
    if type(value) is int or isinstance(value, (bool, str, bytes, float)):
        return value
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return value


def _plain_seconds(value: object, info: ValidationInfo) -> object:
    # Any real number is a number of seconds (Fraction, numpy floats); bool is not.
    if isinstance(value, str) and _from_strings(info):
        with contextlib.suppress(ValueError):
            return float(value)
        return value
    if isinstance(value, (bool, int, float)) or not isinstance(value, numbers.Real):
        return value
    try:
        return float(value)
    except (OverflowError, ValueError):
        return value


PositiveIndex = Annotated[int, BeforeValidator(_plain_index), Field(strict=True, ge=1)]
NonNegativeIndex = Annotated[int, BeforeValidator(_plain_index), Field(strict=True, ge=0)]
PositiveSeconds = Annotated[
    float, BeforeValidator(_plain_seconds), Field(strict=True, gt=0, allow_inf_nan=False)
]


class ValidatedConfig(BaseModel):
    """A frozen pydantic model whose every validation error is the library's own.

    Subclasses name their error class and the label its message starts with.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    _error_class: ClassVar[type[InvalidArgumentError]] = InvalidArgumentError
    _label: ClassVar[str] = "config"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self._invalid(exc) from exc

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise cls._invalid(exc) from exc

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise cls._invalid(exc) from exc

    @classmethod
    def model_validate_strings(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        # pydantic hands a model with its own __init__ (ours, which wraps the errors) the
        # raw input, so the strings would meet the strict python-mode checks there. Parse
        # them with a twin model without that __init__, then validate the values.
        try:
            parsed = _strings_twin(cls).model_validate_strings(obj, *args, **kwargs)
        except ValidationError as exc:
            raise cls._invalid(exc) from exc
        return cls.model_validate(dict(parsed))

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Self:
        """A copy; with ``update``, the updated values are validated like a new config."""
        if not update:
            return super().model_copy(deep=deep)
        return self.model_validate({**dict(self), **dict(update)})

    @classmethod
    def _invalid(cls, exc: ValidationError) -> InvalidArgumentError:
        details = exc.errors(include_url=False)
        # model_validate*() run __init__ (pydantic calls a custom __init__), which already
        # turned pydantic's error into ours; pydantic then wraps that one as a
        # "value_error". Unwrap it rather than nest it.
        if len(details) == 1 and not details[0]["loc"]:
            nested = details[0].get("ctx", {}).get("error")
            if isinstance(nested, InvalidArgumentError):
                return cls._error_class(str(nested), errors=nested.errors)
        parts = "; ".join(
            f"{'.'.join(str(p) for p in d['loc']) or 'config'}: {d['msg']}" for d in details
        )
        return cls._error_class(f"Invalid {cls._label}: {parts}", errors=details)


@functools.cache
def _strings_twin(cls: type[ValidatedConfig]) -> type[BaseModel]:
    """A plain model with ``cls``'s fields, for parsing strings (see above)."""
    fields: dict[str, Any] = {
        name: (field.annotation, field) for name, field in cls.model_fields.items()
    }
    return create_model(f"{cls.__name__}Strings", __config__=cls.model_config, **fields)


class CoordinatorConfig(ValidatedConfig):
    """How a coordinator schedules. Frozen and validated on construction.

    Attributes:
        max_concurrency: the global cap on granted permits (an int ≥ 1).
        tuple_limits: an optional cap per model tuple, on top of the global one.
        reacquire: which acceptance order a lending permit takes its slot back with:
            ``"fresh"`` (a new order, behind all work accepted meanwhile — the upstream
            rule) or ``"original"`` (its own order, ahead of later work).
        max_queued: how many waiters may queue at once (an int ≥ 0), or None for no
            bound. A request that would have to wait while that many already wait is
            refused with :class:`CoordinatorBusyError`; reacquires of lent permits are
            never refused.

    Raises:
        InvalidArgumentError: any field is invalid; ``errors`` carries pydantic's details.
    """

    _label: ClassVar[str] = "coordinator config"

    max_concurrency: PositiveIndex = 4
    tuple_limits: dict[ModelTuple, PositiveIndex] = Field(default_factory=dict)
    reacquire: ReacquireOrder = "fresh"
    max_queued: NonNegativeIndex | None = None

    def __init__(self, **data: Any) -> None:
        # Declared here (not only on the base) so type checkers take ``**data`` as the
        # signature rather than one synthesized from the fields: plain pairs are valid
        # tuple_limits keys, and wrong values are ours to refuse at run time.
        super().__init__(**data)

    @field_validator("tuple_limits", mode="before")
    @classmethod
    def _tuples(cls, value: object) -> object:
        # Accept plain ("provider", "model") pairs as keys and check them with the
        # same rule (and message) as everywhere else.
        if isinstance(value, dict):
            return {as_model_tuple(k): v for k, v in value.items()}
        return value
