"""L2: the nvidia-memory-limits node check against a driver that has the feature (the
stand-in's libnvidia-ml.so.1 exports nvmlDeviceSetMemoryLimits_v1) and one that lacks it
(a library without the symbol, as driver 580 on the GPU proof's H100/H200)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_share.agent import enforcement
from testkit.harness.nvidia_limits import fake_node
from tests.enforcement.conftest import Built


def test_a_node_with_cgroup_v2_the_hook_and_the_drivers_nvml_can_enforce(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = fake_node(tmp_path, monkeypatch, v2=True, hook=True,
               nvml=str(built.standin / "libnvidia-ml.so.1"))
    st = enforcement.check(rt)
    assert st.ready, st.problems


def test_the_same_node_with_an_older_driver_cannot(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = fake_node(tmp_path, monkeypatch, v2=True, hook=True, nvml="libc.so.6")
    st = enforcement.check(rt)
    assert st.problems == (
        "the driver's NVML has no nvmlDeviceSetMemoryLimits_v1 (driver-enforced memory "
        "limits need R615 or later)",), st.problems
