"""The L3 tests here reuse the session's real kube-apiserver + etcd of tests/kube."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_share.kube.rest import RestClient

# tests/kube is no package: its conftest imports its helpers by bare name.
_KUBE = str(Path(__file__).resolve().parent.parent / "kube")
if _KUBE not in sys.path:
    sys.path.insert(0, _KUBE)

from tests.kube.conftest import apiserver  # noqa: E402

__all__ = ["apiserver", "requests"]


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every request a RestClient sends: (method, path with query)."""
    seen: list[tuple[str, str]] = []
    send = RestClient._send

    def counting(self: RestClient, op: str, method: str, url: str, *a: Any) -> Any:
        seen.append((method, url))
        return send(self, op, method, url, *a)

    monkeypatch.setattr(RestClient, "_send", counting)
    return seen
