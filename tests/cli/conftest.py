"""The L3 tests here reuse the session's real kube-apiserver + etcd of tests/kube."""

from __future__ import annotations

import sys
from pathlib import Path

# tests/kube is no package: its conftest imports its helpers by bare name.
_KUBE = str(Path(__file__).resolve().parent.parent / "kube")
if _KUBE not in sys.path:
    sys.path.insert(0, _KUBE)

from tests.kube.conftest import apiserver  # noqa: E402

__all__ = ["apiserver"]
