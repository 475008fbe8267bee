"""Free units per device, as one container sees them at one kubelet call.

Free = capacity - usage (held + reserved) + the container's reuse pool (ids of its
pod's init containers that the kubelet will hand it); for the kind of the call also
capped by what the kubelet lists as ``available`` on that device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_share.sharing.ids import tally_devices
from gpu_share.sharing.inventory import DeviceCapacity, Inventory
from gpu_share.sharing.model import PerKind, ResourceKind
from gpu_share.sharing.node.device_policy import DeviceState
from gpu_share.sharing.node.ledger import DeviceUsage, Ledger, LedgerEntry, PodKey


@dataclass(frozen=True)
class FreeView:
    inventory: Inventory
    usage: Mapping[str, DeviceUsage]
    pod: PodKey  # the container's pod: its own holdings never block it
    pools: PerKind[Mapping[str, int]]  # reuse-pool ids per device
    kind: ResourceKind  # the call's kind
    listed: Mapping[str, int] | None  # the call's ``available`` per device

    @staticmethod
    def of(
        inventory: Inventory,
        ledger: Ledger,
        entry: LedgerEntry,
        kind: ResourceKind,
        available: Sequence[str] | None,
    ) -> FreeView:
        """``available`` must be validated ids (``parse_unit_ids``)."""
        return FreeView(
            inventory,
            ledger.usage(inventory),
            entry.pod_key,
            PerKind.build(lambda k: tally_devices(ledger.reuse_pool(entry, k))),
            kind,
            None if available is None else tally_devices(available),
        )

    def blocked(self, uuid: str) -> bool:
        """Another pod holds the device exclusively."""
        return bool(self.usage[uuid].exclusive_pods - {self.pod})

    def wholly_free(self, uuid: str) -> bool:
        """No other pod holds or reserves any part of the device."""
        return not (self.usage[uuid].pods - {self.pod})

    def free(self, d: DeviceCapacity, kind: ResourceKind) -> int:
        """May be negative (a ledger holding more than the device has)."""
        n = d.total(kind) - self.usage[d.uuid].used(kind) + self.pools[kind].get(d.uuid, 0)
        if kind is self.kind and self.listed is not None:
            n = min(n, self.listed.get(d.uuid, 0))
        return n

    def free_for_extend(self, uuid: str, kind: ResourceKind) -> int:
        d = self.inventory.require(uuid)
        return 0 if self.blocked(uuid) else max(0, self.free(d, kind))

    def state(self, d: DeviceCapacity) -> DeviceState:
        return DeviceState(
            d.uuid,
            d.index,
            d.numa_node,
            d.memory_units,
            self.free(d, ResourceKind.MEMORY),
            d.cores,
            self.free(d, ResourceKind.CORE),
        )

    def pool_devices(self, kind: ResourceKind | None = None) -> set[str]:
        """Devices the reuse pool (of ``kind``, or of both) is on."""
        kinds = list(ResourceKind) if kind is None else [kind]
        return {d for k in kinds for d in self.pools[k]}
