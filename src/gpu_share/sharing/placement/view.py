"""The extender's view of one node, from annotations (pure).

Free = total - max(what the agent's inventory says is used, what the pods bound to the
node hold by their assignment annotation, else by their extender decision, plus pending
reservations of binds not yet visible). Taking the larger of both sides keeps a lagging
inventory or an unannotated (degraded) allocation from being double-booked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpu_share.sharing.annotations import (
    AnnotationError,
    InventoryAnnotation,
    PodAssignment,
    assignment_key,
)
from gpu_share.sharing.decision import DecisionError, decision_key, decode_unverified
from gpu_share.sharing.placement.gpu_models import label_form
from gpu_share.sharing.placement.slots import DeviceSlot, NodeSlots

Usage = dict[str, tuple[int, int]]  # device uuid -> (memory units, cores)


def pod_usage(
    annotations: Mapping[str, str], domain: str, totals: Mapping[str, tuple[int, int]]
) -> Usage:
    """What one pod holds, by device; ``totals`` (uuid -> (memory, cores)) sizes whole
    devices of an extender decision."""
    out: Usage = {}

    def add(dev: str, m: int, c: int) -> None:
        om, oc = out.get(dev, (0, 0))
        out[dev] = (om + m, oc + c)

    text = annotations.get(assignment_key(domain))
    if text:
        try:
            for ca in PodAssignment.decode(text).containers.values():
                for s in ca.devices:
                    t = totals.get(s.device, (s.memory_units, s.cores))
                    add(s.device, *(t if s.exclusive else (s.memory_units, s.cores)))
            return out
        except AnnotationError:
            pass  # fall back to the decision
    text = annotations.get(decision_key(domain))
    if text:
        try:
            d = decode_unverified(text)
        except DecisionError:
            return out
        for cd in d.containers.values():
            whole = len(cd.devices) > 1 or cd.request.cores >= 100
            for dev in cd.devices:
                t = totals.get(dev, (0, 0))
                add(dev, *(t if whole else (cd.request.memory_units, cd.request.cores)))
    return out


def node_slots(
    inventory: InventoryAnnotation,
    usages: Iterable[Usage],
    model: str | None = None,
    unavailable: str = "",
) -> NodeSlots:
    """``model``: the node's GPU model as requirements name it (its product label, see
    ``sharing.placement.pod_models.node_model``); default: the inventory's model in label form.
    ``unavailable``: why the node takes no new slice (``annotations.enforcement_problem``)."""
    held: Usage = {}
    for u in usages:
        for dev, (m, c) in u.items():
            om, oc = held.get(dev, (0, 0))
            held[dev] = (om + m, oc + c)
    devices = []
    for d in inventory.devices:
        hm, hc = held.get(d.id, (0, 0))
        used_m = min(d.memory_total, max(d.memory_used, hm))
        used_c = min(d.cores_total, max(d.cores_used, hc))
        devices.append(
            DeviceSlot(
                d.id,
                d.index,
                d.memory_total,
                d.memory_total - used_m,
                d.cores_total,
                d.cores_total - used_c,
                # Placement knows one fact: may a new slice land here. A cordoned
                # device keeps its running slices but takes no new one.
                d.healthy and not d.cordoned,
            )
        )
    return NodeSlots(
        inventory.node,
        tuple(sorted(devices, key=lambda x: x.index)),
        model=(
            model
            if model is not None
            else label_form(inventory.devices[0].model if inventory.devices else "")
        ),
        unavailable=unavailable,
    )
