from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.sharing.placement import (
    ClusterIndex,
    Demand,
    DeviceSlot,
    NodeSlots,
    PodDemand,
    Shape,
    TieBreak,
    Workload,
    choose,
    evaluate_node,
    make_policy,
)
from gpu_share.sharing.placement.slots import NoFit

U = 100  # memory units and cores per device in these tests


def node(name: str, frees: list[int], cpu: int | None = None) -> NodeSlots:
    return NodeSlots(
        name, tuple(DeviceSlot(f"{name}-{i}", i, U, f, U, f) for i, f in enumerate(frees)), cpu
    )


def pod(share: int, cpu: int = 0, whole: int = 0) -> PodDemand:
    if whole:
        return PodDemand((Demand("c", whole * U, whole * U),), cpu=cpu)
    return PodDemand((Demand("c", share, share),), cpu=cpu)


def test_fragmentation_hand_checked() -> None:
    # Devices free 50 and 20 (amount = free * 10 milli). Shapes: 30 (p=0.5) and whole (0.5).
    w = Workload([Shape(30, 30, 1.0), Shape(U, U, 1.0)])
    state = node("n", [50, 20]).state
    # shape 30: fits on the 50 device; the 20 device (200 milli) is a fragment.
    # whole: no wholly free device -> everything (700 milli) is a fragment.
    assert w.fragmentation(state) == pytest.approx(0.5 * 200 + 0.5 * 700)
    # An empty node: shape 30 fits everywhere, whole fits: no fragment.
    assert w.fragmentation(node("e", [U, U]).state) == 0


def test_host_cpu_makes_everything_fragment() -> None:
    w = Workload([Shape(30, 30, 1.0, cpu=8)])
    state = node("n", [U]).state
    assert w.fragmentation(state, cpu_free=8) == 0
    assert w.fragmentation(state, cpu_free=7) == pytest.approx(1000)


def test_fgd_prefers_the_placement_that_keeps_whole_devices() -> None:
    w = Workload([Shape(U, U, 1.0), Shape(50, 50, 1.0)])
    pol = make_policy("fgd", w)
    # A is half used, B is idle: a 50 share should finish A, keeping B whole.
    got = choose(pol, [node("a", [50, U]), node("b", [U, U])], pod(50))
    assert got is not None and got.node == "a"
    assert got.containers[0].devices[0].index == 0


def test_filter_reason_when_no_single_device_fits() -> None:
    pol = make_policy("best-fit")
    r = evaluate_node(pol, node("n", [40, 40]), pod(60))
    assert isinstance(r, NoFit)
    assert "no single device fits" in r.reason and "largest free block is 40" in r.reason


def test_deterministic_ties_take_smallest_name_and_lowest_index() -> None:
    pol = make_policy("random")
    nodes = [node(n, [U, U]) for n in ("c", "a", "b")]
    got = ClusterIndex(pol, nodes).choose(pod(10))
    assert got is not None and got.node == "a" and got.containers[0].devices[0].index == 0


def test_random_ties_are_seeded_and_spread() -> None:
    nodes = [node(f"n{i}", [U]) for i in range(8)]
    picks = {
        ClusterIndex(make_policy("random"), nodes, TieBreak.RANDOM, random.Random(s))
        .choose(pod(10))
        .node  # type: ignore[union-attr]
        for s in range(20)
    }
    assert len(picks) > 1
    a = ClusterIndex(make_policy("random"), nodes, TieBreak.RANDOM, random.Random(7)).choose(pod(5))
    b = ClusterIndex(make_policy("random"), nodes, TieBreak.RANDOM, random.Random(7)).choose(pod(5))
    assert a == b


def test_whole_device_pods_take_wholly_free_devices() -> None:
    pol = make_policy("best-fit")
    idx = ClusterIndex(pol, [node("a", [U, 90, U])])
    got = idx.place(pod(0, whole=2))
    assert got is not None and [d.index for d in got.containers[0].devices] == [0, 2]
    assert idx.choose(pod(0, whole=1)) is None


def test_host_cpu_is_respected() -> None:
    idx = ClusterIndex(make_policy("best-fit"), [node("a", [U], cpu=4), node("b", [U], cpu=16)])
    got = idx.place(pod(10, cpu=8))
    assert got is not None and got.node == "b"
    assert idx.nodes["b"].cpu_free == 8


POLICIES = ["fgd", "best-fit", "packing", "spread", "random"]
frees = st.lists(st.integers(0, U), min_size=1, max_size=4)
requests = st.lists(
    st.one_of(
        st.integers(1, U - 1).map(lambda s: pod(s)),
        st.integers(1, 2).map(lambda k: pod(0, whole=k)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(frees, min_size=1, max_size=5),
    requests,
    st.sampled_from(POLICIES),
    st.sampled_from(list(TieBreak)),
    st.integers(0, 3),
)
def test_never_beyond_capacity_and_indexed_equals_plain(
    cluster: list[list[int]], pods: list[PodDemand], policy: str, tie: TieBreak, seed: int
) -> None:
    w = Workload([Shape(30, 30, 2.0), Shape(U, U, 1.0), Shape(2 * U, 2 * U, 0.5)])
    nodes = [node(f"n{i}", f) for i, f in enumerate(cluster)]
    pol = make_policy(policy, w)
    idx = ClusterIndex(pol, nodes, tie, random.Random(seed))
    for p in pods:
        if tie is TieBreak.DETERMINISTIC:
            plain = choose(pol, list(idx.nodes.values()), p)
        got = idx.place(p)  # apply() raises on any over-commit
        if tie is TieBreak.DETERMINISTIC:
            assert got == plain
    for n in idx.nodes.values():
        for d in n.devices:
            assert 0 <= d.memory_free <= d.memory_total and 0 <= d.cores_free <= d.cores_total


@settings(max_examples=20, deadline=None)
@given(st.lists(frees, min_size=1, max_size=5), requests)
def test_deterministic_ties_are_reproducible(
    cluster: list[list[int]], pods: list[PodDemand]
) -> None:
    w = Workload([Shape(30, 30, 1.0), Shape(U, U, 1.0)])

    def run() -> list[object]:
        idx = ClusterIndex(make_policy("fgd", w), [node(f"n{i}", f) for i, f in enumerate(cluster)])
        return [idx.place(p) for p in pods]

    assert run() == run()
