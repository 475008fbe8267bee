"""Keep each ListAndWatch answer well below what the kubelet accepts.

The kubelet's gRPC client takes messages up to 4 MiB and silently drops a longer device
list (the resource then shows capacity 0). We refuse to start above 1 MiB, leaving room
for growth, and tell the operator which ``memoryUnitMiB`` would fit.

``check_devices`` is the one check of a config against a node's devices: the agent runs
it at start (``cli.plugin_main``) and ``gpu-share config validate`` runs it against a
device description, so both reach the same verdict with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpu_share.config.loader import InvalidConfigError, Problem
from gpu_share.config.model import MAX_MEMORY_UNIT_MIB, AgentConfig, ProblemKind
from gpu_share.devices.base import Device
from gpu_share.errors import ConfigError
from gpu_share.plugin import wire
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.sharing.ids import unit_id as _unit_id
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import AdvertisedDevice, PerKind, ResourceKind

LISTANDWATCH_LIMIT_BYTES = 1 << 20
KUBELET_MAX_MESSAGE_BYTES = 4 << 20
MAX_UNIT_MIB = MAX_MEMORY_UNIT_MIB
# ConfigError.reason (metric label, Event reason) of each device problem.
REASONS: dict[str, str] = {
    ProblemKind.DEVICE_SMALLER_THAN_UNIT: "DeviceSmallerThanUnit",
    ProblemKind.DEVICE_LIST_TOO_LARGE: "DeviceListTooLarge",
}

def listandwatch_message_size(devices: Sequence[AdvertisedDevice]) -> int:
    """Serialized size in bytes of the ListAndWatchResponse carrying ``devices``."""
    size: int = wire.list_and_watch_response(devices).ByteSize()
    return size


# (uuid, number of units, numa node) of one physical device.
UnitGroup = tuple[str, int, int | None]


def unit_list_size(unit_id: Callable[[str, int], str], groups: Sequence[UnitGroup]) -> int:
    """Exact ListAndWatchResponse size for ``groups`` when every unit is unhealthy.

    Unhealthy is the longest health string, so the size is the largest the list can
    reach as health changes: the verdict does not depend on the state at start.
    An entry's size depends only on its id's length, which changes only with the digit
    count of the unit index: one sample message per (device, digit count) suffices, so
    a configuration with millions of units is checked in microseconds.
    """
    total = 0
    for uuid, count, numa in groups:
        lo = 0
        digits = 1
        while lo < count:
            hi = min(count, 10**digits)
            sample = dp.ListAndWatchResponse(
                devices=[wire.device_to_pb(AdvertisedDevice(unit_id(uuid, lo), False, numa))]
            ).ByteSize()
            total += sample * (hi - lo)
            lo = hi
            digits += 1
    return total


def check_unit_lists(
    resource_name: str,
    unit_id: Callable[[str, int], str],
    groups_for_unit: Callable[[int | None], Sequence[UnitGroup]],
    *,
    unit_mib: int | None = None,
    limit_bytes: int = LISTANDWATCH_LIMIT_BYTES,
) -> int:
    """Return the ListAndWatch message size of the unit lists, or raise ``ConfigError``
    when it exceeds ``limit_bytes`` (computed from unit counts, not built lists).

    ``groups_for_unit(unit_mib)`` gives the devices' unit counts for a memory unit size
    (``None``: the configured one). Pass ``unit_mib`` for the memory resource to get the
    smallest power-of-two ``memoryUnitMiB`` that fits in the message.
    """
    size, message = _unit_lists_problem(
        resource_name, unit_id, groups_for_unit, unit_mib=unit_mib, limit_bytes=limit_bytes
    )
    if message:
        raise ConfigError(message, reason="DeviceListTooLarge")
    return size


def _unit_lists_problem(
    resource_name: str,
    unit_id: Callable[[str, int], str],
    groups_for_unit: Callable[[int | None], Sequence[UnitGroup]],
    *,
    unit_mib: int | None,
    limit_bytes: int,
) -> tuple[int, str]:
    """(size, "") when the list fits, else (size, why with a suggestion)."""
    groups = groups_for_unit(None)
    size = unit_list_size(unit_id, groups)
    if size <= limit_bytes:
        return size, ""
    n = sum(g[1] for g in groups)
    message = (
        f"{resource_name}: the ListAndWatch device list would be {size} bytes for {n} "
        f"devices, above the {limit_bytes}-byte limit (the kubelet drops lists over "
        f"{KUBELET_MAX_MESSAGE_BYTES} bytes and the resource would vanish)"
    )
    if unit_mib is not None:
        unit = 1
        while unit <= unit_mib:
            unit *= 2
        while unit <= MAX_UNIT_MIB and unit_list_size(unit_id, groups_for_unit(unit)) > limit_bytes:
            unit *= 2
        if unit <= MAX_UNIT_MIB:
            message += f"; set memoryUnitMiB to {unit} or more (now {unit_mib})"
        else:
            message += "; no memoryUnitMiB fits: use fewer devices per node"
    return size, message


# --------------------------------------------------------------------------- config x devices


def check_devices(cfg: AgentConfig, devices: Sequence[Device]) -> list[Problem]:
    """Every reason ``cfg`` cannot serve ``devices`` (empty: it can).

    Checked: no device is smaller than one memory unit (it would offer no memory), and
    each resource's ListAndWatch answer fits (``LISTANDWATCH_LIMIT_BYTES``, counted with
    every unit unhealthy, the longest form). Unit counts come from ``Inventory``, as the
    agent computes them.
    """
    problems: list[Problem] = []
    unit = cfg.memory_unit_mib
    small = sorted((d for d in devices if d.memory_mib < unit), key=lambda d: d.memory_mib)
    if small:
        first = small[0]
        more = f" and {len(small) - 1} more" if len(small) > 1 else ""
        problems.append(Problem(
            "memoryUnitMiB",
            ProblemKind.DEVICE_SMALLER_THAN_UNIT,
            f"{len(small)} device(s) smaller than one memory unit of {unit} MiB "
            f"(device index {first.index} has {first.memory_mib} MiB{more}): they would "
            "offer no memory; "
            f"set memoryUnitMiB to {max(first.memory_mib, 1)} or less",
        ))
    resources = PerKind(cfg.resources.memory_resource, cfg.resources.core_resource)
    # Only the memory list shrinks with a setting (the unit size): name it.
    keys = PerKind("memoryUnitMiB", "")
    for kind in ResourceKind:
        message = _list_problem(resources[kind], kind, devices, unit)
        if message:
            problems.append(Problem(keys[kind], ProblemKind.DEVICE_LIST_TOO_LARGE, message))
    return problems


def _list_problem(
    resource: str, kind: ResourceKind, devices: Sequence[Device], unit_mib: int
) -> str:
    def ids(uuid: str, i: int) -> str:
        return _unit_id(uuid, kind, i)

    def groups(size: int | None) -> list[UnitGroup]:
        inventory = Inventory.from_devices(devices, size or unit_mib)
        return [(d.uuid, d.total(kind), d.numa_node) for d in inventory.devices]

    _, message = _unit_lists_problem(
        resource,
        ids,
        groups,
        unit_mib=PerKind[int | None](unit_mib, None)[kind],
        limit_bytes=LISTANDWATCH_LIMIT_BYTES,
    )
    return message


def described_devices(count: int, memory_mib: int) -> list[Device]:
    """``count`` devices of ``memory_mib`` shaped like NVML's, for checks without hardware.

    Their ListAndWatch entries are as long as any real NVML device's can be: uuids of
    NVML's fixed length ("GPU-" and 36 characters) and NUMA node 1 (node 0 and no node
    encode shorter; nodes up to 127 encode the same). A description these pass, real
    devices of that count and memory pass too.
    """
    return [
        Device(
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
            index=i,
            minor=i,
            memory_mib=memory_mib,
            model="described",
            numa_node=1,
        )
        for i in range(count)
    ]


def guard_devices(cfg: AgentConfig, devices: Sequence[Device]) -> None:
    """Raise ``InvalidConfigError`` listing every ``check_devices`` problem."""
    problems = check_devices(cfg, devices)
    if problems:
        raise InvalidConfigError(problems, reason=REASONS[problems[0].kind])

