"""Plugins and fixtures every test directory shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# The local cluster's lifecycle: one lock, one up, one down per session.
pytest_plugins = ["testkit.pytest_cluster"]


@pytest.fixture
def sock_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh short dir under /tmp for unix sockets (paths must stay under 108 bytes),
    named for the test's directory (``gs-plugin-…``), removed afterwards."""
    from testkit.kubelet_stub import socket_dir  # grpc: only for the tests that use it

    with socket_dir(f"gs-{request.path.parent.name}-") as path:
        yield path
