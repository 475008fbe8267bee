"""A proven upper bound on the GPU allocation any placer can reach:
``python -m bench.replay.hostbound [--traces default] [--seeds 42-51]`` (needs scipy).

What it bounds. Take the pods that have arrived when the replay records its 100 %
checkpoint (``arrived(...)``: the same order and the same cut as ``sim.run``). A
*placement* of them is any subset of these pods, each put on one node, where

* a share (one GPU, < 1000 milli) takes that much of ONE device; the shares on a device
  sum to at most 1000;
* a whole-GPU pod (k x 1000 milli) takes k devices of one node that hold nothing else;
* every node's placed pods ask at most its CPU and host memory, and its device model
  is one the pod accepts.

``OPT`` = max over placements of (GPU-milli of the placed pods) / capacity. Any placer,
online or offline, refusing pods or not, ends at or below ``OPT`` at the 100 % checkpoint.
``bound`` below is an LP relaxation of ``OPT`` and therefore ``bound >= OPT``:

* Nodes are grouped into types (model, GPUs, CPU, memory); ``v[p, t]`` = how many pods
  of class p (same GPU request, CPU, memory and model requirement) go to nodes of type t
  (at most the class's count; only where one node of type t could hold one such pod).
* Share-level integrality, per node type: the devices of type t that hold shares are
  described by an arc-flow (Valerio de Carvalho): a device is a path 0 -> 1000 in steps
  of the share sizes (in units of their gcd with 1000) plus unit "empty" steps; each
  step of size s on the path is one share of size s on that device. The number of
  s-steps must cover the s-shares placed on type t. So a device with an 810 share can add
  only shares <= 190; the LP is as strong as the configuration LP of bin packing.
* Devices: share paths + k per whole pod <= devices of type t.
* Host: CPU and memory of the pods on type t <= the type's total CPU and memory (summed
  over its nodes: per-node splits are relaxed).
* A whole pod with k > G/2 GPUs on a G-GPU type takes a node of its own: at most N_t.
* Per node, at most k pods that each ask more than 1/(k+1) of its CPU (or memory), so at
  most k N_t of them on type t (k = 1..8): a little of the per-node split of host
  resources that summing over the type's nodes gives away.

Every real placement gives a feasible LP point with the same objective (count pods per
class and type; trace each device's shares in decreasing order as its path), so the LP
optimum is >= OPT. ``--gpu-free placed`` adds the constraint that every arrived GPU-free
pod is placed (the replay's placers place them whenever they fit, and on openb they all
fit): a bound for placers that do not turn GPU-free pods away.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.replay import trace
from gpu_share.sharing.placement import ModelReq, NodeSlots

HOST_CUTS = 8  # per-node cuts on host CPU and memory (module doc)


@dataclass(frozen=True)
class NodeType:
    model: str
    gpus: int
    cpu: int
    memory: int
    count: int


@dataclass(frozen=True)
class PodClass:
    num_gpu: int
    gpu_milli: int  # per GPU
    cpu: int
    memory: int
    models: ModelReq
    count: int
    required: int = 0  # how many of them every placement must place

    @property
    def share(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < trace.GPU_MILLI

    @property
    def gpu(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0


def node_types(nodes: Sequence[NodeSlots]) -> list[NodeType]:
    counts: dict[tuple[str, int, int, int], int] = {}
    for n in nodes:
        k = (n.model, len(n.devices), n.cpu_total or 0, n.host_memory_total or 0)
        counts[k] = counts.get(k, 0) + 1
    return [NodeType(*k, c) for k, c in sorted(counts.items())]


def pod_classes(pods: Sequence[trace.TracePod], required: int = 0) -> list[PodClass]:
    """Pods grouped by request; the first ``required`` pods of ``pods`` must be placed."""
    counts: dict[tuple[int, int, int, int, str], list[int]] = {}
    for i, p in enumerate(pods):
        gpu = (p.num_gpu, p.gpu_milli) if p.num_gpu and p.gpu_milli else (0, 0)
        k = (*gpu, p.cpu_milli, p.memory_mib, p.gpu_spec)
        n = counts.setdefault(k, [0, 0])
        n[0] += 1
        n[1] += i < required
    return [
        PodClass(g, m, c, mem, trace.model_req(spec), n, r)
        for (g, m, c, mem, spec), (n, r) in sorted(counts.items())
    ]


def arrived(
    order: Sequence[trace.TracePod], capacity: int, pct: float = 100
) -> list[trace.TracePod]:
    """The pods ``sim.run`` has seen when it records checkpoint ``pct``: up to and
    including the first pod whose arrival takes the requests to ``pct`` % of capacity."""
    total = 0
    for i, p in enumerate(order):
        total += p.gpu_request
        if 100 * total / capacity >= pct:
            return list(order[: i + 1])
    return list(order)


def _fits(c: PodClass, t: NodeType) -> bool:
    return (
        c.models.allows(t.model) and c.num_gpu <= t.gpus and c.cpu <= t.cpu and c.memory <= t.memory
    )


class Infeasible(Exception):
    """No placement meets the constraints (e.g. the pods that must be placed do not fit)."""


class _LP:
    """Rows and columns of the LP, built incrementally (sparse, maximisation)."""

    def __init__(self) -> None:
        self.obj: list[float] = []
        self.ub_rows: list[dict[int, float]] = []
        self.ub_rhs: list[float] = []
        self.eq_rows: list[dict[int, float]] = []
        self.eq_rhs: list[float] = []
        self.x: list[float] = []  # the LP's optimum, after solve()

    def var(self, gain: float = 0.0) -> int:
        self.obj.append(gain)
        return len(self.obj) - 1

    def le(self, row: dict[int, float], rhs: float) -> None:
        self.ub_rows.append(row)
        self.ub_rhs.append(rhs)

    def eq(self, row: dict[int, float], rhs: float) -> None:
        self.eq_rows.append(row)
        self.eq_rhs.append(rhs)

    def solve(self, integral: bool = False, time_limit: float = 60.0) -> float:
        import numpy as np
        from scipy.optimize import (  # optional: the bench extra
            Bounds,
            LinearConstraint,
            linprog,
            milp,
        )
        from scipy.sparse import csr_array

        n = len(self.obj)

        def matrix(rows: list[dict[int, float]]) -> csr_array:
            data, ri, ci = [], [], []
            for r, row in enumerate(rows):
                for c, v in row.items():
                    data.append(v)
                    ri.append(r)
                    ci.append(c)
            return csr_array((data, (ri, ci)), shape=(len(rows), n))

        c = -np.array(self.obj)
        a_ub, a_eq = matrix(self.ub_rows), matrix(self.eq_rows)
        if not integral:
            res = linprog(
                c,
                A_ub=a_ub,
                b_ub=self.ub_rhs,
                A_eq=a_eq,
                b_eq=self.eq_rhs,
                bounds=(0, None),
                method="highs",
            )
            if res.status == 2:
                raise Infeasible(res.message)
            if res.status != 0:
                raise RuntimeError(f"LP not solved: {res.message}")
            self.x = [float(v) for v in res.x]
            return float(-res.fun)
        cons = [
            LinearConstraint(a_ub, -np.inf, np.array(self.ub_rhs)),
            LinearConstraint(a_eq, np.array(self.eq_rhs), np.array(self.eq_rhs)),
        ]
        res = milp(
            c,
            constraints=cons,
            integrality=np.ones(n),
            bounds=Bounds(0, np.inf),
            options={"time_limit": time_limit, "disp": False},
        )
        # The dual bound of branch and bound is valid even when the time limit stops it.
        dual = getattr(res, "mip_dual_bound", None)
        if dual is None or not math.isfinite(dual):
            raise RuntimeError(f"MILP without a bound: {res.message}")
        return float(-dual)


def _share_unit(classes: Sequence[PodClass]) -> int:
    g = trace.GPU_MILLI
    for c in classes:
        if c.share:
            g = math.gcd(g, c.gpu_milli)
    return g


def _node_type_rows(lp: _LP, t: NodeType, placed: list[tuple[PodClass, int]], unit: int) -> None:
    """Device, share-integrality and host rows of one node type; ``placed``: its
    (pod class, variable) pairs."""
    levels = trace.GPU_MILLI // unit
    sizes = sorted({c.gpu_milli // unit for c, _ in placed if c.share})
    # arc-flow: flow into level i = flow out of it; paths start at 0, end at `levels`
    into: list[dict[int, float]] = [{} for _ in range(levels + 1)]
    out: list[dict[int, float]] = [{} for _ in range(levels + 1)]
    steps: dict[int, dict[int, float]] = {s: {} for s in sizes}
    for i in range(levels):
        empty = lp.var()
        out[i][empty] = 1.0
        into[i + 1][empty] = 1.0
        for s in sizes:
            if i + s <= levels:
                a = lp.var()
                out[i][a] = 1.0
                into[i + s][a] = 1.0
                steps[s][a] = 1.0
    for i in range(1, levels):
        row = dict(out[i])
        for k, v in into[i].items():
            row[k] = row.get(k, 0.0) - v
        lp.eq(row, 0.0)
    devices = dict(out[0])  # paths = devices holding shares
    for s in sizes:  # s-shares placed <= s-steps on the paths
        row = {var: 1.0 for c, var in placed if c.share and c.gpu_milli // unit == s}
        row.update({a: -1.0 for a in steps[s]})
        lp.le(row, 0.0)
    for c, var in placed:
        if c.num_gpu and not c.share:
            devices[var] = float(c.num_gpu)
    lp.le(devices, float(t.count * t.gpus))
    lp.le({v: float(c.cpu) for c, v in placed if c.cpu}, float(t.count * t.cpu))
    lp.le({v: float(c.memory) for c, v in placed if c.memory}, float(t.count * t.memory))
    lone = {v: 1.0 for c, v in placed if not c.share and c.gpu and 2 * c.num_gpu > t.gpus}
    if lone:
        lp.le(lone, float(t.count))
    for k in range(1, HOST_CUTS + 1):  # a node holds at most k pods asking > 1/(k+1) of it
        for need, total in ((lambda c: c.cpu, t.cpu), (lambda c: c.memory, t.memory)):
            big = {v: 1.0 for c, v in placed if (k + 1) * need(c) > total}
            if big:
                lp.le(big, float(k * t.count))


@dataclass(frozen=True)
class Bound:
    milli: float  # upper bound on the allocated GPU-milli
    placed: dict[PodClass, float]  # pods of each class in the LP's optimum (fractional)


def bound(
    types: Sequence[NodeType],
    classes: Sequence[PodClass],
    gpu_free_placed: bool = False,
    integral: bool = False,
) -> Bound:
    """Upper bound on the allocated GPU-milli (see the module doc); ``integral``: the
    MILP's dual bound (pod counts and device paths integral per type; slower, and on
    openb no tighter)."""
    lp = _LP()
    unit = _share_unit(classes)
    by_type: dict[int, list[tuple[PodClass, int]]] = {i: [] for i in range(len(types))}
    of_class: dict[PodClass, list[int]] = {}
    for c in classes:
        if not c.gpu and not gpu_free_placed:
            continue  # placing it can only use host resources
        row: dict[int, float] = {}
        for i, t in enumerate(types):
            if _fits(c, t):
                v = lp.var(float(c.gpu))
                row[v] = 1.0
                by_type[i].append((c, v))
        of_class[c] = list(row)
        least = c.count if not c.gpu else c.required
        if least and not row:
            raise ValueError(f"{c} must be placed but fits no node type")
        if row:
            lp.le(row, float(c.count))
        if least:
            lp.le({v: -1.0 for v in row}, -float(least))
    for i, t in enumerate(types):
        _node_type_rows(lp, t, by_type[i], unit)
    value = lp.solve(integral)
    placed = {c: sum(lp.x[v] for v in vs) for c, vs in of_class.items()} if lp.x else {}
    return Bound(value, placed)


def seed_bound(
    name: str,
    seed: int,
    gpu_free_placed: bool = False,
    placed_before: float = 0.0,
    integral: bool = False,
) -> dict[str, float]:
    """The bound for one trace and seed; ``placed_before``: every pod that arrived before
    requests reached this % of capacity is placed (placers that refuse nothing so early)."""
    from bench.replay.__main__ import load

    nodes = trace.load_nodes()
    capacity = sum(len(n.devices) for n in nodes) * trace.GPU_MILLI
    order = trace.arrival_order(load(name, nodes), seed, capacity)
    pods = arrived(order, capacity)
    required = len(arrived(order, capacity, placed_before)) - 1 if placed_before else 0
    classes = pod_classes(pods, required)
    b = bound(node_types(nodes), classes, gpu_free_placed, integral)
    left: dict[int, float] = {}  # GPU pods the LP's optimum leaves out, by GPU request
    for c in classes:
        if c.gpu and c.count - b.placed.get(c, 0.0) > 1e-6:
            left[c.gpu] = left.get(c.gpu, 0.0) + c.count - b.placed.get(c, 0.0)
    asked = sum(p.gpu_request for p in pods)
    out = {"arrived": 100 * asked / capacity, "bound": 100 * b.milli / capacity}
    out.update({f"left_{g}": n for g, n in sorted(left.items())})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay.hostbound")
    ap.add_argument("--traces", default="default")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument(
        "--gpu-free",
        choices=("any", "placed"),
        default="any",
        help="placed: every arrived GPU-free pod must be placed too",
    )
    ap.add_argument(
        "--placed-before",
        type=float,
        default=0.0,
        metavar="PCT",
        help="every pod arriving before PCT %% of capacity must be placed",
    )
    ap.add_argument("--integral", action="store_true", help="MILP dual bound (slower)")
    a = ap.parse_args(argv)
    lo, _, hi = a.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    print(
        "upper bound on GPU allocation % at 100 % arrived (module doc); GPU-free pods "
        f"{a.gpu_free}; all placed before {a.placed_before:g} % arrived"
    )
    for name in a.traces.split(","):
        rs = []
        for s in seeds:
            try:
                r = seed_bound(name, s, a.gpu_free == "placed", a.placed_before, a.integral)
            except Infeasible:
                print(f"{name:<12} seed {s}: no placement holds every pod that must be placed")
                continue
            rs.append(r)
            left = ", ".join(f"{k[5:]}: {v:.1f}" for k, v in r.items() if k.startswith("left_"))
            print(
                f"{name:<12} seed {s}: arrived {r['arrived']:.2f}  bound {r['bound']:.3f}"
                f"  (left out, GPU milli: count: {left or '-'})"
            )
        if not rs:
            continue
        mean = statistics.fmean(r["bound"] for r in rs)
        print(
            f"{name:<12} mean of {len(rs)}: {mean:.3f}  min {min(r['bound'] for r in rs):.3f}"
            f"  max {max(r['bound'] for r in rs):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
