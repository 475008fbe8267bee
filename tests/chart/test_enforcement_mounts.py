"""What each enforcement mode needs reaches the agent pod: ``auto`` gets what every mode
it may take needs (the HAMi-core installer and mounts, the MPS pipe dir, the toolkit
hook's directory) and no MPS control daemon of its own; the hook is checked through its
host directory, mounted read-only, so a node without it still starts the agent."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpu_share.config.model import AgentConfig
from tests.chart.conftest import by_kind, helm_path, render

MODE = "agentConfig.runtime.enforcement"
HOOK_DIR = "/run/gpu-share/nvidia-cdi-hook"


def _rendered(*sets: str) -> tuple[list[dict[str, Any]], dict[str, Any], AgentConfig]:
    objs = render(helm_path(4), sets=["agentConfig.backend=nvml", *sets])
    (ds,) = [d for d in by_kind(objs, "DaemonSet") if "-mps" not in d["metadata"]["name"]]
    (cm,) = [c for c in by_kind(objs, "ConfigMap") if "config.yaml" in c.get("data", {})]
    cfg = AgentConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    return objs, ds["spec"]["template"]["spec"], cfg


def _mounts(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    return {m["mountPath"]: m for m in agent.get("volumeMounts", [])}


def test_an_auto_pool_carries_what_each_mode_needs() -> None:
    objs, pod, cfg = _rendered(f"{MODE}=auto")
    mounts, vols = _mounts(pod), {v["name"]: v for v in pod["volumes"]}
    assert [c["name"] for c in pod["initContainers"]] == ["install-hami-core"]
    assert mounts["/usr/local/vgpu"]["readOnly"] and "/tmp/vgpu" in mounts
    assert not mounts["/run/nvidia/mps"].get("readOnly", False)
    hook = mounts[HOOK_DIR]
    assert hook["readOnly"]
    assert vols[hook["name"]]["hostPath"] == {"path": "/usr/bin", "type": "DirectoryOrCreate"}
    assert cfg.runtime.nvidia_memory_limits.check_path == f"{HOOK_DIR}/nvidia-cdi-hook"
    assert not [d for d in by_kind(objs, "DaemonSet") if "-mps" in d["metadata"]["name"]]


@pytest.mark.parametrize("hook", ["/usr/bin/nvidia-cdi-hook",
                                  "/usr/local/nvidia/toolkit/nvidia-cdi-hook"])
def test_the_hook_is_checked_through_its_host_directory(hook: str) -> None:
    _, pod, cfg = _rendered(f"{MODE}=nvidia-memory-limits",
                            "agentConfig.runtime.deviceListStrategy={cdi-cri}",
                            f"agentConfig.runtime.nvidiaMemoryLimits.hookPath={hook}")
    mounts, vols = _mounts(pod), {v["name"]: v for v in pod["volumes"]}
    host_dir, name = hook.rsplit("/", 1)
    assert vols[mounts[HOOK_DIR]["name"]]["hostPath"]["path"] == host_dir
    assert cfg.runtime.nvidia_memory_limits.hook_path == hook  # what the runtime runs
    assert cfg.runtime.nvidia_memory_limits.check_path == f"{HOOK_DIR}/{name}"
    assert "/run/nvidia/mps" not in mounts and "initContainers" not in pod


@pytest.mark.parametrize("mode", ["none", "mps", "hami-core"])
def test_other_modes_mount_no_hook(mode: str) -> None:
    _, pod, _ = _rendered(f"{MODE}={mode}")
    assert HOOK_DIR not in _mounts(pod)
