from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpu_share.observability.logging import configure_logging


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_with_extras_and_exceptions() -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    log = logging.getLogger("gpu_share.test")
    log.debug("hidden")
    log.info("allocated %d units", 3, extra={"device": "NPU-1", "level": "clash"})
    try:
        raise ValueError("bad")
    except ValueError:
        log.error("failed", exc_info=True)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["msg"] == "allocated 3 units" and first["level"] == "info"
    assert first["logger"] == "gpu_share.test" and first["device"] == "NPU-1"
    assert first["ts"].endswith("Z") and first["extra_level"] == "clash"
    assert second["level"] == "error" and "ValueError: bad" in second["exc"]


def test_text_format_and_reconfigure_replaces_handler() -> None:
    first = io.StringIO()
    configure_logging("debug", "json", stream=first)
    out = io.StringIO()
    configure_logging("debug", "text", stream=out)
    logging.getLogger("x").debug("hello world", extra={"device": "NPU-1", "why": "a b"})
    assert first.getvalue() == ""
    line = out.getvalue().strip()
    assert " DEBUG " in line and "x: hello world" in line
    assert 'device=NPU-1 why="a b"' in line


def test_rejects_unknown_level_or_format() -> None:
    with pytest.raises(ValueError):
        configure_logging("verbose", "json")
    with pytest.raises(ValueError):
        configure_logging("info", "xml")
