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
    """Immutable device table, sorted by device index.

    ``cordoned``: uuids an admin cordoned (sharing.cordon); a fact apart from health.
    A device is offered for new slices only when healthy and not cordoned."""

    def __init__(
        self, devices: Iterable[DeviceCapacity], unit_mib: int,
        cordoned: Iterable[str] = (),
    ) -> None:
        if unit_mib < 1:
            raise ValueError("unit_mib must be >= 1")
        self.unit_mib = unit_mib
        self._devices = sorted(devices, key=lambda d: (d.index, d.uuid))
        self._by_uuid = {d.uuid: d for d in self._devices}
        if len(self._by_uuid) != len(self._devices):
            raise ValueError("duplicate device uuid in inventory")
        self.cordoned = frozenset(c for c in cordoned if c in self._by_uuid)
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
        out = Inventory([nd if x.uuid == uuid else x for x in self._devices], self.unit_mib,
                        self.cordoned)
        out._tables = self._tables  # same ids: health is not part of them
        return out

    def with_cordons(self, uuids: Iterable[str]) -> Inventory:
        """The same devices with these (and only these) cordoned; unknown uuids are
        dropped (the caller reports them)."""
        out = Inventory(self._devices, self.unit_mib, uuids)
        out._tables = self._tables  # same ids: a cordon is not part of them
        return out

    def is_cordoned(self, uuid: str) -> bool:
        return uuid in self.cordoned

    def offers(self, d: DeviceCapacity) -> bool:
        """New slices may land on ``d``: healthy and not cordoned."""
        return d.healthy and d.uuid not in self.cordoned

    def offered(self) -> list[DeviceCapacity]:
        """The devices new slices may land on, by index."""
        return [d for d in self._devices if self.offers(d)]

    def units(self, kind: ResourceKind) -> UnitTable:
        """Every id of ``kind`` on this node (unhealthy devices included)."""
        table = self._tables.get(kind)
        if table is None:
            table = UnitTable.build(kind, {d.uuid: d.total(kind) for d in self._devices})
            self._tables[kind] = table
        return table

    def advertised(self, kind: ResourceKind) -> list[AdvertisedDevice]:
        """ListAndWatch content for one resource; the units of an unhealthy or cordoned
        device are all unhealthy (the kubelet's only way to stop new pods on them while
        the running ones keep their ids)."""
        order = self.units(kind).order
        return [
            AdvertisedDevice(id=i, healthy=self.offers(d), numa_node=d.numa_node)
            for d in self._devices
            for i in order[d.uuid]
        ]

    def contains_unit(self, device: str, kind: ResourceKind, index: int) -> bool:
        d = self._by_uuid.get(device)
        return d is not None and 0 <= index < d.total(kind)
