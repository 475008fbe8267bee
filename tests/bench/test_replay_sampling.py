"""kube-scheduler's node sampling in the replay (bench/replay/sampling.py): the number
of nodes it looks for, the rotating window, its feasibility check, and that sampling at
100 % places exactly as the unsampled replay."""

from __future__ import annotations

import random

import pytest

from bench.replay import sampling, sim, trace
from gpu_share.sharing.placement import (
    ClusterIndex,
    Demand,
    DeviceSlot,
    NodeSlots,
    PodDemand,
    TieBreak,
    Workload,
    make_policy,
)

Openb = tuple[list[NodeSlots], list[trace.TracePod], Workload]


def test_nodes_to_find_follows_kube_scheduler() -> None:
    assert sampling.nodes_to_find(10, 99) == 99  # under 100 nodes: all of them
    assert sampling.nodes_to_find(100, 5000) == 5000
    assert sampling.nodes_to_find(10, 1213) == 121
    assert sampling.nodes_to_find(5, 1213) == 100  # at least 100
    assert sampling.nodes_to_find(50, 1213) == 606
    # adaptive: 50 - n/125 percent, at least 5
    assert sampling.nodes_to_find(0, 1213) == 1213 * 41 // 100
    assert sampling.nodes_to_find(0, 5000) == 500
    assert sampling.nodes_to_find(0, 10000) == 500  # 5 % floor
    assert sampling.nodes_to_find(0, 150) == 100


def test_window_rotates_past_the_last_node_taken() -> None:
    order = [f"n{i:03d}" for i in range(200)]
    w = sampling.Window(order, 50)  # looks for 100 feasible nodes
    bad = {"n001", "n003", "n150"}

    def ok(n: str) -> bool:
        return n not in bad

    found, processed = w.next(ok)
    # n000..n101 less n001, n003: 100 feasible, 102 processed
    assert found[0] == "n000" and found[-1] == "n101" and len(found) == 100
    assert (processed, w.start) == (102, 102)
    found, processed = w.next(ok)
    # n102..n199 less n150 = 97, then n000, n002, n004 (wrapping around)
    assert found[:2] == ["n102", "n103"] and found[-3:] == ["n000", "n002", "n004"]
    assert "n150" not in found and len(found) == 100
    assert (processed, w.start) == (103, 5)
    # fewer feasible than wanted: every node processed, the start stays
    found, processed = sampling.Window(order, 50).next(lambda n: n < "n050")
    assert (len(found), processed) == (50, 200)
    full = sampling.Window(order, 100)
    assert full.next(ok)[0] == [n for n in order if ok(n)] and full.start == 0


def _node(name: str, free: tuple[int, ...], cpu: int = 8000, model: str = "T4") -> NodeSlots:
    devs = tuple(DeviceSlot(f"{name}-{i}", i, 1000, f, 1000, f) for i, f in enumerate(free))
    return NodeSlots(name, devs, cpu, 64000, model, cpu_total=cpu, host_memory_total=64000)


def test_kube_feasible_counts_node_totals_not_one_device() -> None:
    pod = PodDemand((Demand("main", 600, 600),), cpu=1000, host_memory=1000)
    split = _node("a", (300, 300))  # 600 free in all, no device holds 600
    assert sampling.kube_feasible(split, pod)
    assert not sampling.kube_feasible(_node("b", (300, 200)), pod)
    assert not sampling.kube_feasible(_node("c", (1000,), cpu=500), pod)
    idx = ClusterIndex(make_policy("best-fit"), [split, _node("c", (1000,), cpu=500)])
    ok = sampling.Sampled(idx, 100).feasible(pod)
    assert ok("a") and not ok("c")
    assert idx.choose(pod) is None  # the extender's filter, not kube-scheduler's


@pytest.fixture(scope="module")
def openb() -> Openb:
    try:
        nodes = trace.load_nodes()
    except FileNotFoundError:
        pytest.skip("openb trace not found (GPU_SHARE_TRACES)")
    nodes = nodes[::8]  # 152 nodes: over kube-scheduler's 100-node minimum
    pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    capacity = sum(len(n.devices) for n in nodes) * trace.GPU_MILLI
    order = trace.arrival_order(pods, 42, capacity)
    return nodes, order[:1400], sim.workload_of(pods)


def test_sampling_at_100_places_as_the_unsampled_replay(openb: Openb) -> None:
    nodes, order, workload = openb
    plain = sim.run(nodes, order, workload, "fgd", "deterministic", 42)
    full = sim.run(nodes, order, workload, "fgd", "deterministic", 42, sample=100)
    assert plain.failed > 0  # filled past capacity: failures compared too
    assert (full.allocation, full.curve) == (plain.allocation, plain.curve)
    assert (full.placed, full.failed) == (plain.placed, plain.failed)


def test_sampled_choice_is_the_best_of_its_window(openb: Openb) -> None:
    """At 50 % each pod goes to the best node among kube-scheduler's window (checked
    against the index restricted to those nodes), and the window moves between pods."""
    nodes, order, workload = openb
    pol = make_policy("fgd", workload)
    idx = ClusterIndex(pol, nodes, TieBreak.DETERMINISTIC, random.Random(1))
    s = sampling.Sampled(idx, 50, retry=False)
    starts = set()
    for p in order[:300]:
        d = p.demand()
        start = s.window.start
        probe = sampling.Window(s.window.order, 50)
        probe.start = start

        def feasible(n: str, d: PodDemand = d) -> bool:
            return sampling.kube_feasible(idx.nodes[n], d)

        names, _ = probe.next(feasible)
        got = s.choose(d)
        assert s.window.start == probe.start
        starts.add(start)
        alone = ClusterIndex(pol, [idx.nodes[n] for n in names], TieBreak.DETERMINISTIC)
        want = alone.choose(d)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert (got.node, got.score) == (want.node, want.score)
            s.commit(d, got)
    assert len(starts) > 10
