"""What ``kubectl gpu-share`` shows, computed from one LIST of nodes and one of pods.

The node's free space is the extender's: ``sharing.placement.view.node_slots`` over the
agent's inventory and the pods' annotations, host CPU/memory = allocatable minus the
requests of every bound pod. One difference: the plugin has no decision key, so pod
annotations count unverified (a forged one can make a node look fuller, never emptier:
free is ``total - max(inventory used, annotated)``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_share.errors import GpuShareError
from gpu_share.extender.core import Extender, ExtenderSettings, pod_ask
from gpu_share.extender.ports import ClusterView
from gpu_share.sharing.annotations import (
    AnnotationError,
    InventoryAnnotation,
    PodAssignment,
    assignment_key,
    enforcement_key,
    enforcement_problem,
    inventory_key,
)
from gpu_share.sharing.cordon import Cordon, scan_cordons
from gpu_share.sharing.decision import DecisionError, decision_key, decode_unverified
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.model_req import DEFAULT_MODEL_LABEL, node_model
from gpu_share.sharing.placement import (
    ClusterPolicy,
    DeviceSlot,
    NodeSlots,
    Placement,
    Shape,
    Workload,
    evaluate_node,
    make_policy,
    model_free,
)
from gpu_share.sharing.placement.view import Usage, node_slots, pod_usage
from gpu_share.sharing.pod_request import PodRequest, read_pod_request
from gpu_share.sharing.quantity import QuantityError, cpu_milli, memory_mib

DEFAULT_WORKLOAD = "4:25,8:50,16:100"  # the extender's --default-workload default
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Settings:
    domain: str = "vendor.com"
    memory_name: str = "vcuda-memory"
    core_name: str = "vcuda-core"
    model_label: str = DEFAULT_MODEL_LABEL

    @property
    def names(self) -> ResourceNames:
        return ResourceNames(f"{self.domain}/{self.memory_name}", f"{self.domain}/{self.core_name}")

    @property
    def pool_label(self) -> str:
        return f"gpu-share.{self.domain}/pool"  # docs/chart.md: one value per node pool


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    inventory: InventoryAnnotation | None
    problem: str  # why the inventory is unreadable ("" when fine or absent)
    cpu: int | None  # allocatable millicores
    memory: int | None  # allocatable MiB
    # Cordons by device uuid, as the annotations say (the agent's inventory says
    # whether it honours them: ``cordoned``).
    cordons: Mapping[str, Cordon] = field(default_factory=dict)
    unavailable: str = ""  # why the agent takes no new slice (its enforcement)


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node: str
    created: str
    annotations: Mapping[str, str]
    ask: PodRequest

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _node_info(obj: Mapping[str, Any], s: Settings) -> NodeInfo:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    text = (meta.get("annotations") or {}).get(inventory_key(s.domain))
    inv, problem = None, ""
    if text:
        try:
            inv = InventoryAnnotation.decode(text)
        except AnnotationError as e:
            problem = str(e)
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    try:
        cpu = cpu_milli(alloc["cpu"], up=False) if "cpu" in alloc else None
        mem = memory_mib(alloc["memory"], up=False) if "memory" in alloc else None
    except QuantityError:
        cpu = mem = None
    cordons = scan_cordons(
        {k: v for k, v in (meta.get("annotations") or {}).items() if isinstance(v, str)},
        s.domain, {d.id for d in inv.devices} if inv is not None else (),
    ).cordons
    unavailable = enforcement_problem(
        (meta.get("annotations") or {}).get(enforcement_key(s.domain)))
    return NodeInfo(name, dict(meta.get("labels") or {}), inv, problem, cpu, mem, cordons,
                    unavailable)


def _pod_info(obj: Mapping[str, Any], s: Settings) -> PodInfo:
    meta = obj.get("metadata") or {}
    names = s.names
    return PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str((obj.get("spec") or {}).get("nodeName") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        annotations={k: v for k, v in (meta.get("annotations") or {}).items()
                     if isinstance(v, str)},
        ask=read_pod_request(obj, names.memory, names.core, domain=s.domain,
                             model_label=s.model_label),
    )


@dataclass
class Snapshot:
    """The cluster as one LIST of nodes and one of pods saw it (terminal pods dropped)."""

    settings: Settings
    nodes: dict[str, NodeInfo]
    pods: list[PodInfo]
    _by_node: dict[str, list[PodInfo]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for p in self.pods:
            if p.node:
                self._by_node.setdefault(p.node, []).append(p)

    @classmethod
    def from_lists(cls, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                   settings: Settings) -> Snapshot:
        infos = (_node_info(n, settings) for n in nodes)
        live = (p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL)
        return cls(settings, {n.name: n for n in infos}, [_pod_info(p, settings) for p in live])

    def pods_on(self, node: str) -> list[PodInfo]:
        return self._by_node.get(node, [])

    def usages(self, node: str) -> dict[str, Usage]:
        """pod ref -> what it holds by device, for the annotated pods bound to ``node``."""
        info = self.nodes.get(node)
        if info is None or info.inventory is None:
            return {}
        totals = {d.id: (d.memory_total, d.cores_total) for d in info.inventory.devices}
        out = {}
        for p in self.pods_on(node):
            u = pod_usage(p.annotations, self.settings.domain, totals)
            if u:
                out[p.ref] = u
        return out

    def slots(self, node: str) -> NodeSlots | None:
        """The node as the extender's filter sees it (None: no readable inventory)."""
        info = self.nodes.get(node)
        if info is None or info.inventory is None:
            return None
        base = node_slots(
            info.inventory,
            self.usages(node).values(),
            node_model(info.labels, self.settings.model_label,
                       info.inventory.devices[0].model if info.inventory.devices else ""),
            info.unavailable,
        )
        # Every bound pod, ours or not, takes host CPU/memory.
        on = self.pods_on(node)
        cpu_used, mem_used = sum(p.ask.cpu for p in on), sum(p.ask.memory for p in on)
        return replace(
            base,
            cpu_free=None if info.cpu is None else info.cpu - cpu_used,
            host_memory_free=None if info.memory is None else info.memory - mem_used,
        )


