from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.served_agent import scratch_dir


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh dir under /tmp with an empty ``dp``, removed afterwards."""
    with scratch_dir() as d:
        yield d
