"""The runtime adapter: what the container runtime gets (AllocateSpec) for a container.

Built at each Allocate from the engine's live device table (``RuntimeResponses``), so a
device's health, nodes or presence are as they are now, not as at start. Built from the
decided shares, not from the ids of one resource, so the memory and the core Allocate
responses of one container are identical (the kubelet merges both and keeps the first
of conflicting keys). Output is deterministic: devices in index order.

One small function per device-list strategy (``DEVICE_LISTS``) and per enforcement mode
(``ENFORCEMENT``). What each container gets per mode (docs/enforcement.md):

==========  ==================================  ===========================  ===============
mode        memory + cores                      memory only                  cores only
==========  ==================================  ===========================  ===============
none        informational env only              informational env only       informational env
mps         memory limit + active thread %      memory limit, no SM cap      MemoryRequired
hami-core   memory limit + SM limit             memory limit, no SM cap      MemoryRequired
nvidia-*    memory limit (driver), no SM cap    memory limit (driver)        MemoryRequired
==========  ==================================  ===========================  ===============

(``nvidia-*``: ``nvidia-memory-limits``.)

The arithmetic (limits, the MemoryRequired rule, host dir names) is pure and lives in
``sharing/node/limits.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpu_share.config.model import DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import Device, DeviceNode, RuntimeNaming
from gpu_share.errors import AllocationError, AllocationReason
from gpu_share.sharing.cdi import memory_limits_hook
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import AllocateSpec, DeviceShare, Hook, Mount
from gpu_share.sharing.node.ledger import LedgerEntry
from gpu_share.sharing.node.limits import check_enforceable, core_percent, host_dir_key, memory_mib

ENV_MEMORY_LIMIT = "GPU_SHARE_MEMORY_LIMIT_MIB"
ENV_CORE_PERCENT = "GPU_SHARE_CORE_PERCENT"
ENV_DEVICE_IDS = "GPU_SHARE_DEVICE_IDS"
CDI_ANNOTATION_KEY = "cdi.k8s.io/gpu-share_slice"
HAMI_CACHE_IN_CONTAINER = "/tmp/vgpu"
HAMI_LOCK_DIR = "/tmp/vgpulock"
HAMI_PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"
# What the toolkit's apply-cuda-memory-limits hook reads (MiB, singular names).
ENV_NVIDIA_MEMORY_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
ENV_NVIDIA_MEMORY_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"

DeviceLookup = Callable[[str], Device | None]


@dataclass
class _Out:
    """The response being built."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    nodes: list[DeviceNode] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi: list[str] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)


@dataclass(frozen=True)
class _Slice:
    """One container's slice as the functions below need it."""

    entry: LedgerEntry
    uuids: list[str]
    mem: list[int] | None  # MiB per device; None: no memory units held
    cores: int | None  # percent; None: no cores held
    cache_dir: str | None  # hami-core host cache dir, when the caller names it
    cap: int | None = None  # MiB a DRA claim may burst to (driver limits); None: mem


# ---- device-list strategies --------------------------------------------------------------


def _envvar(out: _Out, runtime: RuntimeConfig, naming: RuntimeNaming, uuids: list[str]) -> None:
    out.envs[naming.visible_devices_env] = ",".join(uuids)


def _volume_mounts(
    out: _Out, runtime: RuntimeConfig, naming: RuntimeNaming, uuids: list[str]
) -> None:
    out.envs[naming.visible_devices_env] = naming.volume_mount_root
    out.mounts.extend(
        Mount(f"{naming.volume_mount_root}/{u}", "/dev/null", read_only=True) for u in uuids
    )


def cdi_names(runtime: RuntimeConfig, uuids: list[str]) -> list[str]:
    """``<kind>=<uuid>``: the names our CDI spec (sharing/cdi.py) defines."""
    return [f"{runtime.cdi_kind}={u}" for u in uuids]


def _cdi_annotations(
    out: _Out, runtime: RuntimeConfig, naming: RuntimeNaming, uuids: list[str]
) -> None:
    out.annotations[CDI_ANNOTATION_KEY] = ",".join(cdi_names(runtime, uuids))


def _cdi_cri(out: _Out, runtime: RuntimeConfig, naming: RuntimeNaming, uuids: list[str]) -> None:
    out.cdi.extend(cdi_names(runtime, uuids))


