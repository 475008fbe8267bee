"""The one reader of untrusted JSON: checkpoint files, annotations, request bodies.

A document is a strict pydantic model (or ``TypeAdapter``) read by ``read_json``
(text) or ``read_value`` (an already parsed value): no coercion (``"4"`` is not 4,
``true`` is not 1, ``2.0`` is not 2, ``NaN`` and infinities are refused where a field
says so), bounds on every number, string and list, the JSON parser's own depth limit.
A failure raises the caller's error type, naming where it failed and showing a bounded
view of the offending value (never the value whole: it may be 1 MiB of a tenant's
text). Checks that need more than the document (ids this node has, duplicates across
entries) stay with the caller, after the read.

Field types shared by the documents: ``Name`` (a Kubernetes name or uid, at most 253
characters), ``Count`` (an integer in [0, 10^9]), ``Instant`` (a finite number of
seconds); an enum field is ``Annotated[TheEnum, BY_VALUE]`` (its value's text, as JSON
carries it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

T = TypeVar("T")
ErrorFactory = Callable[[str], Exception]

MAX_COUNT = 10**9
MAX_NAME = 253  # Kubernetes names are at most 253 characters
MAX_ITEMS = 1_000_000
SHOWN_CHARS = 80

Name = Annotated[str, Field(max_length=MAX_NAME)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Instant = Annotated[float, Field(allow_inf_nan=False, ge=-1e12, le=1e12)]
BY_VALUE = Field(strict=False)  # an enum read from its value (strict takes members only)


class Document(BaseModel):
    """Base of every untrusted document: strict, immutable, unknown keys ignored (a
    newer writer may add fields; what we read is checked)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore",
                              populate_by_name=False)


def read_json(model: type[T] | TypeAdapter[T], text: str | bytes, what: str,
              error: ErrorFactory) -> T:
    """``text`` parsed and checked as ``model``; ``error(message)`` on anything else."""
    adapter = _adapter(model)
    try:
        return adapter.validate_json(text)
    except ValidationError as exc:
        raise error(f"{what}: {explain(exc)}") from None


def read_value(model: type[T] | TypeAdapter[T], value: Any, what: str,
               error: ErrorFactory) -> T:
    """An already parsed JSON value (``json.loads``) checked as ``model``."""
    adapter = _adapter(model)
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise error(f"{what}: {explain(exc)}") from None


def section(value: Any, where: str, error: ErrorFactory) -> Mapping[str, Any]:
    """An optional object inside a larger document read field by field (a pod spec's
    ``resources``, ``limits``): absent is empty, anything but an object is an error."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(f"{where}: must be an object")
    return value


def explain(exc: ValidationError) -> str:
    """The first problem of a failed read: where, what, and a bounded view of the value
    (how many more there were, when more)."""
    errors = exc.errors(include_url=False, include_context=False)
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"])
    text = f"{loc + ': ' if loc else ''}{first['msg']}"
    if "input" in first and loc and first["type"] != "missing":
        text += f", got {shown(first['input'])}"
    return text + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A bounded repr of an untrusted value (never echo it whole)."""
    if isinstance(value, str | int | float | bool | None):
        text = repr(value)
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(model: type[T] | TypeAdapter[T]) -> TypeAdapter[T]:
    if isinstance(model, TypeAdapter):
        return model
    hit = _ADAPTERS.get(model)
    if hit is None:
        strict = None if isinstance(model, type) and issubclass(model, BaseModel) \
            else ConfigDict(strict=True)
        hit = _ADAPTERS[model] = TypeAdapter(model, config=strict)
    return hit
