"""A node's facts for the nvidia-memory-limits check (agent/enforcement.py): its
mountinfo, the toolkit's hook and the driver's NVML library, set up in a temp dir."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpu_share.agent import enforcement
from gpu_share.config.model import EnforcementMode, RuntimeConfig
from gpu_share.devices import nvml_features

MOUNTINFO_V2 = ("24 1 0:22 / /sys ro - sysfs sysfs rw\n"
                "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n")
MOUNTINFO_V1 = ("24 1 0:22 / /sys ro - sysfs sysfs rw\n"
                "30 24 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n"
                "31 30 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")


def fake_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, v2: bool, hook: bool,
              nvml: str) -> RuntimeConfig:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO_V2 if v2 else MOUNTINFO_V1)
    monkeypatch.setattr(enforcement, "MOUNTINFO", str(info))
    path = tmp_path / "nvidia-cdi-hook"
    if hook:
        path.write_text("#!/bin/sh\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(nvml_features, "NVML_LIBRARY", nvml)
    mode = EnforcementMode.NVIDIA_MEMORY_LIMITS.value
    return RuntimeConfig.model_validate({"enforcement": mode,
                                         "nvidiaMemoryLimits": {"hookPath": str(path)}})
