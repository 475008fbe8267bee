"""Turn a container's decision into what the container runtime gets (AllocateSpec).

Built from the decided shares, not from the ids of one resource, so the memory and the
core Allocate responses of one container are identical (the kubelet merges both and
keeps the first of conflicting keys). Output is deterministic: devices in index order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpu_share.config.model import DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import Device, RuntimeNaming
from gpu_share.errors import AllocationError
from gpu_share.sharing.ledger import LedgerEntry
from gpu_share.sharing.model import AllocateSpec, DeviceNodeSpec, DeviceShare, Mount

ENV_MEMORY_LIMIT = "GPU_SHARE_MEMORY_LIMIT_MIB"
ENV_CORE_PERCENT = "GPU_SHARE_CORE_PERCENT"
ENV_DEVICE_IDS = "GPU_SHARE_DEVICE_IDS"
CDI_ANNOTATION_KEY = "cdi.k8s.io/gpu-share_slice"
HAMI_CACHE_IN_CONTAINER = "/tmp/vgpu"
HAMI_LOCK_DIR = "/tmp/vgpulock"
HAMI_PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"


def _memory_mib(share: DeviceShare, device: Device, unit_mib: int) -> int:
    # Exclusive devices are the container's whole: no memory limit below the device's.
    return device.memory_mib if share.exclusive else share.memory_units * unit_mib


def build_allocate_spec(
    entry: LedgerEntry,
    devices: Mapping[str, Device],
    naming: RuntimeNaming,
    runtime: RuntimeConfig,
    unit_mib: int,
    annotation_prefix: str | None = None,
    *,
    hami_cache_host_dir: str | None = None,
) -> AllocateSpec:
    """The response for any Allocate of ``entry``'s container.

    ``devices``: uuid -> Device (the backend's current devices). ``hami_cache_host_dir``:
    host directory for HAMi-core's shared cache (the agent creates it); defaults to
    ``<hamiCore.cacheDir>/<namespace>_<pod>_<container>``. ``annotation_prefix``
    overrides ``naming.annotation_prefix`` for the slice annotation key.
    """
    shares = []
    for s in entry.shares:
        d = devices.get(s.device)
        if d is None:
            raise AllocationError(f"device {s.device} is not on this node", reason="UnknownDevice")
        shares.append((d, s))
    shares.sort(key=lambda p: (p[0].index, p[0].uuid))
    uuids = [d.uuid for d, _ in shares]
    req = entry.request
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    nodes: list[DeviceNodeSpec] = []
    annotations: dict[str, str] = {}
    cdi: list[str] = []
    mem_limits = [_memory_mib(s, d, unit_mib) for d, s in shares]
    core_pct = max((s.cores for _, s in shares), default=0)

    for strategy in runtime.device_list_strategy:
        if strategy is DeviceListStrategy.ENVVAR:
            envs[naming.visible_devices_env] = ",".join(uuids)
        elif strategy is DeviceListStrategy.VOLUME_MOUNTS:
            envs[naming.visible_devices_env] = naming.volume_mount_root
            mounts.extend(
                Mount(f"{naming.volume_mount_root}/{u}", "/dev/null", read_only=True) for u in uuids
            )
        elif strategy is DeviceListStrategy.CDI_ANNOTATIONS:
            annotations[CDI_ANNOTATION_KEY] = ",".join(f"{runtime.cdi_kind}={u}" for u in uuids)
        elif strategy is DeviceListStrategy.CDI_CRI:
            cdi.extend(f"{runtime.cdi_kind}={u}" for u in uuids)

    if runtime.pass_device_specs:
        seen: set[str] = set()
        for n in [*naming.shared_nodes, *(n for d, _ in shares for n in d.nodes)]:
            if n.container_path not in seen:
                seen.add(n.container_path)
                nodes.append(DeviceNodeSpec(n.container_path, n.host_path, n.permissions))

    # Informational, in every mode: what the slice is.
    envs[ENV_DEVICE_IDS] = ",".join(uuids)
    if req.memory_units > 0:
        envs[ENV_MEMORY_LIMIT] = ",".join(str(m) for m in mem_limits)
    if req.cores > 0:
        envs[ENV_CORE_PERCENT] = str(min(core_pct, 100))

    if runtime.enforcement is EnforcementMode.MPS:
        envs["CUDA_MPS_PIPE_DIRECTORY"] = runtime.mps.pipe_dir
        mounts.append(Mount(runtime.mps.pipe_dir, runtime.mps.pipe_dir, read_only=False))
        if req.cores > 0:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(core_pct, 100))
        if req.memory_units > 0:
            # Ordinals as the container enumerates its devices (limits set by UUID are
            # not applied by some drivers).
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{i}={m}M" for i, m in enumerate(mem_limits)
            )
    elif runtime.enforcement is EnforcementMode.HAMI_CORE:
        hc = runtime.hami_core
        mounts.append(Mount(hc.library_path, hc.library_path, read_only=True))
        mounts.append(Mount(HAMI_PRELOAD_IN_CONTAINER, hc.preload_path, read_only=True))
        key = f"{entry.ref.namespace}_{entry.ref.pod_name}_{entry.ref.container_name}"
        host_cache = hami_cache_host_dir or f"{hc.cache_dir.rstrip('/')}/{key}"
        mounts.append(Mount(HAMI_CACHE_IN_CONTAINER, host_cache, read_only=False))
        mounts.append(Mount(HAMI_LOCK_DIR, HAMI_LOCK_DIR, read_only=False))
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{HAMI_CACHE_IN_CONTAINER}/gpu-share.cache"
        if req.memory_units > 0:
            for i, m in enumerate(mem_limits):
                envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{m}m"
        if req.cores > 0:
            envs["CUDA_DEVICE_SM_LIMIT"] = str(min(core_pct, 100))

    annotations[f"{annotation_prefix or naming.annotation_prefix}/slice"] = json.dumps(
        {
            "version": "v1",
            "container": entry.ref.container_name,
            "source": entry.source.value,
            "devices": [
                {
                    "id": d.uuid,
                    "memoryUnits": s.memory_units,
                    "memoryMiB": _memory_mib(s, d, unit_mib) if req.memory_units else None,
                    "cores": s.cores,
                    "exclusive": s.exclusive,
                }
                for d, s in shares
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return AllocateSpec(
        envs=dict(sorted(envs.items())),
        mounts=tuple(mounts),
        devices=tuple(nodes),
        annotations=dict(sorted(annotations.items())),
        cdi_devices=tuple(cdi),
    )
