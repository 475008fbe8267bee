from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# ``tests.support`` must import however pytest was started (``pytest`` or
# ``python -m pytest``); the repo root is not always on sys.path.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from gpu_share.plugin.manager import PluginManager  # noqa: E402
from tests.support.fake_handler import FakeHandler  # noqa: E402
from tests.support.kubelet_stub import KubeletStub, fast_plugin_settings  # noqa: E402

FAST = fast_plugin_settings()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short temp dir: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def handler() -> FakeHandler:
    return FakeHandler()


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[KubeletStub]:
    stub = KubeletStub(sock_dir).start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture
def manager(sock_dir: Path, handler: FakeHandler) -> Iterator[PluginManager]:
    mgr = PluginManager([handler], sock_dir, FAST)
    try:
        yield mgr
    finally:
        mgr.stop()
