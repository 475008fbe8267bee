"""One replay run: every pod is placed or fails once; pods never leave."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace

from bench.replay.sampling import Sampled
from bench.replay.trace import TracePod
from gpu_share.sharing.placement import (
    ANY_MODEL,
    ClusterIndex,
    ModelReq,
    NodeSlots,
    Shape,
    TieBreak,
    Workload,
    make_policy,
)

CHECKPOINTS = (90, 95, 100, 105, 110, 120, 130)  # arrived GPU requests, % of capacity


@dataclass
class RunResult:
    policy: str
    tie_break: str
    seed: int
    # checkpoint % -> allocated GPU-milli as % of capacity when arrivals first reach it
    allocation: dict[int, float] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (arrived %, unallocated %)
    decision_s: list[float] = field(default_factory=list)
    placed: int = 0
    failed: int = 0
    windows: int = 0  # sampled runs: kube-scheduler filter cycles (retries included)
    candidates: int = 0  # sampled runs: nodes those cycles passed to the extender


def workload_of(pods: list[TracePod]) -> Workload:
    """Target mix: the trace's own GPU pod shapes weighted by how often they occur."""
    counts: dict[tuple[int, int, int, int, ModelReq], int] = {}
    for p in pods:
        d = p.demand()
        for c in d.containers:
            k = (c.memory_units, c.cores, p.cpu_milli, p.memory_mib, d.models)
            counts[k] = counts.get(k, 0) + 1
    return Workload(
        Shape(m, c, float(n), cpu, mem, models) for (m, c, cpu, mem, models), n in counts.items()
    )


BLIND = "fgd-blind"  # bench only: fgd whose workload ignores model requirements (as before)
UNPRICED = "fgd-unpriced"  # bench only: fgd without the share prices (prices.py), as before


def blind(workload: Workload) -> Workload:
    """The same mix with every requirement dropped (fgd before model awareness): every
    shape counts toward every model, and no model is kept for the pods bound to it."""
    return Workload(replace(s, models=ANY_MODEL) for s in workload.shapes)


def run(
    nodes: list[NodeSlots],
    pods_in_order: list[TracePod],
    workload: Workload,
    policy: str,
    tie_break: str,
    seed: int,
    curve_every: int = 50,
    sample: int | None = None,
    sample_retry: bool = True,
) -> RunResult:
    """``sample``: kube-scheduler's percentageOfNodesToScore (``sampling.py``; 0 =
    its adaptive default); None: every node is a candidate (no kube-scheduler)."""
    if policy == BLIND:
        pol = make_policy("fgd", blind(workload))
    elif policy == UNPRICED:
        pol = make_policy("fgd", workload)
        pol.price_shares = False
    else:
        pol = make_policy(policy, workload if policy == "fgd" else None)
    index = ClusterIndex(pol, nodes, TieBreak(tie_break), random.Random(seed))
    chooser: ClusterIndex | Sampled = (
        index if sample is None else Sampled(index, sample, retry=sample_retry)
    )
    capacity = sum(len(n.devices) for n in nodes) * 1000
    res = RunResult(policy, tie_break, seed)
    arrived = 0
    allocated = 0
    checkpoints = list(CHECKPOINTS)
    for i, p in enumerate(pods_in_order):
        demand = p.demand()
        t0 = time.perf_counter()
        placement = chooser.choose(demand)
        res.decision_s.append(time.perf_counter() - t0)
        arrived += p.gpu_request
        if placement is None:
            res.failed += 1
        else:
            chooser.commit(demand, placement)
            res.placed += 1
            allocated += p.gpu_request
        arrived_pct = 100 * arrived / capacity
        while checkpoints and arrived_pct >= checkpoints[0]:
            res.allocation[checkpoints.pop(0)] = 100 * allocated / capacity
        if i % curve_every == 0 or not checkpoints:
            res.curve.append((arrived_pct, 100 - 100 * allocated / capacity))
    if isinstance(chooser, Sampled):
        res.windows, res.candidates = chooser.windows, chooser.candidates
    return res
