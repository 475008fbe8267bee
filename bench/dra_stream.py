"""The pure half of ``bench.dra_placement``: which nodes and pods, their objects, the
figures and the table (no cluster, no clock).

One stream feeds every path, chosen exactly as ``tests/extender/test_real_scheduler.py``
chooses it: every k-th openb GPU node, the default trace's GPU pods sorted by name and
shuffled with the seed (``trace.arrival_order``), a prefix of them. A pod's GPU share is
the replay's translation with 100 units per device (``TracePod.demand(100)``: a
fractional GPU of g milli asks ceil(g/10) memory units and cores on one device, n whole
GPUs ask n x 100 of each); the extender path's pod carries those as vcuda limits, and the
DRA path's pod is that same pod rewritten by the webhook's own translation
(``claim_translation.translate_pod``), so both ask for exactly the same slices.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from bench.replay import trace
from gpu_share.devices.base import Device
from gpu_share.sharing.annotations import inventory_key
from gpu_share.sharing.dra.claim_translation import (
    Translation,
    TranslationSettings,
    translate_pod,
)
from gpu_share.sharing.dra.slices import slice_body, slice_content
from gpu_share.sharing.inventory import DeviceCapacity, Inventory
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import (
    ClusterIndex,
    NodeSlots,
    NoFit,
    Shape,
    TieBreak,
    Workload,
    apply,
    make_policy,
)
from gpu_share.sharing.placement.first_fit import FirstFitScores
from gpu_share.sharing.quantity import parse_quantity
from testkit import scheduler as testkit_scheduler
from testkit.jsonpatch import apply_patch

UNITS = 100  # memory units and cores per device, as the product (and the extender test)
UNIT_MIB = 1024  # one memory unit is 1 GiB
DRIVER = "gpu-share.vendor.com"
MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
NAMES = ResourceNames(MEM, CORE)
IMAGE = "registry.k8s.io/pause:3.10"


# ---------------------------------------------------------------- the stream


def sample_nodes(nodes: Sequence[NodeSlots], n: int) -> list[NodeSlots]:
    """Every k-th node (k = len // n), the first ``n`` of them."""
    if n < 1:
        raise ValueError("need at least one node")
    return list(nodes[:: max(1, len(nodes) // n)][:n])


def capacity_milli(nodes: Iterable[NodeSlots]) -> int:
    return sum(len(n.devices) for n in nodes) * trace.GPU_MILLI


def sample_pods(
    pods: Sequence[trace.TracePod],
    seed: int,
    capacity: int,
    max_pods: int,
    max_arrived_pct: float = 100.0,
) -> list[trace.TracePod]:
    """The GPU pods in arrival order, at most ``max_pods`` and at most
    ``max_arrived_pct`` % of ``capacity`` (GPU-milli) asked in all."""
    out: list[trace.TracePod] = []
    arrived = 0
    limit = capacity * max_arrived_pct / 100
    for p in trace.arrival_order(list(pods), seed, capacity):
        if p.gpu_request <= 0:
            continue
        if len(out) >= max_pods or arrived + p.gpu_request > limit:
            break
        arrived += p.gpu_request
        out.append(p)
    return out


def renamed(nodes: Iterable[NodeSlots], prefix: str) -> list[NodeSlots]:
    """The nodes (and device ids) with ``prefix``; the name order is kept."""
    return [
        NodeSlots(
            prefix + n.name,
            tuple(
                type(d)(
                    f"{prefix}{d.uuid}", d.index, d.memory_total, d.memory_free,
                    d.cores_total, d.cores_free,
                )
                for d in n.devices
            ),
            n.cpu_free,
            n.host_memory_free,
            n.model,
            cpu_total=n.cpu_total,
            host_memory_total=n.host_memory_total,
        )
        for n in nodes
    ]


def workload(pods: Iterable[trace.TracePod]) -> Workload:
    """The extender's (and simulator's) target mix: the trace's GPU pod shapes."""
    return Workload(
        Shape(c.memory_units, c.cores, 1.0, p.cpu_milli, p.memory_mib)
        for p in pods
        for c in p.demand(UNITS).containers
    )


def simulate(
    nodes: Sequence[NodeSlots], pods: Sequence[trace.TracePod], load: Workload, policy: str = "fgd"
) -> list[str | None]:
    """The node the simulator (the extender's own policy code) picks for each pod."""
    index = ClusterIndex(make_policy(policy, load), list(nodes), TieBreak.DETERMINISTIC)
    out: list[str | None] = []
    for p in pods:
        got = index.place(p.demand(UNITS))
        out.append(None if got is None else got.node)
    return out


def simulate_first_fit(
    nodes: Sequence[NodeSlots], pods: Sequence[trace.TracePod], load: Workload
) -> list[str | None]:
    """The DRA path with the extender, simulated: each pod to the node whose first-fit
    devices (the allocator's pick) fgd scores best (ties: the smallest name), those
    devices taken. Every node is scored for every pod (minutes at 1,213 nodes)."""
    policy = make_policy("fgd", load)
    cur = {n.name: n for n in nodes}
    names = sorted(cur)
    out: list[str | None] = []
    for p in pods:
        demand = p.demand(UNITS)
        scores = FirstFitScores(policy, demand)
        best = None
        for name in names:
            got = scores.placement(cur[name])
            if not isinstance(got, NoFit) and (best is None or got.score < best.score):
                best = got
        out.append(None if best is None else best.node)
        if best is not None:
            cur[best.node] = apply(cur[best.node], demand, best)
    return out


# ---------------------------------------------------------------- objects


def node_labels(tag: str) -> dict[str, str]:
    return {"gs-dra-bench": tag}


def inventory(n: NodeSlots) -> Inventory:
    """The node's devices as an agent would report them: 100 units of 1 GiB each."""
    return Inventory(
        (
            DeviceCapacity(
                Device(d.uuid, d.index, d.index, UNITS * UNIT_MIB, n.model), UNITS
            )
            for d in n.devices
        ),
        UNIT_MIB,
    )


INVENTORY_KEY = inventory_key("vendor.com")


def inventory_annotation(n: NodeSlots) -> str:
    """The extender's view of the same devices (tests/extender's annotation)."""
    return testkit_scheduler.inventory_annotation(n, UNITS, UNIT_MIB)


def node_status(n: NodeSlots) -> dict[str, Any]:
    """Allocatable = the trace's CPU and memory, plus the vcuda sums for the extender."""
    return testkit_scheduler.node_status(n, UNITS)


def resource_slice(n: NodeSlots, tag: str) -> dict[str, Any]:
    """The slice the node's agent would publish (the agent's own builder), labelled."""
    content = slice_content(inventory(n), node_name=n.name, driver=DRIVER, driver_version="bench")
    body = slice_body(content, generation=1)
    body["metadata"]["labels"] = node_labels(tag)
    return body


def device_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def vcuda_pod(name: str, p: trace.TracePod, scheduler: str, tag: str) -> dict[str, Any]:
    """The extender path's pod (as tests/extender/test_real_scheduler.py writes it)."""
    d = p.demand(UNITS).containers[0]
    return {
        "metadata": {"name": name, "labels": {"gs-dra-bench": tag}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": node_labels(tag),
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "resources": {
                        "requests": {"cpu": f"{p.cpu_milli}m", "memory": f"{p.memory_mib}Mi"},
                        "limits": {MEM: str(d.memory_units), CORE: str(d.cores)},
                    },
                }
            ],
        },
    }


def translation_settings(device_class_name: str) -> TranslationSettings:
    return TranslationSettings(NAMES, UNIT_MIB, device_class_name)


def dra_pod(
    pod: Mapping[str, Any], namespace: str, settings: TranslationSettings
) -> tuple[dict[str, Any], Translation]:
    """``pod`` as the admission webhook leaves it: its patch applied (the templates to
    create are in the translation)."""
    t = translate_pod(pod, namespace, settings)
    out: dict[str, Any] = apply_patch(pod, t.patch)
    return out, t


# ---------------------------------------------------------------- figures


def allocation_pct(pods: Sequence[trace.TracePod], nodes: Sequence[str | None], cap: int) -> float:
    """docs/placement.md's metric: GPU-milli of the placed pods / capacity, in %."""
    got = sum(p.gpu_request for p, n in zip(pods, nodes, strict=True) if n)
    return 100 * got / cap if cap else 0.0


def cores_pct(pods: Sequence[trace.TracePod], nodes: Sequence[str | None], devices: int) -> float:
    """Cores (= memory units here) the placed pods asked, in 1/100 of a device, as % of
    all devices' (what the slices and the extender account)."""
    got = sum(
        c.cores for p, n in zip(pods, nodes, strict=True) if n for c in p.demand(UNITS).containers
    )
    return 100 * got / (devices * UNITS) if devices else 0.0


@dataclass(frozen=True)
class ClaimUse:
    """What the allocated claims consume, from their ``status.allocation``."""

    cores: Fraction = Fraction(0)
    memory_mib: Fraction = Fraction(0)
    devices_over: int = 0  # devices whose claims consume more than the device has
    claims: int = 0


def claim_use(claims: Iterable[Mapping[str, Any]], driver: str = DRIVER) -> ClaimUse:
    """Sums ``consumedCapacity`` of our driver's allocation results per device."""
    per: dict[tuple[str, str], list[Fraction]] = {}
    n = 0
    for c in claims:
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        if results:
            n += 1
        for r in results:
            if r.get("driver") != driver:
                continue
            used = r.get("consumedCapacity") or {}
            acc = per.setdefault((str(r.get("pool")), str(r.get("device"))), [Fraction(0)] * 2)
            acc[0] += parse_quantity(used.get("cores", 0))
            acc[1] += parse_quantity(used.get("memory", 0)) / 2**20
    over = sum(1 for c, m in per.values() if c > UNITS or m > UNITS * UNIT_MIB)
    return ClaimUse(
        sum((c for c, _ in per.values()), Fraction(0)),
        sum((m for _, m in per.values()), Fraction(0)),
        over,
        n,
    )


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


@dataclass
class RunFigures:
    """One stream through one path in one mode."""

    pods: int
    bound: int
    unschedulable: int
    undecided: int
    alloc_pct: float
    cores_pct: float
    wall_s: float  # first create to last decision
    latencies_s: list[float] = field(default_factory=list)  # creation -> bound
    claims: ClaimUse | None = None

    @property
    def pods_per_s(self) -> float:
        decided = self.bound + self.unschedulable
        return decided / self.wall_s if self.wall_s > 0 else float("nan")


def figures(
    pods: Sequence[trace.TracePod],
    nodes: Sequence[str | None],
    outcome: Sequence[str],
    cap: int,
    devices: int,
    wall_s: float,
    latencies_s: list[float],
    claims: ClaimUse | None = None,
) -> RunFigures:
    """``outcome`` per pod: "bound", "unschedulable" or "undecided"."""
    return RunFigures(
        len(pods),
        sum(1 for o in outcome if o == "bound"),
        sum(1 for o in outcome if o == "unschedulable"),
        sum(1 for o in outcome if o == "undecided"),
        allocation_pct(pods, nodes, cap),
        cores_pct(pods, nodes, devices),
        wall_s,
        latencies_s,
        claims,
    )


def _ms(x: float) -> str:
    return "-" if x != x else f"{1e3 * x:.0f}"


def _cell(f: RunFigures | None, row: str, devices: int) -> str:
    if f is None:
        return "-"
    if row == "claims":
        if f.claims is None:
            return "-"
        total = devices * UNITS
        return (
            f"{100 * float(f.claims.cores) / total:.2f} / "
            f"{100 * float(f.claims.memory_mib) / (total * UNIT_MIB):.2f}"
        )
    if row == "over":
        return "-" if f.claims is None else str(f.claims.devices_over)
    values = {
        "bound": f"{f.bound} / {f.pods}",
        "unsched": f"{f.unschedulable} / {f.undecided}",
        "alloc": f"{f.alloc_pct:.2f}",
        "cores": f"{f.cores_pct:.2f}",
        "rate": f"{f.pods_per_s:.1f}",
        "lat": f"{_ms(percentile(f.latencies_s, 50))} / {_ms(percentile(f.latencies_s, 99))}",
    }
    return values[row]


ROWS = (
    ("bound", "bound / pods"),
    ("unsched", "unschedulable / undecided"),
    ("alloc", "allocation % (GPU-milli)"),
    ("cores", "cores % asked by bound pods"),
    ("claims", "claims consume cores % / mem %"),
    ("over", "devices over capacity (claims)"),
    ("rate", "throughput, pods/s"),
    ("lat", "creation->bound p50 / p99 ms"),
)


def table(
    columns: Sequence[tuple[str, RunFigures | None]],
    devices: int,
    *sims: tuple[str, Sequence[trace.TracePod], Sequence[str | None], int],
) -> str:
    """Rows = figures, one column per (label, run); each of ``sims``: (label, pods,
    choices, capacity) adds a simulator's bound count and allocation."""
    head = ["", *(label for label, _ in columns)]
    body = [[title, *(_cell(f, key, devices) for _, f in columns)] for key, title in ROWS]
    for label, pods, choice, cap in sims:
        head.append(label)
        extra = {
            "bound": f"{sum(1 for c in choice if c)} / {len(pods)}",
            "unsched": f"{sum(1 for c in choice if not c)} / 0",
            "alloc": f"{allocation_pct(pods, choice, cap):.2f}",
            "cores": f"{cores_pct(pods, choice, devices):.2f}",
        }
        for row, (key, _) in zip(body, ROWS, strict=True):
            row.append(extra.get(key, "-"))
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [head, *body]
    ]
    return "\n".join(lines)


def mean_or_nan(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")
