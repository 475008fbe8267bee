from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

FAKE_PATH = Path(__file__).resolve().parents[1] / "fakes" / "pynvml.py"
_counter = itertools.count()


@pytest.fixture
def fake_nvml() -> Iterator[ModuleType]:
    """A fresh copy of tests/fakes/pynvml.py per test (module state never leaks)."""
    name = f"fake_pynvml_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, FAKE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the fake looks itself up there, as pynvml does
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
