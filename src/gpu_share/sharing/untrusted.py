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


def read_json(model: type[T] | TypeAdapter[T], text: str | bytes, where: str,
              error: ErrorFactory) -> T:
    """``text`` parsed (at most 200 levels deep: the parser's own limit) and checked as
    ``model``; ``error(message)`` on anything else. ``where`` names the document: the
    root of every path in a message."""
    adapter = _adapter(model)
    try:
        return adapter.validate_json(text)
    except ValidationError as exc:
        raise error(explain(exc, where)) from None


def read_value(model: type[T] | TypeAdapter[T], value: Any, where: str,
               error: ErrorFactory) -> T:
    """An already parsed JSON value (``json.loads``) checked as ``model``."""
    adapter = _adapter(model)
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise error(explain(exc, where)) from None


def section(value: Any, where: str, error: ErrorFactory) -> Mapping[str, Any]:
    """An optional object inside a larger document read field by field (a pod spec's
    ``resources``, ``limits``): absent is empty, anything but an object is an error."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(f"{where}: must be an object")
    return value


# pydantic's error types in our words; "got" then names the JSON kind found.
_KIND_ERRORS = {
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be a list",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "missing": "is required",
}


def explain(exc: ValidationError, where: str = "") -> str:
    """The first problem of a failed read: its path from ``where`` (``Pod.spec.
    containers[1].name``), what is wrong, and a bounded view of the value (and how many
    more problems there were)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    path = where
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else f"{'.' if path else ''}{part}"
    text = _what(first)
    text = f"{path + ': ' if path else ''}{text}"
    return text + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")


def _what(error: Any) -> str:
    """What is wrong, in our words where pydantic's type names would leak."""
    kind = _KIND_ERRORS.get(error["type"])
    most = error.get("ctx", {}).get("max_length")
    if error["type"] in ("string_too_long", "too_long") and most is not None:
        unit = "characters" if error["type"] == "string_too_long" else "items"
        return f"longer than {most} {unit}"
    if kind is not None:
        return kind if error["type"] == "missing" else f"{kind}, got {_json_kind(error['input'])}"
    text = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] != "value_error" and error["loc"]:
        text += f", got {shown(error['input'])}"
    return text


def _json_kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


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
