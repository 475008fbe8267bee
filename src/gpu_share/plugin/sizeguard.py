"""Keep each ListAndWatch answer well below what the kubelet accepts.

The kubelet's gRPC client takes messages up to 4 MiB and silently drops a longer device
list (the resource then shows capacity 0). We refuse to start above 1 MiB, leaving room
for growth, and tell the operator which ``memoryUnitMiB`` would fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpu_share.errors import ConfigError
from gpu_share.plugin import wire
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.sharing.model import AdvertisedDevice

LISTANDWATCH_LIMIT_BYTES = 1 << 20
KUBELET_MAX_MESSAGE_BYTES = 4 << 20
MAX_UNIT_MIB = 1024 * 1024  # AgentConfig.memory_unit_mib's upper bound

# Rebuilds a resource's device list for another memory unit size (MiB).
RebuildFn = Callable[[int], Sequence[AdvertisedDevice]]


def listandwatch_message_size(devices: Sequence[AdvertisedDevice]) -> int:
    """Serialized size in bytes of the ListAndWatchResponse carrying ``devices``."""
    size: int = wire.list_and_watch_response(devices).ByteSize()
    return size


def smallest_fitting_unit_mib(
    rebuild: RebuildFn, current_unit_mib: int, limit_bytes: int = LISTANDWATCH_LIMIT_BYTES
) -> int | None:
    """Smallest power-of-two unit size (MiB) above ``current_unit_mib`` whose list fits.

    The list only shrinks as the unit grows, so when the current size does not fit no
    smaller one does; each step halves the list, so this costs little. None when even
    ``MAX_UNIT_MIB`` does not fit.
    """
    unit = 1
    while unit <= current_unit_mib:
        unit *= 2
    while unit <= MAX_UNIT_MIB:
        if listandwatch_message_size(rebuild(unit)) <= limit_bytes:
            return unit
        unit *= 2
    return None


def check_listandwatch_size(
    resource_name: str,
    devices: Sequence[AdvertisedDevice],
    *,
    unit_mib: int | None = None,
    rebuild: RebuildFn | None = None,
    limit_bytes: int = LISTANDWATCH_LIMIT_BYTES,
) -> int:
    """Return the message size, or raise ``ConfigError`` when it exceeds ``limit_bytes``.

    Pass ``unit_mib`` and ``rebuild`` for the memory resource to get a suggestion of the
    smallest power-of-two ``memoryUnitMiB`` that fits.
    """
    size = listandwatch_message_size(devices)
    if size <= limit_bytes:
        return size
    message = (
        f"{resource_name}: the ListAndWatch device list would be {size} bytes for "
        f"{len(devices)} devices, above the {limit_bytes}-byte limit (the kubelet drops "
        f"lists over {KUBELET_MAX_MESSAGE_BYTES} bytes and the resource would vanish)"
    )
    if unit_mib is not None and rebuild is not None:
        suggestion = smallest_fitting_unit_mib(rebuild, unit_mib, limit_bytes)
        if suggestion is not None:
            message += f"; set memoryUnitMiB to {suggestion} or more (now {unit_mib})"
        else:
            message += "; no memoryUnitMiB fits: use fewer devices per node"
    raise ConfigError(message, reason="DeviceListTooLarge")


# (uuid, number of units, numa node) of one physical device.
UnitGroup = tuple[str, int, int | None]


def unit_list_size(unit_id: Callable[[str, int], str], groups: Sequence[UnitGroup]) -> int:
    """Exact ListAndWatchResponse size for ``groups`` without building the list.

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
                devices=[wire.device_to_pb(AdvertisedDevice(unit_id(uuid, lo), True, numa))]
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
    """Like ``check_listandwatch_size`` but computed from unit counts.

    ``groups_for_unit(unit_mib)`` gives the devices' unit counts for a memory unit size
    (``None``: the configured one). Pass ``unit_mib`` for the memory resource to get the
    smallest power-of-two ``memoryUnitMiB`` that fits in the message.
    """
    groups = groups_for_unit(None)
    size = unit_list_size(unit_id, groups)
    if size <= limit_bytes:
        return size
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
    raise ConfigError(message, reason="DeviceListTooLarge")
