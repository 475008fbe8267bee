"""Turn a container's decision into what the container runtime gets (AllocateSpec).

Built from the decided shares, not from the ids of one resource, so the memory and the
core Allocate responses of one container are identical (the kubelet merges both and
keeps the first of conflicting keys). Output is deterministic: devices in index order.

What each container gets per enforcement mode (docs/enforcement.md):

==========  ==================================  ===========================  ===============
mode        memory + cores                      memory only                  cores only
==========  ==================================  ===========================  ===============
none        informational env only              informational env only       informational env
mps         memory limit + active thread %      memory limit, no SM cap      MemoryRequired
hami-core   memory limit + SM limit             memory limit, no SM cap      MemoryRequired
==========  ==================================  ===========================  ===============

The rule is the admission policy's (charts/gpu-share admission-policy-workloads.yaml,
``coresOnly``), whole devices included; this is the check for pods it did not see.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_share.config.model import DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import Device, RuntimeNaming
from gpu_share.errors import AllocationError, AllocationReason
from gpu_share.sharing.ledger import LedgerEntry
from gpu_share.sharing.model import AllocateSpec, DeviceNodeSpec, DeviceShare, Mount

ENV_MEMORY_LIMIT = "GPU_SHARE_MEMORY_LIMIT_MIB"
ENV_CORE_PERCENT = "GPU_SHARE_CORE_PERCENT"
ENV_DEVICE_IDS = "GPU_SHARE_DEVICE_IDS"
CDI_ANNOTATION_KEY = "cdi.k8s.io/gpu-share_slice"
HAMI_CACHE_IN_CONTAINER = "/tmp/vgpu"
HAMI_LOCK_DIR = "/tmp/vgpulock"
HAMI_PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"

# AllocationError reason: a container with cores but no memory units under an enforcing
# mode, where it would get unlimited device memory (over-committing others' units).
MEMORY_REQUIRED = AllocationReason.MEMORY_REQUIRED
ENFORCING_MODES = frozenset({EnforcementMode.MPS, EnforcementMode.HAMI_CORE})

# One path component: what the API server allows in UIDs and container names, bounded.
_KEY_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def host_dir_key(entry: LedgerEntry) -> str:
    """Name of the container's private host dir(s): ``<podUID>_<container>``, so a later
    pod of the same name never gets it. Without a UID (a blind, degraded allocation) a
    digest of the entry's ref and creation time: unique per allocation, never reused."""
    r = entry.ref
    if _KEY_PART.fullmatch(r.pod_uid) and _KEY_PART.fullmatch(r.container_name):
        return f"{r.pod_uid}_{r.container_name}"
    ident = json.dumps(
        [r.namespace, r.pod_name, r.container_name, r.pod_uid, repr(entry.created_at)]
    )
    return "alloc-" + hashlib.sha256(ident.encode()).hexdigest()[:32]


def check_enforceable(
    entry: LedgerEntry, enforcement: EnforcementMode, memory_resource: str = "memory units"
) -> None:
    """Refuse (``MEMORY_REQUIRED``) a container with cores but no memory under an
    enforcing mode. Blind (degraded) entries are not judged: their first call cannot tell
    a cores-only container from the first half of a memory+cores one."""
    req = entry.request
    if (
        enforcement in ENFORCING_MODES
        and req.cores > 0
        and req.memory_units == 0
        and not entry.degraded
    ):
        raise AllocationError(
            f"requests {req.cores} cores but no {memory_resource}: under enforcement "
            f"{enforcement.value!r} a container requesting cores must also request "
            f"{memory_resource} (its device-memory limit; a whole device: all its units)",
            reason=MEMORY_REQUIRED,
            ref=entry.ref,
        )


def _memory_mib(share: DeviceShare, device: Device, unit_mib: int) -> int:
    # Exclusive devices are the container's whole: no memory limit below the device's.
    return device.memory_mib if share.exclusive else share.memory_units * unit_mib


