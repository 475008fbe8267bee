"""What the kwok scale tests need: the local cluster and a built kwok (else a loud skip)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testkit.harness import live_cluster, loud_skip

ROOT = Path(__file__).resolve().parents[2]


def needs_kwok(request: pytest.FixtureRequest, what: str = "scale test (kwok)") -> None:
    live_cluster(request, what)
    built = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-kwok.sh"), "--print"], capture_output=True,
        text=True, check=False,
    )
    if built.returncode != 0:
        loud_skip("scale test (kwok)", "kwok is not built (hack/build-kwok.sh)")
