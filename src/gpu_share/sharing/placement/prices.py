"""What a device's free space is worth to the shares still to come (cutting-stock duals).

Shares of one device pack like items into bins. For the workload's share mix (sizes s
with popularity d_s) the LP relaxation of packing it into the fewest devices (Gilmore and
Gomory's cutting-stock LP: min sum x_j over device fillings j, covering d) has dual prices
y_s >= 0 with sum_s n_s y_s <= 1 for every filling n of one device: y_s is the share of a
device that a pod of size s is worth in an optimal packing of the mix (an 810 on openb is
worth a whole device, a 470 half of one).

``V(g)`` = the most a gap of g can still be worth (a knapsack over the prices). Putting a
share s into a gap g keeps ``V(g - s) + y_s`` of the ``V(g)`` the gap was worth; the
difference, ``loss(g, s) >= 0``, is value that no later share can recover. Fillings with
zero loss are exactly the ones an optimal packing of the mix uses, so a placer that
prefers them follows an optimal packing online (the LP primal-dual view of online
stochastic bin packing). Solved here by column generation with a small revised simplex
(m = distinct share sizes rows, knapsack pricing), in plain Python: no solver dependency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

_EPS = 1e-9
_MAX_ITER = 400


@dataclass(frozen=True)
class SharePrices:
    """Dual prices of share sizes and the value of every gap, on a grid of ``unit`` milli
    (``levels`` = 1000 / unit per device)."""

    unit: int
    price: Mapping[int, float]  # size in grid steps -> y_s
    value: tuple[float, ...]  # V(g) for g = 0 .. levels

    @property
    def levels(self) -> int:
        return len(self.value) - 1

    def loss(self, gap_milli: float, share_milli: float) -> float:
        """Device value (fraction of a device) lost by putting a share into a gap."""
        g = min(self.levels, max(0, math.floor(gap_milli / self.unit + 1e-6)))
        s = max(1, math.ceil(share_milli / self.unit - 1e-6))
        if s > g:
            return 0.0  # does not fit on the grid: nothing to price
        y = self.price.get(s, self.value[s])
        return max(0.0, self.value[g] - self.value[g - s] - y)


def _knapsack(levels: int, price: Mapping[int, float]) -> tuple[list[float], list[int]]:
    """Unbounded knapsack: V(g) for every g, and the last size taken at each g (0: none)."""
    value = [0.0] * (levels + 1)
    last = [0] * (levels + 1)
    for g in range(1, levels + 1):
        value[g], last[g] = value[g - 1], 0
        for s, y in price.items():
            if s <= g and y > 0 and value[g - s] + y > value[g] + _EPS:
                value[g], last[g] = value[g - s] + y, s
    return value, last


def _filling(levels: int, last: list[int], sizes: list[int]) -> list[float]:
    """The best filling of a whole device found by ``_knapsack``, as counts per size."""
    counts = [0.0] * len(sizes)
    g = levels
    while g > 0:
        s = last[g]
        if s == 0:
            g -= 1
            continue
        counts[sizes.index(s)] += 1.0
        g -= s
    return counts


class _Master:
    """Revised simplex on the restricted master LP, basis inverse kept explicitly."""

    def __init__(self, sizes: list[int], demand: list[float], levels: int) -> None:
        m = len(sizes)
        self.m = m
        per = [float(levels // s) for s in sizes]  # one size alone fills a device
        self.binv = [[(1.0 / per[i] if i == k else 0.0) for k in range(m)] for i in range(m)]
        self.x = [demand[i] / per[i] for i in range(m)]
        self.cost = [1.0] * m

    def duals(self) -> list[float]:
        return [sum(self.cost[i] * self.binv[i][k] for i in range(self.m)) for k in range(self.m)]

    def enter(self, column: list[float], cost: float) -> bool:
        """Pivot ``column`` into the basis; False if it cannot enter (unbounded)."""
        u = [sum(self.binv[i][k] * column[k] for k in range(self.m)) for i in range(self.m)]
        rows = [i for i in range(self.m) if u[i] > _EPS]
        if not rows:
            return False
        r = min(rows, key=lambda i: (self.x[i] / u[i], -u[i]))
        self._pivot(r, u)
        self.cost[r] = cost
        return True

    def _pivot(self, r: int, u: list[float]) -> None:
        piv = u[r]
        self.binv[r] = [v / piv for v in self.binv[r]]
        self.x[r] /= piv
        for i in range(self.m):
            if i != r and u[i] != 0.0:
                f = u[i]
                self.binv[i] = [a - f * b for a, b in zip(self.binv[i], self.binv[r], strict=True)]
                self.x[i] -= f * self.x[r]


def _column(master: _Master, sizes: list[int], levels: int) -> tuple[list[float], float] | None:
    """An improving column (surplus for a negative dual, else the best filling), or None
    at the optimum."""
    y = master.duals()
    for k, v in enumerate(y):
        if v < -_EPS:
            return [-1.0 if i == k else 0.0 for i in range(len(sizes))], 0.0
    _, last = _knapsack(levels, {s: v for s, v in zip(sizes, y, strict=True)})
    col = _filling(levels, last, sizes)
    if sum(c * v for c, v in zip(col, y, strict=True)) <= 1.0 + 1e-7:
        return None
    return col, 1.0


def share_prices(demand: Mapping[int, float], unit: int, levels: int) -> SharePrices:
    """Prices for shares of ``demand`` (size in grid steps of ``unit`` milli -> weight)."""
    sizes = sorted(s for s, w in demand.items() if 0 < s < levels and w > 0)
    if not sizes:
        return SharePrices(unit, {}, tuple([0.0] * (levels + 1)))
    # A tiny distinct perturbation of the demand keeps the simplex off degenerate cycles.
    total = sum(demand[s] for s in sizes)
    want = [demand[s] / total * (1.0 + 1e-6 * (i + 1)) for i, s in enumerate(sizes)]
    master = _Master(sizes, want, levels)
    for _ in range(_MAX_ITER):
        got = _column(master, sizes, levels)
        if got is None or not master.enter(*got):
            break
    y = {s: max(0.0, v) for s, v in zip(sizes, master.duals(), strict=True)}
    value, _ = _knapsack(levels, y)
    return SharePrices(unit, y, tuple(value))


def grid(share_milli: list[float]) -> int:
    """Grid step for the sizes: their gcd with 1000 (whole milli), at least 10 milli so
    the knapsack stays small (sizes are rounded up to it)."""
    g = 1000
    for v in share_milli:
        g = math.gcd(g, round(v))
    return max(g, 10)
