"""Device usage kept current as entries change: each pod's part (held units, devices,
exclusive devices, what its decided kinds reserve) summed per device."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_share.sharing.ids import device_of, tally_devices
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ResourceKind,
)
from gpu_share.sharing.node.ledger_entry import DeviceUsage, LedgerEntry, PodKey

if TYPE_CHECKING:
    from gpu_share.sharing.node.ledger import Ledger

@dataclass(frozen=True)
class _PodPart:
    """One pod's contribution to usage: its held units, the devices it is on (held or
    decided), those it holds exclusively, and what its decided kinds reserve."""

    units: tuple[tuple[str, ResourceKind, str], ...]
    devices: frozenset[str]
    exclusive: frozenset[str]
    reserved: tuple[tuple[str, ResourceKind, int], ...]


def pod_part(ledger: Ledger, entries: Iterable[LedgerEntry]) -> _PodPart:
    units: list[tuple[str, ResourceKind, str]] = []
    devices: set[str] = set()
    exclusive: set[str] = set()
    reserved: list[tuple[str, ResourceKind, int]] = []
    for e in entries:
        for kind in ResourceKind:
            units.extend((device_of(u), kind, u) for u in e.ids(kind))
        devices.update(s.device for s in e.shares)
        exclusive.update(s.device for s in e.shares if s.exclusive)
        reserved.extend(_reserved(ledger, e))
    devices.update(d for d, _k, _u in units)
    return _PodPart(tuple(units), frozenset(devices), frozenset(exclusive), tuple(reserved))


def _reserved(ledger: Ledger, e: LedgerEntry) -> list[tuple[str, ResourceKind, int]]:
    """A decided, not yet allocated kind reserves its share, less the reuse pool the
    kubelet will hand the container on that device."""
    out = []
    for kind in ResourceKind:
        if e.allocated(kind):
            continue
        pool = tally_devices(ledger.reuse_pool(e, kind)) if e.order >= 0 else {}
        for s in e.shares:
            need = max(0, s.amount(kind) - pool.get(s.device, 0))
            if need:
                out.append((s.device, kind, need))
    return out


class Accounts:
    """Usage summed over pods' parts; a pod's part is taken out and put back whole
    whenever one of its entries changes."""

    def __init__(self) -> None:
        self._parts: dict[PodKey, _PodPart] = {}
        self._held: dict[tuple[str, ResourceKind], dict[str, int]] = {}  # unit -> holders
        self._pods: dict[str, set[PodKey]] = {}
        self._exclusive: dict[str, set[PodKey]] = {}
        self._reserved: dict[tuple[str, ResourceKind], int] = {}

    def add(self, key: PodKey, part: _PodPart) -> None:
        self._parts[key] = part
        for dev, kind, unit in part.units:
            held = self._held.setdefault((dev, kind), {})
            held[unit] = held.get(unit, 0) + 1
        for dev in part.devices:
            self._pods.setdefault(dev, set()).add(key)
        for dev in part.exclusive:
            self._exclusive.setdefault(dev, set()).add(key)
        for dev, kind, n in part.reserved:
            self._reserved[(dev, kind)] = self._reserved.get((dev, kind), 0) + n

    def drop(self, key: PodKey) -> None:
        part = self._parts.pop(key, None)
        if part is None:
            return
        for dev, kind, unit in part.units:
            held = self._held[(dev, kind)]
            held[unit] -= 1
            if not held[unit]:
                del held[unit]
        for dev in part.devices:
            self._pods[dev].discard(key)
        for dev in part.exclusive:
            self._exclusive[dev].discard(key)
        for dev, kind, n in part.reserved:
            self._reserved[(dev, kind)] -= n

    def _used(self, uuid: str, kind: ResourceKind) -> int:
        return len(self._held.get((uuid, kind), ())) + self._reserved.get((uuid, kind), 0)

    def of(self, inventory: Inventory) -> dict[str, DeviceUsage]:
        out = {}
        for d in inventory.devices:
            du = DeviceUsage(
                pods=set(self._pods.get(d.uuid, ())),
                exclusive_pods=set(self._exclusive.get(d.uuid, ())),
            )
            if du.exclusive_pods:
                du.memory_used, du.cores_used = d.memory_units, d.cores
            else:
                du.memory_used, du.cores_used = (
                    self._used(d.uuid, k) for k in (ResourceKind.MEMORY, ResourceKind.CORE)
                )
            out[d.uuid] = du
        return out
