"""dotprod and clustering in the replay index score nodes from per-state shared parts;
the choices must be exactly those of scoring every plan node by node (as the extender
does), with either tie-break."""

from __future__ import annotations

import random

import pytest

from bench.replay import trace
from gpu_share.sharing.placement import ClusterIndex, TieBreak, make_policy

EVERY = 10  # every 10th node: 121 nodes, filled past capacity by the prefix
PREFIX = 1100


@pytest.fixture(scope="module")
def openb() -> tuple[list, list]:
    try:
        nodes = trace.load_nodes()
    except FileNotFoundError:
        pytest.skip("openb trace not found (GPU_SHARE_TRACES)")
    nodes = nodes[::EVERY]
    pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    capacity = sum(len(n.devices) for n in nodes) * trace.GPU_MILLI
    return nodes, trace.arrival_order(pods, 42, capacity)[:PREFIX]


def _placements(nodes: list, pods: list, policy: str, tie: str, shared: bool) -> list:
    index = ClusterIndex(make_policy(policy), nodes, TieBreak(tie), random.Random(42))
    index.shared_parts = shared
    out = []
    for p in pods:
        d = p.demand()
        got = index.choose(d)
        if got is not None:
            index.commit(d, got)
        out.append(got)
    return out


@pytest.mark.parametrize("policy", ["dotprod", "clustering"])
@pytest.mark.parametrize("tie", ["deterministic", "random"])
def test_shared_parts_choose_as_plan_by_plan(
    openb: tuple[list, list], policy: str, tie: str
) -> None:
    nodes, order = openb
    fast = _placements(nodes, order, policy, tie, shared=True)
    slow = _placements(nodes, order, policy, tie, shared=False)
    assert fast == slow
    placed = [p for p in fast if p is not None]
    assert len(placed) < len(order)  # the cluster filled up: failures compared too
    assert len({p.node for p in placed}) > len(nodes) // 2
