"""What the agent writes about itself to the API server, from the engine's state: the
node's inventory and enforcement annotations and label, each pod's assignment annotation
(signed when the extender's key is known), and the per-device metric rows; and the
extender's decision keys it reads to follow decisions."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from gpu_share.agent.enforcement import EnforcementStatus
from gpu_share.agent.ports import DeviceRow
from gpu_share.errors import ConfigError
from gpu_share.sharing.annotations import (
    InventoryAnnotation,
    assignment_key,
    encode_assignment,
    encode_inventory,
    enforcement_key,
    inventory_key,
)
from gpu_share.sharing.decision import PREVIOUS_KEY_FILE
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.node.engine import AllocationEngine
from gpu_share.sharing.node.ledger_annotations import pod_assignment


def node_labels(domain: str, status: EnforcementStatus) -> Mapping[str, str | None]:
    """``gpu-share.<domain>/enforcement=<mode>`` while the node can enforce its mode (a
    nodeSelector for pods that need it); removed while it cannot."""
    return {enforcement_key(domain): status.mode.value if status.ready else None}


def node_annotations(domain: str, inventory: InventoryAnnotation,
                     status: EnforcementStatus) -> Mapping[str, str | None]:
    """The node's inventory (``engine.inventory_view``, taken under the agent's lock)
    and enforcement annotations."""
    return {
        inventory_key(domain): encode_inventory(inventory),
        enforcement_key(domain): json.dumps(status.as_doc(), sort_keys=True,
                                            separators=(",", ":")),
    }


def pod_annotations(domain: str, engine: AllocationEngine, node_name: str, namespace: str,
                    name: str) -> Mapping[str, str | None]:
    """The pod's assignment annotation, or its removal once nothing is held for it.
    Signed for this pod's uid on this node when the extender's key is known, so the
    extender's view can tell it from a tenant's copy; unsigned (and ignored by the view)
    while the uid is unknown (degraded) or ambiguous. Under the agent's lock."""
    key = assignment_key(domain)
    doc = pod_assignment(engine.ledger, namespace, name)
    if doc is None:
        return {key: None}
    uids = {e.ref.pod_uid for e in engine.ledger.pod_entries((namespace, name))}
    uid = next(iter(uids)) if len(uids) == 1 else ""
    signer = engine.decision_key
    if signer and uid and node_name:
        return {key: doc.encode(signer, pod_uid=uid, node=node_name)}
    return {key: encode_assignment(doc)}


def device_rows(engine: AllocationEngine, names: ResourceNames,
                cordoned: Callable[[str], bool]) -> list[DeviceRow]:
    """Each device's units used and total per resource, for the metrics."""
    usage = engine.usage()
    return [
        DeviceRow(
            d.uuid,
            d.healthy,
            (
                (names.memory, usage[d.uuid].memory_used, d.memory_units),
                (names.core, usage[d.uuid].cores_used, d.cores),
            ),
            cordoned(d.uuid),
        )
        for d in engine.inventory.devices
    ]


def decision_key(path: str) -> bytes | None:
    """The extender's HMAC key (``placement.decisionKeyFile``), or None when not set."""
    if not path:
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"placement.decisionKeyFile {path} cannot be read: {exc}") from exc
    if not key:
        raise ConfigError(f"placement.decisionKeyFile {path} is empty")
    return key


def previous_decision_keys(path: str) -> tuple[bytes, ...]:
    """The key before the last rotation, from ``previous`` beside the key file (the
    chart's Secret holds it during a rotation); absent or empty: none."""
    if not path:
        return ()
    try:
        key = (Path(path).parent / PREVIOUS_KEY_FILE).read_bytes().strip()
    except OSError:
        return ()
    return (key,) if key else ()
