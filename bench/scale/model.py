"""The pure half of ``bench.scale``: which nodes and pods, their objects, the misplaced
count and the figures (no cluster, no clock).

Nodes are the openb GPU node list (``openb_node_list_gpu_node.csv``, 1,213 nodes); more
than that replicates the list (copy ``c`` of node ``x`` is ``<prefix>c<c>-<x>``). Pods
are the default trace's GPU pods sorted by name and shuffled with the seed, exactly as
the replay orders them (``trace.arrival_order`` via ``dra_stream.sample_pods``), up to
100 % of the nodes' GPU capacity or ``--pods``. Objects reuse the builders of
``bench/dra_stream.py`` (the agent's inventory annotation and ResourceSlice builders).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from bench import dra_stream as ds
from bench.replay import trace
from gpu_share.sharing.placement import NodeSlots
from gpu_share.sharing.quantity import parse_quantity

UNITS = ds.UNITS
# kwok's own convention: it manages nodes carrying this annotation (and only those).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Keeps every pod without the toleration (other tests' pods) off the fake nodes.
TAINT_KEY = "gpu-share.vendor.com/kwok"
LABEL = "gs-scale-bench"


# ---------------------------------------------------------------- nodes and pods


def replicate(nodes: Sequence[NodeSlots], n: int, prefix: str) -> list[NodeSlots]:
    """``n`` nodes: the trace's list, then copies of it (``<prefix>c<copy>-<name>``)."""
    if n < 1 or not nodes:
        raise ValueError("need at least one node")
    out: list[NodeSlots] = []
    for i in range(n):
        copy, src = divmod(i, len(nodes))
        out.extend(ds.renamed([nodes[src]], f"{prefix}c{copy}-"))
    return out


# The GPU pods in the replay's arrival order, up to ``max_arrived_pct`` % of the capacity
# or ``max_pods`` (a documented prefix): the DRA stream bench's sample.
pods_for = ds.sample_pods


def node_labels(tag: str) -> dict[str, str]:
    return {LABEL: tag, "type": "kwok"}


def taint(tag: str) -> dict[str, str]:
    return {"key": TAINT_KEY, "value": tag, "effect": "NoSchedule"}


def tolerations() -> list[dict[str, str]]:
    """Ours, plus the node lifecycle controller's (a late kwok lease renewal must not
    evict or block a bench pod)."""
    return [
        {"key": TAINT_KEY, "operator": "Exists"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
    ]


def node_body(n: NodeSlots, tag: str) -> dict[str, Any]:
    """The Node object (status is patched after: the API server drops it on create)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": n.name,
            "labels": {**node_labels(tag), "kubernetes.io/hostname": n.name},
            "annotations": {
                KWOK_ANNOTATION: "fake",
                ds.INVENTORY_KEY: ds.inventory_annotation(n),
            },
        },
        "spec": {"taints": [taint(tag)]},
    }


def node_status(n: NodeSlots) -> dict[str, Any]:
    """Allocatable: the trace's CPU and memory plus the vcuda sums (what the agent's
    device plugin advertises); kwok keeps it and adds the conditions."""
    return {"status": ds.node_status(n)}


def vcuda_pod(name: str, p: trace.TracePod, scheduler: str, tag: str) -> dict[str, Any]:
    """Paths (a) and (b): the pod asks vcuda-memory/vcuda-core limits (and the trace's
    CPU and memory), tolerates the kwok taint and is kept to this run's nodes."""
    body = ds.vcuda_pod(name, p, scheduler, tag)
    body["apiVersion"], body["kind"] = "v1", "Pod"
    body["metadata"]["labels"] = {LABEL: tag}
    body["spec"]["nodeSelector"] = {LABEL: tag}
    body["spec"]["tolerations"] = tolerations()
    body["spec"]["terminationGracePeriodSeconds"] = 0
    return body


# ---------------------------------------------------------------- misplaced pods


@dataclass(frozen=True)
class BoundPod:
    node: str
    demand: trace.TracePod
    # The extender's device choice (device ids), when it made one.
    devices: tuple[str, ...] | None = None


def _ask(p: trace.TracePod) -> tuple[int, int]:
    """(devices, units per device) the pod needs on one node."""
    d = p.demand(UNITS).containers
    if not d:
        return 0, 0
    if p.num_gpu > 1 or d[0].memory_units >= UNITS:
        return max(1, p.num_gpu), UNITS
    return 1, d[0].memory_units


