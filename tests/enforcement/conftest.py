"""The enforcement tests' builds: HAMi-core's libvgpu.so from the pinned source and the
stand-in driver (hack/build-enforcement.sh; cached, built by the test command first)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.harness.env import REPO, loud_skip

BUILD = REPO / "hack" / "build-enforcement.sh"


@dataclass(frozen=True)
class Built:
    libvgpu: Path
    standin: Path  # libcuda.so.1, libnvidia-ml.so.1, gpu-workload

    @property
    def workload(self) -> str:
        return str(self.standin / "gpu-workload")


@pytest.fixture(scope="session")
def built() -> Built:
    what = "HAMi-core enforcement tests"
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        loud_skip(what, "they apply mounts in a private mount namespace: root and unshare")
    proc = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        pytest.fail(f"{BUILD} failed:\n{proc.stderr[-3000:]}", pytrace=False)
    got = dict(
        line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line
    )
    return Built(Path(got["hami_core"]), Path(got["standin"]))
