"""Validated configuration for a coordinator (pydantic is used here, never on the hot path)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ._errors import InvalidArgumentError
from ._types import ModelTuple, as_model_tuple

__all__ = ["CoordinatorConfig", "ReacquireOrder"]

ReacquireOrder = Literal["fresh", "original"]

_PositiveInt = Annotated[int, Field(strict=True, ge=1)]


class CoordinatorConfig(BaseModel):
    """How a coordinator schedules. Frozen and validated on construction.

    Attributes:
        max_concurrency: the global cap on granted permits (an int ≥ 1).
        tuple_limits: an optional cap per model tuple, on top of the global one.
        reacquire: which acceptance order a lending permit takes its slot back with:
            ``"fresh"`` (a new order, behind all work accepted meanwhile — the upstream
            rule) or ``"original"`` (its own order, ahead of later work).

    Raises:
        InvalidArgumentError: any field is invalid; ``errors`` carries pydantic's details.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=False)

    max_concurrency: _PositiveInt = 4
    tuple_limits: dict[ModelTuple, _PositiveInt] = Field(default_factory=dict)
    reacquire: ReacquireOrder = "fresh"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(exc) from exc

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> CoordinatorConfig:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise _invalid(exc) from exc

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> CoordinatorConfig:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise _invalid(exc) from exc

    @field_validator("tuple_limits", mode="before")
    @classmethod
    def _tuples(cls, value: object) -> object:
        # Accept plain ("provider", "model") pairs as keys and check them with the
        # same rule (and message) as everywhere else.
        if isinstance(value, dict):
            return {as_model_tuple(k): v for k, v in value.items()}
        return value


def _invalid(exc: ValidationError) -> InvalidArgumentError:
    details = exc.errors(include_url=False)
    # model_validate*() run __init__, which already turned pydantic's error into ours;
    # pydantic then wraps that one as a "value_error". Unwrap it rather than nest it.
    if len(details) == 1 and not details[0]["loc"]:
        nested = details[0].get("ctx", {}).get("error")
        if isinstance(nested, InvalidArgumentError):
            return InvalidArgumentError(str(nested), errors=nested.errors)
    parts = "; ".join(
        f"{'.'.join(str(p) for p in d['loc']) or 'config'}: {d['msg']}" for d in details
    )
    return InvalidArgumentError(f"Invalid coordinator config: {parts}", errors=details)
