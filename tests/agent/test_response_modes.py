"""L1: what a container gets in each enforcement mode x {memory+cores, memory-only,
cores-only} (docs/enforcement.md), the per-container host dir key, and that the agent's
response builder (agent/response.py) reads the engine's device table as it is at the
call."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpu_share.agent.response import RuntimeResponses, build
from gpu_share.config.model import DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import DeviceNode, RuntimeNaming
from gpu_share.errors import AllocationError
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import AllocateSpec, ContainerRef, ContainerRequest, DeviceShare
from gpu_share.sharing.node.ledger import EntrySource, LedgerEntry
from gpu_share.sharing.node.limits import MEMORY_REQUIRED, host_dir_key
from tests.sharing.helpers import devices

NAMING = RuntimeNaming("NVIDIA_VISIBLE_DEVICES")
DEVS = {d.uuid: d for d in devices()}
REF = ContainerRef("ns", "p", "c", "0b3c5a36-5f0e-4a53-9d2c-1a6e1b0a8c11")
MEM = "vendor.com/vcuda-memory"
NONE, MPS, HAMI = EnforcementMode.NONE, EnforcementMode.MPS, EnforcementMode.HAMI_CORE


def entry(
    mem: int,
    cores: int,
    *,
    ref: ContainerRef = REF,
    source: EntrySource = EntrySource.NODE_AGENT,
    created: float = 100.0,
) -> LedgerEntry:
    if cores >= 100:  # whole devices, exclusive (the engine's rule)
        n = cores // 100
        shares = tuple(
            DeviceShare(f"GPU-{i}", mem if i == 0 else 0, 100, True) for i in range(n)
        )
    else:
        shares = (DeviceShare("GPU-1", mem, cores),)
    return LedgerEntry(ref, ContainerRequest(mem, cores), shares, source, created, created)


def spec(e: LedgerEntry, mode: EnforcementMode) -> AllocateSpec:
    return build(
        e, DEVS.get, NAMING, RuntimeConfig(enforcement=mode), 1024, memory_resource=MEM
    )


def limits(s: AllocateSpec) -> dict[str, str]:
    """The envs that enforce or describe a limit."""
    keys = ("GPU_SHARE_MEMORY_LIMIT_MIB", "GPU_SHARE_CORE_PERCENT", "CUDA_DEVICE_SM_LIMIT",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    return {
        k: v
        for k, v in s.envs.items()
        if k in keys or (k.startswith("CUDA_DEVICE_MEMORY_LIMIT_"))
    }


# The table of docs/enforcement.md, cell by cell.
@pytest.mark.parametrize(
    ("mode", "mem", "cores", "want"),
    [
        (NONE, 4, 30, {"GPU_SHARE_MEMORY_LIMIT_MIB": "4096", "GPU_SHARE_CORE_PERCENT": "30"}),
        (NONE, 4, 0, {"GPU_SHARE_MEMORY_LIMIT_MIB": "4096"}),
        (NONE, 0, 30, {"GPU_SHARE_CORE_PERCENT": "30"}),
        (MPS, 4, 30, {"GPU_SHARE_MEMORY_LIMIT_MIB": "4096", "GPU_SHARE_CORE_PERCENT": "30",
                      "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                      "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}),
        (MPS, 4, 0, {"GPU_SHARE_MEMORY_LIMIT_MIB": "4096",
                     "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}),
        (HAMI, 4, 30, {"GPU_SHARE_MEMORY_LIMIT_MIB": "4096", "GPU_SHARE_CORE_PERCENT": "30",
                       "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_SM_LIMIT": "30"}),
        (HAMI, 4, 0, {"GPU_SHARE_MEMORY_LIMIT_MIB": "4096", "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m"}),
        # Whole devices: the memory limit is the devices' memory.
        (HAMI, 8, 200, {"GPU_SHARE_MEMORY_LIMIT_MIB": "8192,8192", "GPU_SHARE_CORE_PERCENT": "100",
                        "CUDA_DEVICE_MEMORY_LIMIT_0": "8192m",
                        "CUDA_DEVICE_MEMORY_LIMIT_1": "8192m", "CUDA_DEVICE_SM_LIMIT": "100"}),
        (NONE, 0, 100, {"GPU_SHARE_CORE_PERCENT": "100"}),
    ],
)
def test_mode_table(mode: EnforcementMode, mem: int, cores: int, want: dict[str, str]) -> None:
    assert limits(spec(entry(mem, cores), mode)) == want


@pytest.mark.parametrize("mode", [MPS, HAMI])
@pytest.mark.parametrize("cores", [30, 100, 200])  # whole devices included
def test_cores_only_is_refused_under_enforcing_modes(mode: EnforcementMode, cores: int) -> None:
    with pytest.raises(AllocationError) as ex:
        spec(entry(0, cores), mode)
    assert ex.value.reason == MEMORY_REQUIRED == "MemoryRequired"
    assert ex.value.ref == REF  # the agent puts the Event on this pod
    assert MEM in ex.value.message and f"{cores} cores" in ex.value.message


def test_blind_cores_first_call_is_not_judged() -> None:
    # Degraded: the first of a memory+cores container's calls looks cores-only.
    e = entry(0, 30, ref=ContainerRef("", "unattributed-1", "core"), source=EntrySource.DEGRADED)
    assert limits(spec(e, HAMI)) == {"GPU_SHARE_CORE_PERCENT": "30", "CUDA_DEVICE_SM_LIMIT": "30"}


def test_hami_cache_dir_is_keyed_by_pod_uid() -> None:
    s = spec(entry(4, 30), HAMI)
    (cache,) = [m for m in s.mounts if m.container_path == "/tmp/vgpu"]
    assert cache.host_path == f"/tmp/vgpu/{REF.pod_uid}_c"
    # A later pod of the same name (new UID) gets another dir.
    other = ContainerRef("ns", "p", "c", "7f1e2d3c-0000-4000-8000-000000000001")
    s2 = spec(entry(4, 30, ref=other), HAMI)
    (cache2,) = [m for m in s2.mounts if m.container_path == "/tmp/vgpu"]
    assert cache2.host_path != cache.host_path


def test_host_dir_key_without_uid_is_unique_per_allocation() -> None:
    blind = ContainerRef("", "unattributed-1", "memory")
    a = host_dir_key(entry(4, 0, ref=blind, source=EntrySource.DEGRADED, created=1.0))
    b = host_dir_key(entry(4, 0, ref=blind, source=EntrySource.DEGRADED, created=2.0))
    assert a != b and a.startswith("alloc-") and "/" not in a
    # Same allocation (its second call): same key.
    assert a == host_dir_key(entry(4, 30, ref=blind, source=EntrySource.DEGRADED, created=1.0))
    # Names that are not one plain path component never reach the path.
    for bad in ("../x", "a/b", ".", "..", "x" * 300, ""):
        k = host_dir_key(entry(4, 0, ref=ContainerRef("ns", "p", "c", bad)))
        assert k.startswith("alloc-") and "/" not in k
    k = host_dir_key(entry(4, 0, ref=ContainerRef("ns", "p", "../../etc", REF.pod_uid)))
    assert k.startswith("alloc-")


# ---- the live device table ------------------------------------------------------------


def test_response_follows_the_live_device_table() -> None:
    """The agent's builder reads the table at each call: a device the backend's refresh
    added can be answered, one it removed cannot, and a changed device (health, nodes,
    memory) is what the next response describes. Same table: same bytes as the
    fixed-table function."""
    rt = RuntimeConfig(
        enforcement=HAMI,
        pass_device_specs=True,
        device_list_strategy=[DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_CRI],
    )
    table = {"inv": Inventory.from_devices(devices(2), 1024)}
    responses = RuntimeResponses(lambda: table["inv"], NAMING, lambda: rt, memory_resource=MEM)
    on_1 = entry(4, 30)  # GPU-1
    assert responses.build(on_1) == build(
        on_1, ({d.uuid: d for d in devices(2)}).get, NAMING, rt, 1024, memory_resource=MEM
    )

    # Added by a refresh: GPU-2, unknown a moment ago.
    on_2 = LedgerEntry(REF, ContainerRequest(2, 0), (DeviceShare("GPU-2", 2, 0),),
                       EntrySource.NODE_AGENT, 1.0, 1.0)
    with pytest.raises(AllocationError) as ex:
        responses.build(on_2)
    assert ex.value.reason == "UnknownDevice"
    table["inv"] = Inventory.from_devices(devices(3), 1024)
    s2 = responses.build(on_2)
    assert s2.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2"
    assert s2.cdi_devices == ("nvidia.com/gpu=GPU-2",)
    assert [d.host_path for d in s2.devices] == ["/dev/nvidia2"]

    # Changed: GPU-1 unhealthy and re-enumerated on another node; its whole-device
    # memory is the device's as it is now.
    gpu1 = replace(devices(3)[1], healthy=False, minor=7, memory_mib=4096,
                   nodes=(DeviceNode("/dev/nvidia7", "/dev/nvidia1"),))
    table["inv"] = table["inv"].with_health("GPU-1", False)
    assert table["inv"].require("GPU-1").healthy is False
    table["inv"] = Inventory.from_devices([devices(3)[0], gpu1, devices(3)[2]], 1024)
    assert [d.host_path for d in responses.build(on_1).devices] == ["/dev/nvidia7"]
    whole = LedgerEntry(REF, ContainerRequest(4, 100), (DeviceShare("GPU-1", 4, 100, True),),
                        EntrySource.NODE_AGENT, 1.0, 1.0)
    assert responses.build(whole).envs["GPU_SHARE_MEMORY_LIMIT_MIB"] == "4096"

    # Removed by a refresh: the next response refuses instead of naming a gone device.
    table["inv"] = Inventory.from_devices(devices(1), 1024)
    with pytest.raises(AllocationError) as ex:
        responses.build(on_1)
    assert ex.value.reason == "UnknownDevice"