# ---------------------------------------------------------------- nodes


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


# ---------------------------------------------------------------- pods


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


# ---------------------------------------------------------------- fit


def parse_workload(text: str) -> Workload:
    """``memoryUnits:cores[:weight],...`` (the extender's --default-workload)."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        f = part.split(":")
        if len(f) not in (2, 3):
            raise ValueError(f"workload entry {part!r} is not memoryUnits:cores[:weight]")
        shapes.append(Shape(int(f[0]), int(f[1]), float(f[2]) if len(f) > 2 else 1.0))
    return Workload(shapes)


class SnapshotView:
    """``extender.ports.ClusterView`` over a snapshot: what the extender would see."""

    def __init__(self, snap: Snapshot, default_workload: Workload) -> None:
        self.snap = snap
        self._default = default_workload
        self._slots: dict[str, NodeSlots | None] = {}
        self._workload: Workload | None = None

    def nodes(self, names: Sequence[str]) -> dict[str, NodeSlots | None]:
        return {n: self.node(n) for n in names}

    def node(self, name: str) -> NodeSlots | None:
        if name not in self._slots:
            self._slots[name] = self.snap.slots(name)
        return self._slots[name]

    def workload(self) -> Workload:
        """The asks of the pods seen, as the extender's view mixes them; else the default.
        One object per snapshot, so a policy's memo serves filter, prioritize and fit."""
        if self._workload is None:
            self._workload = self._mix()
        return self._workload

    def _mix(self) -> Workload:
        counts: dict[tuple[int, int, int, int, str], tuple[Shape, int]] = {}
        for p in self.snap.pods:
            for c in p.ask.containers:
                r = c.request
                if r.empty:
                    continue
                k = (r.memory_units, r.cores, p.ask.cpu, p.ask.memory, str(p.ask.models))
                shape, n = counts.get(k, (Shape(r.memory_units, r.cores, 1.0, p.ask.cpu,
                                                p.ask.memory, p.ask.models), 0))
                counts[k] = (shape, n + 1)
        if not counts:
            return self._default
        return Workload(replace(s, weight=float(n)) for _, (s, n) in sorted(counts.items()))

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        raise GpuShareError("kubectl gpu-share is read-only")

    def unreserve(self, pod_uid: str, node: str) -> None:
        raise GpuShareError("kubectl gpu-share is read-only")

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None