DEVICE_LISTS: Mapping[
    DeviceListStrategy, Callable[[_Out, RuntimeConfig, RuntimeNaming, list[str]], None]
] = {
    DeviceListStrategy.ENVVAR: _envvar,
    DeviceListStrategy.VOLUME_MOUNTS: _volume_mounts,
    DeviceListStrategy.CDI_ANNOTATIONS: _cdi_annotations,
    DeviceListStrategy.CDI_CRI: _cdi_cri,
}


# ---- enforcement modes ---------------------------------------------------------------------


def _none(out: _Out, runtime: RuntimeConfig, s: _Slice) -> None:
    """Time-slicing: the informational env every mode gets is all."""


def _mps(out: _Out, runtime: RuntimeConfig, s: _Slice) -> None:
    out.envs["CUDA_MPS_PIPE_DIRECTORY"] = runtime.mps.pipe_dir
    out.mounts.append(Mount(runtime.mps.pipe_dir, runtime.mps.pipe_dir, read_only=False))
    if s.cores is not None:
        out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(s.cores)
    if s.mem is not None:
        # Ordinals as the container enumerates its devices (limits set by UUID are not
        # applied by some drivers).
        out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={m}M" for i, m in enumerate(s.mem)
        )


def _hami_core(out: _Out, runtime: RuntimeConfig, s: _Slice) -> None:
    hc = runtime.hami_core
    # The container's own host cache dir (host_dir_key), created by the agent.
    cache = s.cache_dir or f"{hc.cache_dir.rstrip('/')}/{host_dir_key(s.entry)}"
    out.mounts.append(Mount(hc.library_path, hc.library_path, read_only=True))
    out.mounts.append(Mount(HAMI_PRELOAD_IN_CONTAINER, hc.preload_path, read_only=True))
    out.mounts.append(Mount(HAMI_CACHE_IN_CONTAINER, cache, read_only=False))
    out.mounts.append(Mount(HAMI_LOCK_DIR, HAMI_LOCK_DIR, read_only=False))
    out.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{HAMI_CACHE_IN_CONTAINER}/gpu-share.cache"
    for i, m in enumerate(s.mem or ()):
        out.envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{m}m"
    if s.cores is not None:
        out.envs["CUDA_DEVICE_SM_LIMIT"] = str(s.cores)


def _nvidia_memory_limits(out: _Out, runtime: RuntimeConfig, s: _Slice) -> None:
    """The limit env the toolkit's hook reads and, per GPU, the hook: as a CDI device of
    our hook kind (device plugin) and inline (a DRA claim's spec). Several devices are
    whole ones (exclusive): nothing to limit, and one env could not say two sizes."""
    if s.mem is None or len(s.uuids) != 1:
        return
    nml = runtime.nvidia_memory_limits
    # Request (the soft limit) is what placement counted; the limit (hard) is the same
    # unless the claim may burst to a cap (``sharing.dra.claims.memory_cap_mib``).
    out.envs[ENV_NVIDIA_MEMORY_REQUEST] = str(s.mem[0])
    out.envs[ENV_NVIDIA_MEMORY_LIMIT] = str(s.cap or s.mem[0])
    names = [f"{nml.cdi_kind}={u}" for u in s.uuids]
    if DeviceListStrategy.CDI_CRI in runtime.device_list_strategy:
        out.cdi.extend(names)
    if DeviceListStrategy.CDI_ANNOTATIONS in runtime.device_list_strategy:
        listed = out.annotations.get(CDI_ANNOTATION_KEY)
        out.annotations[CDI_ANNOTATION_KEY] = ",".join([listed, *names] if listed else names)
    out.hooks.extend(memory_limits_hook(nml.hook_path, nml.driver_root, u) for u in s.uuids)


ENFORCEMENT: Mapping[EnforcementMode, Callable[[_Out, RuntimeConfig, _Slice], None]] = {
    EnforcementMode.NONE: _none,
    EnforcementMode.MPS: _mps,
    EnforcementMode.HAMI_CORE: _hami_core,
    EnforcementMode.NVIDIA_MEMORY_LIMITS: _nvidia_memory_limits,
}


# ---- the response ------------------------------------------------------------------------


def _resolve(entry: LedgerEntry, lookup: DeviceLookup) -> list[tuple[Device, DeviceShare]]:
    shares = []
    for s in entry.shares:
        d = lookup(s.device)
        if d is None:
            raise AllocationError(
                f"device {s.device} is not on this node", reason=AllocationReason.UNKNOWN_DEVICE
            )
        shares.append((d, s))
    shares.sort(key=lambda p: (p[0].index, p[0].uuid))
    return shares


