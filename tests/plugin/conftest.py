from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_share.plugin.manager import PluginManager
from testkit.fake_handler import FakeHandler
from testkit.kubelet_stub import KubeletStub, fast_plugin_settings

FAST = fast_plugin_settings()


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
