"""Strict JSON request bodies for the HTTP front-ends (extender, webhook): UTF-8, no
NaN/Infinity, bounded nesting; every failure is one short reason that quotes no more
than ``REASON_LIMIT`` characters of the parser's message (never the body itself)."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from gpu_share.errors import InputError
from gpu_share.observability.http import REASON_LIMIT


class BadJson(InputError):
    """The body is not strict JSON; ``str(e)`` is the short reason."""


def _reject_constant(name: str) -> Any:
    raise BadJson(f"{name} is not valid JSON")


def parse_json(body: bytes, max_depth: int | None) -> Any:
    """The body's value, or ``BadJson``. ``max_depth`` None: only the parser's own guard
    (for a caller that bounds the depth of what it echoes itself)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadJson("body is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except BadJson:
        raise
    except RecursionError:  # the C parser's own guard, far deeper than max_depth
        limit = f"deeper than {max_depth} levels" if max_depth else "too deeply"
        raise BadJson(f"JSON nested {limit}") from None
    except ValueError as e:  # JSONDecodeError, or an integer over the digit limit
        raise BadJson(f"bad JSON: {str(e)[:REASON_LIMIT]}") from None
    # After parsing, so every string is terminated and the scan is linear.
    if max_depth is not None and _depth_over(text, max_depth):
        raise BadJson(f"JSON nested deeper than {max_depth} levels")
    return value


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _depth_over(text: str, limit: int) -> bool:
    """Whether the brackets of valid JSON ``text`` (outside strings) nest deeper than
    ``limit``, so no answer echoing part of a request nests deeper than the encoder can
    go. ``text`` must have parsed: on an unterminated string the regex is quadratic."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return any(d > limit for d in accumulate(map(_STEP.__getitem__, brackets)))
