"""Structured logging: JSON lines (default in the cluster) or text (humans).

Fields passed as ``log.info("msg", extra={"device": uuid})`` become JSON keys (or
``key=value`` pairs in text).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}

_HANDLER_NAME = "gpu-share"
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _timestamp(record: logging.LogRecord) -> str:
    ts = datetime.fromtimestamp(record.created, tz=UTC)
    return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            # Extras never overwrite the four fixed keys.
            out[key if key not in out else f"extra_{key}"] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger: msg key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


def configure_logging(
    level: str = "info", format: str = "json", *, stream: IO[str] | None = None
) -> logging.Handler:
    """Install one handler on the root logger (replacing one installed before).

    ``level``: debug|info|warning|error; ``format``: json|text. Returns the handler.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; one of {', '.join(LEVELS)}")
    if format not in ("json", "text"):
        raise ValueError(f"unknown log format {format!r}; one of json, text")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    return handler