@dataclass
class _Out:
    """The response being built."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    nodes: list[DeviceNodeSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi: list[str] = field(default_factory=list)


def build_allocate_spec(
    entry: LedgerEntry,
    devices: Mapping[str, Device],
    naming: RuntimeNaming,
    runtime: RuntimeConfig,
    unit_mib: int,
    annotation_prefix: str | None = None,
    *,
    hami_cache_host_dir: str | None = None,
    memory_resource: str = "memory units",
) -> AllocateSpec:
    """The response for any Allocate of ``entry``'s container.

    ``devices``: uuid -> Device (the backend's current devices). ``hami_cache_host_dir``:
    host directory for HAMi-core's shared cache (the agent creates it); defaults to
    ``<hamiCore.cacheDir>/<host_dir_key(entry)>``. ``annotation_prefix`` overrides
    ``naming.annotation_prefix`` for the slice annotation key. Raises AllocationError
    ``MEMORY_REQUIRED`` (see ``check_enforceable``).
    """
    check_enforceable(entry, runtime.enforcement, memory_resource)
    shares = []
    for s in entry.shares:
        d = devices.get(s.device)
        if d is None:
            raise AllocationError(
                f"device {s.device} is not on this node", reason=AllocationReason.UNKNOWN_DEVICE
            )
        shares.append((d, s))
    shares.sort(key=lambda p: (p[0].index, p[0].uuid))
    uuids = [d.uuid for d, _ in shares]
    req = entry.request
    out = _Out()
    mem_limits = [_memory_mib(s, d, unit_mib) for d, s in shares]
    core_pct = min(max((s.cores for _, s in shares), default=0), 100)

    _device_list(out, runtime, naming, uuids)
    if runtime.pass_device_specs:
        seen: set[str] = set()
        for n in [*naming.shared_nodes, *(n for d, _ in shares for n in d.nodes)]:
            if n.container_path not in seen:
                seen.add(n.container_path)
                out.nodes.append(DeviceNodeSpec(n.container_path, n.host_path, n.permissions))

    # Informational, in every mode: what the slice is.
    out.envs[ENV_DEVICE_IDS] = ",".join(uuids)
    if req.memory_units > 0:
        out.envs[ENV_MEMORY_LIMIT] = ",".join(str(m) for m in mem_limits)
    if req.cores > 0:
        out.envs[ENV_CORE_PERCENT] = str(core_pct)

    mem = mem_limits if req.memory_units > 0 else None
    cores = core_pct if req.cores > 0 else None
    if runtime.enforcement is EnforcementMode.MPS:
        _mps(out, runtime, mem, cores)
    elif runtime.enforcement is EnforcementMode.HAMI_CORE:
        hc = runtime.hami_core
        cache = hami_cache_host_dir or f"{hc.cache_dir.rstrip('/')}/{host_dir_key(entry)}"
        _hami_core(out, runtime, cache, mem, cores)

    out.annotations[f"{annotation_prefix or naming.annotation_prefix}/slice"] = json.dumps(
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
        envs=dict(sorted(out.envs.items())),
        mounts=tuple(out.mounts),
        devices=tuple(out.nodes),
        annotations=dict(sorted(out.annotations.items())),
        cdi_devices=tuple(out.cdi),
    )


def _device_list(
    out: _Out, runtime: RuntimeConfig, naming: RuntimeNaming, uuids: list[str]
) -> None:
    for strategy in runtime.device_list_strategy:
        if strategy is DeviceListStrategy.ENVVAR:
            out.envs[naming.visible_devices_env] = ",".join(uuids)
        elif strategy is DeviceListStrategy.VOLUME_MOUNTS:
            out.envs[naming.visible_devices_env] = naming.volume_mount_root
            out.mounts.extend(
                Mount(f"{naming.volume_mount_root}/{u}", "/dev/null", read_only=True) for u in uuids
            )
        elif strategy is DeviceListStrategy.CDI_ANNOTATIONS:
            out.annotations[CDI_ANNOTATION_KEY] = ",".join(f"{runtime.cdi_kind}={u}" for u in uuids)
        elif strategy is DeviceListStrategy.CDI_CRI:
            out.cdi.extend(f"{runtime.cdi_kind}={u}" for u in uuids)


def _mps(out: _Out, runtime: RuntimeConfig, mem: list[int] | None, cores: int | None) -> None:
    """``mem``: MiB per device (None: no memory units held); ``cores``: percent or None."""
    out.envs["CUDA_MPS_PIPE_DIRECTORY"] = runtime.mps.pipe_dir
    out.mounts.append(Mount(runtime.mps.pipe_dir, runtime.mps.pipe_dir, read_only=False))
    if cores is not None:
        out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
    if mem is not None:
        # Ordinals as the container enumerates its devices (limits set by UUID are not
        # applied by some drivers).
        out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={m}M" for i, m in enumerate(mem)
        )


def _hami_core(
    out: _Out, runtime: RuntimeConfig, cache: str, mem: list[int] | None, cores: int | None
) -> None:
    """``cache``: the container's own host cache dir (``host_dir_key``)."""
    hc = runtime.hami_core
    out.mounts.append(Mount(hc.library_path, hc.library_path, read_only=True))
    out.mounts.append(Mount(HAMI_PRELOAD_IN_CONTAINER, hc.preload_path, read_only=True))
    out.mounts.append(Mount(HAMI_CACHE_IN_CONTAINER, cache, read_only=False))
    out.mounts.append(Mount(HAMI_LOCK_DIR, HAMI_LOCK_DIR, read_only=False))
    out.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{HAMI_CACHE_IN_CONTAINER}/gpu-share.cache"
    for i, m in enumerate(mem or ()):
        out.envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{m}m"
    if cores is not None:
        out.envs["CUDA_DEVICE_SM_LIMIT"] = str(cores)
