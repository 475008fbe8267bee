"""``kubectl gpu-share fit``: the extender's own filter and prioritize over a snapshot
(``SnapshotView``, what the extender would see), and the devices its policy would pick."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpu_share.cli.kubectl_snapshot import Settings, Snapshot
from gpu_share.cli.kubectl_view import largest_free
from gpu_share.errors import GpuShareError
from gpu_share.extender.core import Extender, ExtenderSettings, pod_ask
from gpu_share.extender.ports import ClusterView, ReadOnlyView
from gpu_share.sharing.placement import (
    ClusterPolicy,
    NodeSlots,
    Placement,
    Shape,
    Workload,
    evaluate_node,
    make_policy,
    model_free,
)

DEFAULT_WORKLOAD = "4:25,8:50,16:100"  # the extender's --default-workload default


def parse_workload(text: str) -> Workload:
    """``memoryUnits:cores[:weight],...`` (the extender's --default-workload)."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        f = part.split(":")
        if len(f) not in (2, 3):
            raise ValueError(f"workload entry {part!r} is not memoryUnits:cores[:weight]")
        shapes.append(Shape(int(f[0]), int(f[1]), float(f[2]) if len(f) > 2 else 1.0))
    return Workload(shapes)


class SnapshotView(ReadOnlyView):
    """``extender.ports.ClusterView`` over a snapshot: what the extender would see."""

    read_only = "kubectl gpu-share is read-only"

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
