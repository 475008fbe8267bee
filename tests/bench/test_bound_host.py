"""The host-aware offline bound (bench/replay/hostbound.py) against brute force: on tiny
instances it is never below the best placement found by trying every assignment."""

from __future__ import annotations

import itertools
import random

import pytest

pytest.importorskip("scipy")

from bench.replay import hostbound as hb
from bench.replay.trace import TracePod

Node = tuple[str, int, int, int]  # model, GPUs, CPU, memory


def _feasible(nodes: list[Node], pods: list[TracePod], where: tuple[object, ...]) -> bool:
    """``where[i]``: None (not placed), (node, device) for a share, (node, -1) for a
    whole-GPU pod (or a GPU-free one)."""
    for j, (model, gpus, cpu, mem) in enumerate(nodes):
        on = [(p, w) for p, w in zip(pods, where, strict=True) if w is not None and w[0] == j]
        if sum(p.cpu_milli for p, _ in on) > cpu or sum(p.memory_mib for p, _ in on) > mem:
            return False
        if any(p.gpu_spec and p.gpu_spec != model for p, _ in on):
            return False
        used = [0] * gpus
        for p, (_, d) in on:
            if d >= 0:
                used[d] += p.gpu_milli
        if any(u > 1000 for u in used):
            return False
        whole = sum(p.num_gpu for p, (_, d) in on if d < 0 and p.gpu_milli)
        if whole > sum(1 for u in used if u == 0):
            return False
    return True


def _options(nodes: list[Node], p: TracePod) -> list[object]:
    out: list[object] = [None]
    for j, (_, gpus, _, _) in enumerate(nodes):
        if p.num_gpu == 1 and p.gpu_milli < 1000:
            out.extend((j, d) for d in range(gpus))
        else:
            out.append((j, -1))
    return out


def brute_force(nodes: list[Node], pods: list[TracePod]) -> int:
    best = 0
    for where in itertools.product(*(_options(nodes, p) for p in pods)):
        got = sum(p.gpu_request for p, w in zip(pods, where, strict=True) if w is not None)
        if got > best and _feasible(nodes, pods, where):
            best = got
    return best


def lp_bound(nodes: list[Node], pods: list[TracePod]) -> float:
    counts: dict[Node, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    types = [hb.NodeType(m, g, c, mem, k) for (m, g, c, mem), k in counts.items()]
    return hb.bound(types, hb.pod_classes(pods)).milli


def _pod(i: int, rng: random.Random, unit: int) -> TracePod:
    kind = rng.random()
    if kind < 0.65:
        gpu, milli = 1, unit * rng.randint(1, 1000 // unit - 1)
    elif kind < 0.9:
        gpu, milli = rng.choice((1, 2)), 1000
    else:
        gpu, milli = 0, 0
    spec = rng.choice(("", "", "", "A", "B"))
    return TracePod(f"p{i}", rng.choice((1, 2, 4, 6)), rng.choice((1, 3, 5)), gpu, milli, spec)


@pytest.mark.parametrize("seed", range(60))
def test_bound_is_never_below_the_best_placement(seed: int) -> None:
    rng = random.Random(seed)
    unit = rng.choice((100, 100, 50, 10))
    nodes = [
        (rng.choice("AB"), rng.choice((1, 2)), rng.choice((4, 8)), rng.choice((6, 8)))
        for _ in range(rng.choice((1, 2, 2)))
    ]
    pods = [_pod(i, rng, unit) for i in range(rng.randint(2, 5))]
    exact = brute_force(nodes, pods)
    assert lp_bound(nodes, pods) >= exact - 1e-6


@pytest.mark.parametrize(
    ("nodes", "pods", "want"),
    [
        # an 810 share strands 190 milli unless a <= 190 share fills it
        ([("A", 1, 8, 8)], [(1, 810), (1, 810)], 810),
        ([("A", 1, 8, 8)], [(1, 810), (1, 190), (1, 200)], 1000),
        ([("A", 2, 8, 8)], [(1, 810), (1, 810), (1, 190), (1, 190), (1, 500)], 2000),
        # host CPU: two whole GPUs asking 6 cores each on a node of 8 cores
        ([("A", 2, 8, 8)], [(1, 1000), (1, 1000)], 1000),
        # a 2-GPU pod needs both devices of one node, not one on each of two nodes
        ([("A", 1, 8, 8), ("A", 1, 8, 8)], [(2, 1000)], 0),
    ],
)
def test_bound_is_exact_on_small_cases(
    nodes: list[Node], pods: list[tuple[int, int]], want: int
) -> None:
    tp = [TracePod(f"p{i}", 6 if m == 1000 else 1, 1, g, m, "") for i, (g, m) in enumerate(pods)]
    assert brute_force(nodes, tp) == want
    assert lp_bound(nodes, tp) == pytest.approx(want, abs=1e-6)


def test_arrived_cuts_where_the_replay_records_its_checkpoint() -> None:
    pods = [TracePod(f"p{i}", 1, 1, 1, 400, "") for i in range(5)]
    assert len(hb.arrived(pods, 1000)) == 3  # 1200 >= 1000: the third pod is counted
    assert len(hb.arrived(pods, 1200)) == 3
    assert len(hb.arrived(pods, 1201)) == 4


def test_pods_that_must_be_placed_but_cannot_make_it_infeasible() -> None:
    pods = [TracePod(f"p{i}", 1, 1, 1, 810, "") for i in range(3)]
    types = [hb.NodeType("A", 2, 8, 8, 1)]
    assert hb.bound(types, hb.pod_classes(pods, required=2)).milli == pytest.approx(1620)
    with pytest.raises(hb.Infeasible):
        hb.bound(types, hb.pod_classes(pods, required=3))
