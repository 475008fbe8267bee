"""The rows ``kubectl gpu-share`` prints from a snapshot (``kubectl_snapshot``): devices
by node, and which container holds which slice."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from gpu_share.cli.kubectl_snapshot import PodInfo, Snapshot
from gpu_share.sharing.annotations import AnnotationError, PodAssignment, assignment_key
from gpu_share.sharing.cordon import Cordon
from gpu_share.sharing.decision import DecisionError, decision_key, decode_unverified
from gpu_share.sharing.placement import DeviceSlot


@dataclass(frozen=True)
class DeviceRow:
    node: str
    index: int
    id: str
    model: str
    healthy: bool
    numa: int | None
    unit_mib: int
    memory_total: int
    memory_used: int
    cores_total: int
    cores_used: int
    pods: tuple[str, ...]
    cordoned: bool = False  # the agent honours a cordon (its inventory says so)
    cordon: Cordon | None = None  # who and why, from the node's cordon annotation


@dataclass(frozen=True)
class NodeRow:
    name: str
    pool: str
    unit_mib: int
    devices: tuple[DeviceRow, ...]
    pods: tuple[str, ...]
    largest_free: tuple[int, int] | None  # (memory units, cores) of one healthy device


def largest_free(devices: Sequence[DeviceSlot]) -> tuple[int, int] | None:
    """The biggest single-device block a new container could get: the healthy device
    with the most free memory, then the most free cores (None: no healthy device)."""
    healthy = [(d.memory_free, d.cores_free) for d in devices if d.healthy]
    return max(healthy) if healthy else None


def node_rows(snap: Snapshot, *, unhealthy_only: bool = False,
              names: Sequence[str] = (), cordoned_only: bool = False) -> list[NodeRow]:
    """One row per node with a readable inventory, devices by index; ``unhealthy_only``
    (``cordoned_only``) keeps only unhealthy (cordoned) devices and their nodes."""
    out = []
    for name in sorted(snap.nodes):
        info = snap.nodes[name]
        slots = snap.slots(name)
        if slots is None or info.inventory is None or (names and name not in names):
            continue
        holders: dict[str, set[str]] = {}
        for ref, usage in snap.usages(name).items():
            for dev in usage:
                holders.setdefault(dev, set()).add(ref)
        models = {d.id: d for d in info.inventory.devices}
        # Health from the inventory: the slot's flag also folds in the cordon.
        devices = tuple(
            DeviceRow(name, d.index, d.uuid, models[d.uuid].model, models[d.uuid].healthy,
                      models[d.uuid].numa, info.inventory.unit_mib, d.memory_total,
                      d.memory_total - d.memory_free, d.cores_total,
                      d.cores_total - d.cores_free, tuple(sorted(holders.get(d.uuid, ()))),
                      models[d.uuid].cordoned, info.cordons.get(d.uuid))
            for d in slots.devices
            if not (unhealthy_only and models[d.uuid].healthy)
            and not (cordoned_only and not models[d.uuid].cordoned)
        )
        filtered = unhealthy_only or cordoned_only
        if filtered and not devices:
            continue
        pods = sorted({p for d in devices for p in d.pods} if filtered
                      else {p for refs in holders.values() for p in refs})
        out.append(NodeRow(name, info.labels.get(snap.settings.pool_label, ""),
                           info.inventory.unit_mib, devices, tuple(pods),
                           largest_free(slots.devices)))
    return out


def node_problems(snap: Snapshot) -> list[str]:
    return [f"node {n.name}: {why}" for n in snap.nodes.values()
            for why in (n.problem, n.unavailable) if why]


@dataclass(frozen=True)
class SliceRow:
    namespace: str
    pod: str
    container: str
    node: str
    device: str  # uuid ("" while nothing is assigned)
    index: int | None  # the device's index on its node, when the node's inventory is known
    memory_units: int
    cores: int
    unit_mib: int | None
    exclusive: bool
    source: str  # the assignment's source, "extender (decided)", or "pending"
    signed: bool
    created: str


def _decided(p: PodInfo, domain: str) -> list[tuple[str, str, int, int, bool]]:
    text = p.annotations.get(decision_key(domain))
    if not text:
        return []
    try:
        d = decode_unverified(text)
    except DecisionError:
        return []
    return [
        (name, dev, cd.request.memory_units, cd.request.cores,
         len(cd.devices) > 1 or cd.request.cores >= 100)
        for name, cd in sorted(d.containers.items())
        for dev in cd.devices
    ]


def _assigned(p: PodInfo, domain: str) -> tuple[list[tuple[str, str, int, int, bool, str]], bool]:
    text = p.annotations.get(assignment_key(domain))
    if not text:
        return [], False
    try:
        doc = PodAssignment.decode(text)
    except AnnotationError:
        return [], False
    rows = [
        (name, s.device, s.memory_units, s.cores, s.exclusive, c.source)
        for name, c in sorted(doc.containers.items())
        for s in c.devices
    ]
    try:
        signed = bool(json.loads(text).get("sig"))
    except (ValueError, AttributeError, RecursionError):
        signed = False
    return rows, signed


def slice_rows(snap: Snapshot) -> list[SliceRow]:
    """Which container holds which slice: the assignment the agent wrote; else the
    extender's decision (placed, not yet allocated); else the ask, pending."""
    domain = snap.settings.domain
    out: list[SliceRow] = []
    for p in sorted(snap.pods, key=lambda x: (x.namespace, x.name)):
        info = snap.nodes.get(p.node)
        inv = info.inventory if info is not None else None
        index = {d.id: d.index for d in inv.devices} if inv is not None else {}
        unit = inv.unit_mib if inv is not None else None
        assigned, signed = _assigned(p, domain)
        rows = [(c, dev, m, k, x, src) for c, dev, m, k, x, src in assigned]
        if not rows:
            rows = [(c, dev, m, k, x, "extender (decided)") for c, dev, m, k, x in
                    _decided(p, domain)]
        if not rows:
            rows = [(name, "", r.memory_units, r.cores, False, "pending")
                    for name, r in p.ask.asking.items()]
        out.extend(
            SliceRow(p.namespace, p.name, c, p.node, dev, index.get(dev), m, k, unit, x, src,
                     signed, p.created)
            for c, dev, m, k, x, src in rows
        )
    return out
