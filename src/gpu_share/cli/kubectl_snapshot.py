"""The cluster as ``kubectl gpu-share`` reads it: one LIST of nodes and one of pods.

The node's free space is the extender's: ``sharing.placement.view.node_slots`` over the
agent's inventory and the pods' annotations, host CPU/memory = allocatable minus the
requests of every bound pod. One difference: the plugin has no decision key, so pod
annotations count unverified (a forged one can make a node look fuller, never emptier:
free is ``total - max(inventory used, annotated)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_share.sharing.annotations import (
    AnnotationError,
    InventoryAnnotation,
    enforcement_key,
    enforcement_problem,
    inventory_key,
)
from gpu_share.sharing.cordon import Cordon, scan_cordons
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import NodeSlots
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL, node_model
from gpu_share.sharing.placement.pod_request import PodRequest, read_pod_request
from gpu_share.sharing.placement.view import Usage, node_slots, pod_usage
from gpu_share.sharing.quantity import QuantityError, cpu_milli, memory_mib

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
                             model_label=s.model_label, claims=True),  # as the extender
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
