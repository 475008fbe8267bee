"""Cutting-stock prices of share sizes (sharing/placement/prices.py) and their use by fgd."""

from __future__ import annotations

import random

import pytest

from gpu_share.sharing.placement import ClusterIndex, Demand, DeviceSlot, NodeSlots, PodDemand
from gpu_share.sharing.placement.cluster_policy import make_policy
from gpu_share.sharing.placement.fragmentation import Shape, Workload
from gpu_share.sharing.placement.prices import grid, share_prices


def test_an_810_is_worth_a_device_and_a_470_half_of_one() -> None:
    p = share_prices({81: 1.0, 47: 1.0}, 10, 100)
    assert p.price[81] == pytest.approx(1.0)
    assert p.price[47] == pytest.approx(0.5)
    assert p.value[100] == pytest.approx(1.0)
    assert p.loss(1000, 810) == pytest.approx(0.0)  # 810 on a free device: all it can be
    assert p.loss(530, 470) == pytest.approx(0.0)  # the second 470: the planned pair
    assert p.loss(1000, 470) == pytest.approx(0.0)


def test_a_share_in_the_wrong_gap_loses_value() -> None:
    # 650 + 320 and 470 + 470 fill devices; a 320 in a 470's gap spoils a pair
    p = share_prices({65: 1.0, 32: 1.0, 47: 1.0}, 10, 100)
    assert p.loss(350, 320) == pytest.approx(0.0)
    assert p.loss(530, 320) > 0.1
    assert p.loss(100, 320) == 0.0  # does not fit: not priced


def test_no_shares_no_prices() -> None:
    p = share_prices({}, 10, 100)
    assert p.loss(1000, 500) == 0.0


def test_grid_is_the_gcd_with_a_floor_of_ten() -> None:
    assert grid([810.0, 470.0]) == 10
    assert grid([250.0, 500.0]) == 250
    assert grid([187.5, 500.0]) == 10


@pytest.mark.parametrize("seed", range(25))
def test_prices_are_an_optimal_dual_of_the_cutting_stock_lp(seed: int) -> None:
    """Dual feasible (no filling of one device is worth more than 1) and as good as the
    LP's optimum (HiGHS on the arc-flow form, when scipy is there)."""
    rng = random.Random(seed)
    levels = rng.choice((10, 20, 100))
    demand = {rng.randint(1, levels - 1): rng.uniform(0.1, 3.0) for _ in range(rng.randint(1, 8))}
    p = share_prices(demand, 1000 // levels, levels)
    assert p.value[levels] <= 1.0 + 1e-6
    assert all(v >= 0 for v in p.price.values())
    total = sum(demand.values())
    got = sum(p.price[s] * w / total for s, w in demand.items())
    assert got == pytest.approx(_lp_devices(demand, levels, total), rel=1e-4)


def _lp_devices(demand: dict[int, float], levels: int, total: float) -> float:
    np = pytest.importorskip("numpy")
    opt = pytest.importorskip("scipy.optimize")
    sizes = sorted(demand)
    arcs = [(i, i + 1, 0) for i in range(levels)]
    arcs += [(i, i + s, s) for i in range(levels) for s in sizes if i + s <= levels]
    a_eq = np.zeros((levels - 1, len(arcs)))
    a_ub = np.zeros((len(sizes), len(arcs)))
    for k, (a, b, s) in enumerate(arcs):
        if 0 < a < levels:
            a_eq[a - 1, k] += 1
        if 0 < b < levels:
            a_eq[b - 1, k] -= 1
        if s:
            a_ub[sizes.index(s), k] = -1
    cost = [1.0 if a == 0 else 0.0 for a, _, _ in arcs]
    res = opt.linprog(
        cost,
        A_ub=a_ub,
        b_ub=[-demand[s] / total for s in sizes],
        A_eq=a_eq,
        b_eq=np.zeros(levels - 1),
        method="highs",
    )
    return float(res.fun)


def _node(name: str, used: int) -> NodeSlots:
    dev = DeviceSlot(f"{name}-0", 0, 1000, 1000 - used, 1000, 1000 - used)
    return NodeSlots(name, (dev,))


def test_fgd_keeps_a_470s_gap_for_the_next_470() -> None:
    """The (470, 320) devices fgd made on openb: a 320 in a 470's gap leaves 210 that no
    share of the mix fills; with prices it goes beside the 220 (220 + 320 + 470 fits)."""
    w = Workload(Shape(m, m, 1.0) for m in (650, 470, 220, 320))
    pod = PodDemand((Demand("main", 320, 320),))
    nodes = [_node("n1", 470), _node("n2", 220)]
    got = ClusterIndex(make_policy("fgd", w), nodes).choose(pod)
    assert got is not None and got.node == "n2"
    assert got.score[0] == 0.0  # no value lost
    off = make_policy("fgd", w)
    off.price_shares = False
    plain = ClusterIndex(off, nodes).choose(pod)
    assert plain is not None and plain.node == "n1"
