"""What the node has: devices with their unit capacity and health."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpu_share.devices.base import Device
from gpu_share.errors import AllocationError, AllocationReason
from gpu_share.sharing.ids import UnitTable, unit_id
from gpu_share.sharing.model import AMOUNT_FIELDS, AdvertisedDevice, ResourceKind

CORES_PER_DEVICE = 100


@dataclass(frozen=True)
class DeviceCapacity:
    device: Device
    memory_units: int  # memory_mib // unit_mib
    cores: int = CORES_PER_DEVICE

    @property
    def uuid(self) -> str:
        return self.device.uuid

    @property
    def index(self) -> int:
        return self.device.index

    @property
    def healthy(self) -> bool:
        return self.device.healthy

    @property
    def numa_node(self) -> int | None:
        return self.device.numa_node

    @property
    def model(self) -> str:
        return self.device.model

    def total(self, kind: ResourceKind) -> int:
        return int(getattr(self, AMOUNT_FIELDS[kind]))

    def unit_ids(self, kind: ResourceKind) -> list[str]:
        return [unit_id(self.uuid, kind, i) for i in range(self.total(kind))]


class Inventory:
    """Immutable device table, sorted by device index."""

    def __init__(self, devices: Iterable[DeviceCapacity], unit_mib: int) -> None:
        if unit_mib < 1:
            raise ValueError("unit_mib must be >= 1")
        self.unit_mib = unit_mib
        self._devices = sorted(devices, key=lambda d: (d.index, d.uuid))
        self._by_uuid = {d.uuid: d for d in self._devices}
        if len(self._by_uuid) != len(self._devices):
            raise ValueError("duplicate device uuid in inventory")
        self._tables: dict[ResourceKind, UnitTable] = {}  # built on first use

    @classmethod
    def from_devices(cls, devices: Sequence[Device], unit_mib: int) -> Inventory:
        return cls((DeviceCapacity(d, d.memory_mib // unit_mib) for d in devices), unit_mib)

    @property
    def devices(self) -> list[DeviceCapacity]:
        return list(self._devices)

    def get(self, uuid: str) -> DeviceCapacity | None:
        return self._by_uuid.get(uuid)

    def require(self, uuid: str) -> DeviceCapacity:
        d = self._by_uuid.get(uuid)
        if d is None:
            raise AllocationError(
                f"device {uuid!r} is not on this node", reason=AllocationReason.UNKNOWN_DEVICE
            )
        return d

    def with_health(self, uuid: str, healthy: bool) -> Inventory:
        d = self.require(uuid)
        nd = replace(d, device=replace(d.device, healthy=healthy))
        out = Inventory([nd if x.uuid == uuid else x for x in self._devices], self.unit_mib)
        out._tables = self._tables  # same ids: health is not part of them
        return out

    def units(self, kind: ResourceKind) -> UnitTable:
        """Every id of ``kind`` on this node (unhealthy devices included)."""
        table = self._tables.get(kind)
        if table is None:
            table = UnitTable.build(kind, {d.uuid: d.total(kind) for d in self._devices})
            self._tables[kind] = table
        return table

    def advertised(self, kind: ResourceKind) -> list[AdvertisedDevice]:
        """ListAndWatch content for one resource; an unhealthy device's units are all
        unhealthy."""
        order = self.units(kind).order
        return [
            AdvertisedDevice(id=i, healthy=d.healthy, numa_node=d.numa_node)
            for d in self._devices
            for i in order[d.uuid]
        ]

    def contains_unit(self, device: str, kind: ResourceKind, index: int) -> bool:
        d = self._by_uuid.get(device)
        return d is not None and 0 <= index < d.total(kind)