def misplaced(bound: Iterable[BoundPod], devices_per_node: Mapping[str, Sequence[str]]) -> int:
    """Pods bound where no single device (or not enough whole ones) had room, in bind
    order. With the extender's choice, that choice is checked; without one (kube-scheduler
    alone), a best-fit device plugin is assumed: the pods that find no device count."""
    free: dict[str, dict[str, int]] = {}
    bad = 0
    for b in bound:
        devs = free.setdefault(b.node, dict.fromkeys(devices_per_node.get(b.node, ()), UNITS))
        n, units = _ask(b.demand)
        if n == 0:
            continue
        chosen = _chosen(devs, n, units, b.devices)
        if chosen is None:
            bad += 1
            continue
        for d in chosen:
            devs[d] -= units
    return bad


def _chosen(
    devs: dict[str, int], n: int, units: int, choice: tuple[str, ...] | None
) -> list[str] | None:
    if choice is not None:
        ok = len(choice) == n and all(devs.get(d, -1) >= units for d in choice)
        return list(choice) if ok else None
    fits = sorted((left, d) for d, left in devs.items() if left >= units)
    return [d for _, d in fits[:n]] if len(fits) >= n else None


def device_use(
    claims: Iterable[Mapping[str, Any]], driver: str = ds.DRIVER
) -> dict[str, dict[str, int]]:
    """Units taken per device (node -> device -> units, rounded up; the larger of cores and
    memory) by the allocated claims' ``consumedCapacity`` (pool = node name)."""
    per: dict[str, dict[str, list[Fraction]]] = {}
    for c in claims:
        alloc = (c.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            if r.get("driver") != driver:
                continue
            used = r.get("consumedCapacity") or {}
            acc = per.setdefault(str(r.get("pool")), {}).setdefault(
                str(r.get("device")), [Fraction(0), Fraction(0)]
            )
            acc[0] += parse_quantity(used.get("cores", 0))
            acc[1] += parse_quantity(used.get("memory", 0)) / (ds.UNIT_MIB * 2**20)
    return {
        node: {d: int(-(-max(c, m) // 1)) for d, (c, m) in devs.items()}
        for node, devs in per.items()
    }


def unbound_that_fit(
    nodes: Sequence[NodeSlots],
    pods: Mapping[str, trace.TracePod],
    bound_on: Mapping[str, str],
    used: Mapping[str, Mapping[str, int]],
) -> list[str]:
    """The pods not bound (names of ``pods`` missing from ``bound_on``, pod -> node) that
    would still fit on some node at the end: its CPU and memory left after the bound
    pods' requests, and enough devices with the units left (``used``: ``device_use``).
    Capacity only shrinks during a stream, so such a pod also fitted whenever it was
    tried: a scheduler that keeps up leaves none."""
    cpu = {n.name: n.cpu_free for n in nodes}
    mem = {n.name: n.host_memory_free for n in nodes}
    for name, node in bound_on.items():
        p = pods[name]
        if cpu.get(node) is not None:
            cpu[node] = int(cpu[node] or 0) - p.cpu_milli
        if mem.get(node) is not None:
            mem[node] = int(mem[node] or 0) - p.memory_mib
    free = {
        n.name: [UNITS - u for u in used.get(n.name, {}).values()]
        + [UNITS] * (len(n.devices) - len(used.get(n.name, {})))
        for n in nodes
    }
    memo: dict[tuple[int, int, int, int], bool] = {}

    def fits(p: trace.TracePod) -> bool:
        k, units = _ask(p)
        key = (k, units, p.cpu_milli, p.memory_mib)
        if key not in memo:
            memo[key] = any(
                (cpu[n] is None or int(cpu[n] or 0) >= p.cpu_milli)
                and (mem[n] is None or int(mem[n] or 0) >= p.memory_mib)
                and sum(1 for f in free[n] if f >= units) >= k
                for n in free
            )
        return memo[key]

    return [name for name, p in pods.items() if name not in bound_on and fits(p)]


# ---------------------------------------------------------------- figures


percentile = ds.percentile  # nearest-rank, as the DRA stream bench reports


@dataclass
class PathFigures:
    """One stream through one path."""

    path: str
    pods: int
    bound: int
    unschedulable: int
    wall_s: float  # first create to last bind
    latencies_s: list[float] = field(default_factory=list)  # creation -> bound
    alloc_pct: float = float("nan")
    misplaced: int = 0
    filter_ms: list[float] = field(default_factory=list)
    filter_nodes: list[int] = field(default_factory=list)  # names per filter call
    prioritize_ms: list[float] = field(default_factory=list)
    bind_ms: list[float] = field(default_factory=list)
    rss_mib: float = float("nan")  # the extender's at the end of the stream
    view_mib: float = float("nan")  # the extender's RSS growth from its list+watch sync
    cpu_s: float = float("nan")  # the extender's CPU during the stream
    api_requests: int = -1  # requests our component sent to the API server
    # DRA: pods left unbound that would fit on some node at the end (-1 = not counted)
    unbound_fit: int = -1
    # The machine's CPU per bound pod by process, idle use taken out (bench.scale.cpu)
    cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)
    cpu_s_by_process: dict[str, float] = field(default_factory=dict)  # all of it, idle too
    busy_cores: float = float("nan")  # during the stream
    idle_cores: float = float("nan")  # just before it, nothing streaming
    # requests the API server served during the stream, all clients: "VERB resource" -> n
    api_served: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def pods_per_s(self) -> float:
        return self.bound / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def api_per_s(self) -> float:
        if self.api_requests < 0 or self.wall_s <= 0:
            return float("nan")
        return self.api_requests / self.wall_s


def allocation_pct(bound_milli: int, capacity_milli: int) -> float:
    return 100 * bound_milli / capacity_milli if capacity_milli else float("nan")


def _f(x: float, fmt: str = ".1f") -> str:
    return "-" if x != x else format(x, fmt)


def _pq(xs: Sequence[float], scale: float = 1.0) -> str:
    if not xs:
        return "-"
    return f"{scale * percentile(xs, 50):.1f} / {scale * percentile(xs, 99):.1f}"


ROWS: tuple[tuple[str, str], ...] = (
    ("bound", "bound / pods"),
    ("rate", "throughput, pods/s"),
    ("lat", "creation->bound p50 / p99 s"),
    ("alloc", "allocation % (GPU-milli)"),
    ("misplaced", "misplaced (no device fits)"),
    ("filter", "extender filter p50 / p99 ms"),
    ("nodes", "nodes per filter, mean / max"),
    ("prio", "extender prioritize p50/p99 ms"),
    ("bind", "extender bind p50 / p99 ms"),
    ("rss", "extender RSS MiB (view MiB)"),
    ("cpu", "extender CPU s (% of wall)"),
    ("api", "our API requests (/s)"),
    ("machine", "machine CPU ms / pod (cores)"),
)


def cell(f: PathFigures, row: str) -> str:
    ext = bool(f.filter_ms or f.bind_ms)
    cpu = f"{f.cpu_s:.1f} ({100 * f.cpu_s / f.wall_s:.0f} %)" if f.cpu_s == f.cpu_s else "-"
    values = {
        "bound": f"{f.bound} / {f.pods}",
        "rate": _f(f.pods_per_s),
        "lat": _pq(f.latencies_s),
        "alloc": _f(f.alloc_pct, ".2f"),
        "misplaced": str(f.misplaced),
        "filter": _pq(f.filter_ms) if ext else "-",
        "nodes": (f"{sum(f.filter_nodes) / len(f.filter_nodes):.0f} / {max(f.filter_nodes)}"
                  if f.filter_nodes else "-"),
        "prio": _pq(f.prioritize_ms) if ext else "-",
        "bind": _pq(f.bind_ms) if ext else "-",
        "rss": f"{_f(f.rss_mib, '.0f')} ({_f(f.view_mib, '.0f')})" if ext else "-",
        "cpu": cpu if ext else "-",
        "api": f"{f.api_requests} ({_f(f.api_per_s)})" if f.api_requests >= 0 else "-",
        "machine": (f"{sum(f.cpu_ms_per_pod.values()):.0f} ({_f(f.busy_cores, '.2f')})"
                    if f.cpu_ms_per_pod else "-"),
    }
    return values[row]


def table(
    columns: Sequence[PathFigures], sim_alloc: float | None = None,
    sims: Mapping[str, float] | None = None,
) -> str:
    """Rows = figures, one column per path; the simulators' allocation beside them
    (``sim_alloc``: one column "simulator"; ``sims``: column title -> allocation %)."""
    extra = dict(sims or {})
    if sim_alloc is not None:
        extra = {"simulator": sim_alloc, **extra}
    head = ["", *(c.path for c in columns), *extra]
    body = [[title, *(cell(c, key) for c in columns)] for key, title in ROWS]
    for alloc in extra.values():
        for row, (key, _) in zip(body, ROWS, strict=True):
            row.append(f"{alloc:.2f}" if key == "alloc" else ("0" if key == "misplaced" else "-"))
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [head, *body]
    )


SEQUENTIAL = -1.0  # a "rate": each pod is created once the one before is decided


def arrival_offsets(n: int, rate: float) -> list[float]:
    """When each pod is created, seconds after the first: every 1/rate s (0 = at once;
    SEQUENTIAL: -1 each, meaning after the previous pod's decision)."""
    if rate < 0:
        return [SEQUENTIAL] * n
    if rate == 0:
        return [0.0] * n
    return [i / rate for i in range(n)]