class _NoBinder:
    def annotate_and_bind(self, namespace: str, name: str, uid: str, node: str,
                          annotations: Mapping[str, str]) -> None:
        raise GpuShareError("kubectl gpu-share is read-only")


@dataclass(frozen=True)
class FitRow:
    node: str
    score: int  # the extender's priority (10 = its pick)
    devices: tuple[tuple[str, int, str], ...]  # (container, device index, uuid)
    free: tuple[int, int] | None  # largest free block before placement


@dataclass(frozen=True)
class FitResult:
    fits: tuple[FitRow, ...]  # best first
    failed: Mapping[str, str]  # node -> the extender filter's reason
    error: str  # the filter's error (a malformed ask), else ""


def probe_pod(settings: Settings, memory: int, cores: int, *, cpu: str | None = None,
              host_memory: str | None = None, model: str | None = None,
              containers: int = 1) -> dict[str, Any]:
    """The pod whose fit is asked: ``containers`` containers of that shape."""
    names = settings.names
    limits: dict[str, Any] = {names.memory: str(memory), names.core: str(cores)}
    if cpu:
        limits["cpu"] = cpu
    if host_memory:
        limits["memory"] = host_memory
    spec: dict[str, Any] = {
        "containers": [{"name": "main" if containers == 1 else f"c{i}",
                        "resources": {"limits": limits, "requests": limits}}
                       for i in range(containers)]
    }
    if model:
        spec["nodeSelector"] = {settings.model_label: model}
    return {"metadata": {"name": "gpu-share-fit", "namespace": "default"}, "spec": spec}


def _policy(name: str) -> Callable[[ClusterView], ClusterPolicy]:
    """The extender's policy factory: one policy per workload object (its memo)."""
    made: dict[int, tuple[Workload | None, ClusterPolicy]] = {}

    def make(view: ClusterView) -> ClusterPolicy:
        w = view.workload() if name == "fgd" else None
        got = made.get(0)
        if got is None or got[0] is not w:
            got = made[0] = (w, make_policy(name, w))
        return got[1]

    return make


def fit(view: SnapshotView, pod: Mapping[str, Any], names: Sequence[str],
        policy: str = "fgd") -> FitResult:
    """Run the extender's own filter and prioritize over ``names`` for ``pod``; the
    devices of each fitting node are what the same policy would pick there."""
    s = view.snap.settings
    policies = _policy(policy)
    ext = Extender(ExtenderSettings(s.names, s.domain, b"", model_label=s.model_label),
                   view, _NoBinder(), policies)
    # As a nodeCacheCapable scheduler calls it: node names, no node objects.
    got = ext.filter({"Pod": pod, "Nodes": {"items": []}, "NodeNames": list(names)})
    if got.get("Error"):
        return FitResult((), {}, str(got["Error"]))
    kept = list(got.get("NodeNames") or [])
    failed = dict(got.get("FailedNodes") or {})
    if not kept:
        return FitResult((), failed, "")
    ranked = ext.prioritize({"Pod": pod, "Nodes": {"items": []}, "NodeNames": kept})
    scores = {h["Host"]: h["Score"] for h in ranked}
    demand = pod_ask(pod, ext.settings).demand()
    chosen = policies(view)
    slots = {n: view.node(n) for n in kept}
    prices = chosen.prices(model_free(x for x in slots.values() if x is not None)
                           if chosen.priced else {})
    rows = []
    for n in kept:
        sl = slots[n]
        r = evaluate_node(chosen, sl, demand, prices) if sl is not None else None
        devs = (tuple((cp.container, d.index, d.uuid) for cp in r.containers for d in cp.devices)
                if isinstance(r, Placement) else ())
        rows.append(FitRow(n, scores.get(n, 0), devs,
                           largest_free(sl.devices) if sl is not None else None))
    rows.sort(key=lambda x: (-x.score, x.node))
    return FitResult(tuple(rows), failed, "")