def _device_specs(out: _Out, naming: RuntimeNaming, devices: list[Device]) -> None:
    seen: set[str] = set()
    for n in [*naming.shared_nodes, *(n for d in devices for n in d.nodes)]:
        if n.container_path not in seen:
            seen.add(n.container_path)
            out.nodes.append(n)


def _slice_annotation(
    entry: LedgerEntry, shares: list[tuple[Device, DeviceShare]], unit_mib: int
) -> str:
    req = entry.request
    return json.dumps(
        {
            "version": "v1",
            "container": entry.ref.container_name,
            "source": entry.source.value,
            "devices": [
                {
                    "id": d.uuid,
                    "memoryUnits": s.memory_units,
                    "memoryMiB": memory_mib(s, d, unit_mib) if req.memory_units else None,
                    "cores": s.cores,
                    "exclusive": s.exclusive,
                }
                for d, s in shares
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def build(
    entry: LedgerEntry,
    lookup: DeviceLookup,
    naming: RuntimeNaming,
    runtime: RuntimeConfig,
    unit_mib: int,
    annotation_prefix: str | None = None,
    *,
    hami_cache_host_dir: str | None = None,
    memory_cap_mib: int | None = None,
    memory_resource: str = "memory units",
) -> AllocateSpec:
    """The response for any Allocate of ``entry``'s container; ``lookup``: uuid -> the
    device as it is now (None: not on this node, ``UNKNOWN_DEVICE``). Raises
    AllocationError ``MEMORY_REQUIRED`` (``limits.check_enforceable``)."""
    apply_limits = ENFORCEMENT.get(runtime.enforcement)
    if apply_limits is None:  # ``auto`` before its first check: no slice without limits
        raise AllocationError("the pool's enforcement 'auto' has no mode in force yet",
                              reason=AllocationReason.ENFORCEMENT_UNRESOLVED)
    check_enforceable(entry, runtime.enforcement, memory_resource)
    shares = _resolve(entry, lookup)
    uuids = [d.uuid for d, _ in shares]
    req = entry.request
    mem_limits = [memory_mib(s, d, unit_mib) for d, s in shares]
    out = _Out()
    for strategy in runtime.device_list_strategy:
        DEVICE_LISTS[strategy](out, runtime, naming, uuids)
    if runtime.pass_device_specs:
        _device_specs(out, naming, [d for d, _ in shares])
    # Informational, in every mode: what the slice is.
    out.envs[ENV_DEVICE_IDS] = ",".join(uuids)
    sl = _Slice(
        entry,
        uuids,
        mem_limits if req.memory_units > 0 else None,
        core_percent(share for _, share in shares) if req.cores > 0 else None,
        hami_cache_host_dir,
        memory_cap_mib,
    )
    if sl.mem is not None:
        out.envs[ENV_MEMORY_LIMIT] = ",".join(str(m) for m in sl.mem)
    if sl.cores is not None:
        out.envs[ENV_CORE_PERCENT] = str(sl.cores)
    apply_limits(out, runtime, sl)
    prefix = annotation_prefix or naming.annotation_prefix
    out.annotations[f"{prefix}/slice"] = _slice_annotation(entry, shares, unit_mib)
    return AllocateSpec(
        envs=dict(sorted(out.envs.items())),
        mounts=tuple(out.mounts),
        devices=tuple(out.nodes),
        annotations=dict(sorted(out.annotations.items())),
        cdi_devices=tuple(out.cdi),
        hooks=tuple(out.hooks),
    )


class RuntimeResponses:
    """The agent's response builder: reads the device table and the unit size from
    ``inventory()`` (the engine's, as it is at the call) each time."""

    def __init__(
        self,
        inventory: Callable[[], Inventory],
        naming: RuntimeNaming,
        runtime: Callable[[], RuntimeConfig],
        *,
        annotation_prefix: str | None = None,
        memory_resource: str = "memory units",
    ) -> None:
        self._inventory = inventory
        self.naming = naming
        self.runtime = runtime  # the mode in force at the call (``auto`` resolved)
        self._prefix = annotation_prefix
        self._memory_resource = memory_resource

    def build(self, entry: LedgerEntry) -> AllocateSpec:
        inv = self._inventory()

        def lookup(uuid: str) -> Device | None:
            d = inv.get(uuid)
            return d.device if d is not None else None

        return build(
            entry, lookup, self.naming, self.runtime(), inv.unit_mib, self._prefix,
            memory_resource=self._memory_resource,
        )
