"""Builders shared by the sharing tests."""

from __future__ import annotations

from gpu_share.config.model import PlacementPolicyName
from gpu_share.devices.base import Device, DeviceNode
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    PodView,
    ResourceNames,
)
from gpu_share.sharing.node.engine import AllocationEngine, DegradedMode
from gpu_share.sharing.node.ledger import Ledger

NAMES = ResourceNames("vendor.com/vcuda-memory", "vendor.com/vcuda-core")
UNIT_MIB = 1024


def devices(n: int = 3, units: int = 8, numa: tuple[int | None, ...] = ()) -> list[Device]:
    return [
        Device(
            uuid=f"GPU-{i}",
            index=i,
            minor=i,
            memory_mib=units * UNIT_MIB,
            model="Test GPU",
            numa_node=numa[i] if i < len(numa) else 0,
            nodes=(DeviceNode(f"/dev/nvidia{i}", f"/dev/nvidia{i}"),),
        )
        for i in range(n)
    ]


def engine(
    devs: list[Device] | None = None,
    ledger: Ledger | None = None,
    policy: PlacementPolicyName = PlacementPolicyName.BEST_FIT,
    degraded_mode: DegradedMode = "single-device",
) -> AllocationEngine:
    inv = Inventory.from_devices(devs if devs is not None else devices(), UNIT_MIB)
    return AllocationEngine(
        inv,
        ledger if ledger is not None else Ledger(),
        NAMES,
        policy,
        degraded_mode=degraded_mode,
    )


def ctr(
    name: str, mem: int = 0, cores: int = 0, kind: ContainerKind = ContainerKind.APP
) -> ContainerView:
    return ContainerView(name, kind, ContainerRequest(mem, cores))


def pod(
    name: str, *containers: ContainerView, ns: str = "default", created: float = 0.0
) -> PodView:
    return PodView(
        uid=f"uid-{ns}-{name}",
        namespace=ns,
        name=name,
        node_name="node-1",
        containers=tuple(containers),
        created_at=created,
    )
