"""Fake device IDs that encode the physical device.

The kubelet only sees opaque IDs, one per unit: ``<uuid>::mem::<i>`` for a memory unit
and ``<uuid>::core::<i>`` for one percent of a device's cores (``i`` from 0). Any ID
names its device, so placement can be checked from the IDs alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_share.errors import AllocationError
from gpu_share.sharing.model import ResourceKind

SEPARATOR = "::"
_TAG = {ResourceKind.MEMORY: "mem", ResourceKind.CORE: "core"}
_KIND_OF_TAG = {tag: kind for kind, tag in _TAG.items()}


@dataclass(frozen=True, order=True)
class UnitId:
    device: str
    kind: ResourceKind
    index: int

    def __str__(self) -> str:
        return unit_id(self.device, self.kind, self.index)


def unit_id(uuid: str, kind: ResourceKind, i: int) -> str:
    if not uuid or SEPARATOR in uuid:
        raise AllocationError(f"device uuid {uuid!r} cannot be encoded", reason="UnknownDevice")
    if i < 0:
        raise AllocationError(f"unit index {i} is negative", reason="UnknownDevice")
    return f"{uuid}{SEPARATOR}{_TAG[kind]}{SEPARATOR}{i}"


def parse_unit_id(s: str) -> UnitId:
    """Raises AllocationError(reason="UnknownDevice") naming ``s`` when malformed."""
    parts = s.split(SEPARATOR)
    if len(parts) != 3 or not parts[0] or parts[1] not in _KIND_OF_TAG:
        raise AllocationError(f"device id {s!r} is not one of ours", reason="UnknownDevice")
    raw = parts[2]
    if not raw.isdigit() or (len(raw) > 1 and raw[0] == "0"):
        raise AllocationError(f"device id {s!r} has a bad unit index", reason="UnknownDevice")
    return UnitId(parts[0], _KIND_OF_TAG[parts[1]], int(raw))


def parse_unit_ids(ids: Iterable[str], kind: ResourceKind | None = None) -> list[UnitId]:
    """Parse all ``ids``; with ``kind``, each must be a unit of that kind."""
    out: list[UnitId] = []
    for s in ids:
        u = parse_unit_id(s)
        if kind is not None and u.kind is not kind:
            raise AllocationError(
                f"device id {s!r} is a {u.kind.value} unit, expected {kind.value}",
                reason="UnknownDevice",
            )
        out.append(u)
    return out


def group_by_device(ids: Iterable[str]) -> dict[str, list[UnitId]]:
    """Parsed ids per device uuid; units sorted by index, devices in first-seen order."""
    out: dict[str, list[UnitId]] = {}
    for u in parse_unit_ids(ids):
        out.setdefault(u.device, []).append(u)
    for units in out.values():
        units.sort()
    return out


def devices_of(ids: Iterable[str]) -> set[str]:
    return {u.device for u in parse_unit_ids(ids)}


def count_by_device(ids: Iterable[str]) -> dict[str, int]:
    return {d: len(us) for d, us in group_by_device(ids).items()}
