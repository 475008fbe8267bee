"""The node's annotation values from its own state (pure): the inventory annotation from
the inventory and the ledger's usage, and a pod's assignment from its ledger entries.

The wire format (encoding, decoding, signing) is ``sharing/annotations.py``, which the
extender reads too; only the agent builds the values from a ledger.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_share.sharing.annotations import (
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
)
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.node.ledger import DeviceUsage, Ledger


def inventory_annotation(
    node: str, inventory: Inventory, usage: Mapping[str, DeviceUsage]
) -> InventoryAnnotation:
    """What the node's inventory annotation says (used = held + reserved)."""
    return InventoryAnnotation(
        node,
        inventory.unit_mib,
        tuple(
            InventoryDevice(
                d.uuid, d.index, d.model, d.memory_units, usage[d.uuid].memory_used, d.cores,
                usage[d.uuid].cores_used, d.healthy, d.numa_node, inventory.is_cordoned(d.uuid),
            )
            for d in inventory.devices
        ),
    )


def pod_assignment(ledger: Ledger, namespace: str, name: str) -> PodAssignment | None:
    """What the pod's assignment annotation says; None when we hold nothing for it."""
    entries = ledger.pod_entries((namespace, name))
    if not entries:
        return None
    return PodAssignment(
        {e.ref.container_name: ContainerAssignment(e.shares, e.source.value) for e in entries}
    )
