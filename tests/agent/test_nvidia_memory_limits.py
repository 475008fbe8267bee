"""L1: the nvidia-memory-limits mode. What a container gets (the limit env the NVIDIA
container toolkit's apply-cuda-memory-limits hook reads, and the hook as a CDI device of
our hook kind or inline in a DRA claim's spec), the hook-only CDI spec the agent writes,
the config rule that a device-plugin pool of this mode names devices through CDI, the
node check that gates the mode, and the mode's strength against a tenant's claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpu_share.agent import enforcement
from gpu_share.agent.cdi import CdiSpecWriter
from gpu_share.agent.response import build
from gpu_share.config.model import AgentConfig, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import RuntimeNaming
from gpu_share.devices.dummy import DummyBackend
from gpu_share.errors import AllocationError
from gpu_share.sharing.cdi import memory_limits_spec
from gpu_share.sharing.dra.cdi import container_edits
from gpu_share.sharing.dra.claims import ParsedClaim, enforcement_for
from gpu_share.sharing.dra.config import ClaimConfig
from gpu_share.sharing.dra.reading import ClaimError, ClaimReason
from gpu_share.sharing.model import AllocateSpec, ContainerRef, ContainerRequest, DeviceShare
from gpu_share.sharing.node.ledger import EntrySource, LedgerEntry
from gpu_share.sharing.node.limits import MEMORY_REQUIRED
from testkit.harness.nvidia_limits import MOUNTINFO_V1, MOUNTINFO_V2, fake_node
from tests.sharing.helpers import devices

NV = EnforcementMode.NVIDIA_MEMORY_LIMITS
NAMING = RuntimeNaming("NVIDIA_VISIBLE_DEVICES")
DEVS = {d.uuid: d for d in devices()}
REF = ContainerRef("ns", "p", "c", "0b3c5a36-5f0e-4a53-9d2c-1a6e1b0a8c11")
HOOK_KIND = "vendor.com/gpu-memory-limits"
HOOK = "/usr/bin/nvidia-cdi-hook"


def _entry(mem: int, cores: int) -> LedgerEntry:
    if cores >= 100:
        shares = tuple(DeviceShare(f"GPU-{i}", mem if i == 0 else 0, 100, True)
                       for i in range(cores // 100))
    else:
        shares = (DeviceShare("GPU-1", mem, cores),)
    return LedgerEntry(REF, ContainerRequest(mem, cores), shares, EntrySource.NODE_AGENT,
                       1.0, 1.0)


def _spec(e: LedgerEntry, *strategies: str) -> AllocateSpec:
    rt = RuntimeConfig.model_validate({"enforcement": NV.value,
                                       "deviceListStrategy": list(strategies)})
    return build(e, DEVS.get, NAMING, rt, 1024)


def test_a_slice_gets_the_hook_env_in_mib_and_its_gpus_hook_device() -> None:
    s = _spec(_entry(4, 30), "cdi-cri")
    assert s.envs["NVIDIA_GPU_MEMORY_REQUEST"] == s.envs["NVIDIA_GPU_MEMORY_LIMIT"] == "4096"
    assert s.cdi_devices == ("nvidia.com/gpu=GPU-1", f"{HOOK_KIND}=GPU-1")
    (hook,) = s.hooks
    assert (hook.hook_name, hook.path) == ("createRuntime", HOOK)
    assert hook.args == ("nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/",
                         "--gpu-id", "GPU-1")
    # Memory only: the driver caps no compute; the cores stay informational.
    assert not {"CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"} & set(s.envs)


def test_cdi_annotations_name_the_hook_device_beside_the_gpu() -> None:
    s = _spec(_entry(2, 0), "cdi-annotations")
    assert s.annotations["cdi.k8s.io/gpu-share_slice"] == (
        f"nvidia.com/gpu=GPU-1,{HOOK_KIND}=GPU-1")
    assert s.envs["NVIDIA_GPU_MEMORY_LIMIT"] == "2048"


def test_whole_devices_get_no_limit_and_no_hook() -> None:
    s = _spec(_entry(8, 200), "cdi-cri")
    assert "NVIDIA_GPU_MEMORY_LIMIT" not in s.envs and not s.hooks
    assert all(not n.startswith(HOOK_KIND) for n in s.cdi_devices)


def test_cores_without_memory_are_refused() -> None:
    with pytest.raises(AllocationError) as exc:
        _spec(_entry(0, 30), "cdi-cri")
    assert exc.value.reason == MEMORY_REQUIRED


def test_a_dra_claims_spec_carries_the_hook_itself() -> None:
    edits = container_edits(_spec(_entry(4, 0), "envvar"))
    assert "NVIDIA_GPU_MEMORY_LIMIT=4096" in edits["env"]
    assert edits["hooks"] == [{"hookName": "createRuntime", "path": HOOK,
                               "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits",
                                        "--driver-root", "/", "--gpu-id", "GPU-1"]}]


def _cfg(strategies: list[str], *, dra: bool = False) -> AgentConfig:
    return AgentConfig.model_validate({
        "backend": "dummy", "dummy": {"deviceCount": 2}, "dra": {"enabled": dra},
        "runtime": {"enforcement": NV.value, "deviceListStrategy": strategies},
    })


def test_a_device_plugin_pool_of_this_mode_needs_a_cdi_strategy() -> None:
    with pytest.raises(ValidationError, match="needs a CDI device list strategy"):
        _cfg(["envvar"])
    _cfg(["envvar", "cdi-cri"])
    _cfg(["envvar"], dra=True)  # a DRA claim's own spec carries the hook


def test_the_agent_writes_and_removes_the_hook_spec(tmp_path: Path) -> None:
    cfg = _cfg(["cdi-cri"])
    backend = DummyBackend(cfg.dummy, "node-a")
    w = CdiSpecWriter(cfg, backend.devices(), backend.naming(), spec_dir=str(tmp_path),
                      scan_dirs=(str(tmp_path),))
    w.write()
    hook_file = tmp_path / "gpu-share_vendor.com-gpu-memory-limits.json"
    doc = json.loads(hook_file.read_text())
    assert doc == memory_limits_spec(HOOK_KIND, backend.devices(), HOOK, "/")
    names = [d["name"] for d in doc["devices"]]
    assert names == [d.uuid for d in backend.devices()]
    assert all(list(d["containerEdits"]) == ["hooks"] for d in doc["devices"])
    assert w.remove() and not hook_file.exists()


@pytest.mark.parametrize(("text", "want"), [(MOUNTINFO_V2, "cgroup2"), (MOUNTINFO_V1, "tmpfs"),
                                            ("", None)])
def test_the_cgroup_mount_type_is_read_from_mountinfo(
    tmp_path: Path, text: str, want: str | None
) -> None:
    (tmp_path / "mountinfo").write_text(text)
    assert enforcement.cgroup_fs_type(mountinfo=str(tmp_path / "mountinfo")) == want


def test_a_node_without_v2_hook_or_driver_support_cannot_enforce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libc is loadable and has no NVML symbol: a driver older than R615.
    rt = fake_node(tmp_path, monkeypatch, v2=False, hook=False, nvml="libc.so.6")
    st = enforcement.check(rt)
    assert not st.ready
    text = " | ".join(st.problems)
    assert "hook" in text and "not cgroup v2" in text and "nvmlDeviceSetMemoryLimits_v1" in text


@pytest.mark.parametrize(("pool", "asked", "ok"), [
    (EnforcementMode.HAMI_CORE, NV, True),
    (EnforcementMode.MPS, NV, True),
    (NV, EnforcementMode.MPS, False),
    (NV, EnforcementMode.HAMI_CORE, False),
    (NV, EnforcementMode.NONE, False),
])
def test_a_tenants_claim_may_raise_to_driver_limits_and_never_lower_from_them(
    pool: EnforcementMode, asked: EnforcementMode, ok: bool
) -> None:
    claim = ParsedClaim("uid", "ns", "c", (), ClaimConfig(asked))
    if ok:
        assert enforcement_for(claim, pool) is asked
    else:
        with pytest.raises(ClaimError) as exc:
            enforcement_for(claim, pool)
        assert exc.value.reason == ClaimReason.ENFORCEMENT_LOWERED


@pytest.mark.parametrize(("text", "version"), [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct  9 2025\n"
     "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", "580.159.04"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  615.12  Release Build\n",
     "615.12"),
    ("garbage\n", ""),
])
def test_the_driver_version_is_read_from_the_kernel_module(
    tmp_path: Path, text: str, version: str
) -> None:
    f = tmp_path / "version"
    f.write_text(text)
    assert enforcement.driver_version(str(f)) == version
    assert enforcement.driver_version(str(tmp_path / "absent")) == ""


def _hook(tmp_path: Path, prints: str) -> RuntimeConfig:
    hook = tmp_path / "nvidia-cdi-hook"
    hook.write_text(f"#!/bin/sh\necho '{prints}'\necho 'commit: x'\n")
    hook.chmod(0o755)
    return RuntimeConfig.model_validate({"enforcement": "nvidia-memory-limits",
                                         "nvidiaMemoryLimits": {"hookPath": str(hook)}})


def test_a_toolkit_hook_older_than_the_subcommand_is_a_problem(tmp_path: Path) -> None:
    old = _hook(tmp_path, "NVIDIA CDI Hook version 1.17.8")
    problems = enforcement.check_nvidia_memory_limits(old)
    assert ("the toolkit's hook is version 1.17.8; apply-cuda-memory-limits needs 1.20.1 "
            "or later") in problems
    facts = dict(enforcement.check(old).facts)
    assert facts["hookVersion"] == "NVIDIA CDI Hook version 1.17.8"
    assert set(facts) == {"driverVersion", "dmemController", "hookVersion"}
    (tmp_path / "new").mkdir()
    new = _hook(tmp_path / "new", "NVIDIA CDI Hook version 1.20.2")
    assert not any("toolkit's hook is" in p
                   for p in enforcement.check_nvidia_memory_limits(new))
    assert enforcement.check(new).as_doc()["facts"]["hookVersion"].endswith("1.20.2")  # type: ignore[index]
