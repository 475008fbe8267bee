"""Cluster placement policies: score a pod on one node's GPU state (lower is better).

Every policy works on the node's GPU state key only, so nodes in the same state share
one (memoised) evaluation; node and device ties are broken outside (``cluster.py``).

* ``fgd`` (default, ours): first the least device value a share placement loses for
  good (cutting-stock prices of the workload's shares, ``prices.py``: a share goes into
  a gap that an optimal packing of the mix would put it in), then the least increase of
  node fragmentation against the target workload (FGD); ties then go to the placement
  leaving the least free capacity on the node (packing), so equal-gradient choices do
  not scatter pods over idle nodes.
* ``best-fit``: least free capacity left on the node after placement.
* ``packing``: the paper's GPU packing: a partly used device first, then a device of a
  node already in use, then an idle node; least free capacity left within a tier.
* ``spread``: most free capacity left.
* ``random``: no preference (every fitting node ties; with deterministic ties: first fit).
* ``dotprod``: the smallest dot product of the node's free resources and the pod's
  request, each dimension (GPU, CPU, memory) as a fraction of the node's capacity (the
  FGD paper's DotProd baseline, after Tetris).
* ``clustering``: pods with the same GPU request together: a node already holding one,
  else an idle node, else any; least free capacity left within a tier (the FGD paper's
  Clustering baseline).

Device choice inside a node uses the same score (a shared container goes on the device
whose use scores best; whole-device requests take the smallest wholly free devices).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpu_share.sharing.placement.fragmentation import (
    Workload,
    amount,
    fits_shared,
    is_whole_free,
    whole_count,
)
from gpu_share.sharing.placement.memo import BoundedMemo
from gpu_share.sharing.placement.slots import MILLI, DevKey, StateKey

Score = tuple[float, ...]
# (memory_units, cores) per container
DemandShape = tuple[tuple[int, int], ...]
_ROUND = 6  # decimals kept in scores: float noise must not break exact ties


class ClusterPolicyName(StrEnum):
    FGD = "fgd"
    BEST_FIT = "best-fit"
    PACKING = "packing"
    SPREAD = "spread"
    RANDOM = "random"
    DOTPROD = "dotprod"
    CLUSTERING = "clustering"


# Policies whose score depends on the node, not only on its GPU state.
PER_NODE = frozenset(
    {ClusterPolicyName.FGD, ClusterPolicyName.DOTPROD, ClusterPolicyName.CLUSTERING}
)


@dataclass(frozen=True)
class Step:
    """One container's use of devices: the consumed device keys and per-device amounts."""

    taken: tuple[DevKey, ...]
    memory_units: int
    cores: int


@dataclass(frozen=True)
class StateEval:
    score: Score
    after: StateKey
    steps: tuple[Step, ...]


def free_total(state: StateKey) -> float:
    return sum(amount(d) for d in state)


def _replace(state: StateKey, old: tuple[DevKey, ...], new: tuple[DevKey, ...]) -> StateKey:
    rest = list(state)
    for d in old:
        rest.remove(d)
    rest.extend(new)
    return tuple(sorted(rest))


def _options(state: StateKey, m: int, c: int) -> list[tuple[StateKey, Step]]:
    """Every distinct way to put one container on ``state``."""
    if not state:
        return []
    k = whole_count(m, c, state[0][3])
    if k:
        free = [d for d in state if is_whole_free(d)]
        if len(free) < k:
            return []
        taken = tuple(free[:k])  # smallest wholly free devices
        used = tuple((0, 0, d[2], d[3]) for d in taken)
        return [(_replace(state, taken, used), Step(taken, taken[0][2], taken[0][3]))]
    out: list[tuple[StateKey, Step]] = []
    for d in sorted(set(state)):
        if fits_shared(d, m, c):
            nd = (d[0] - m, d[1] - c, d[2], d[3])
            out.append((_replace(state, (d,), (nd,)), Step((d,), m, c)))
    return out


ScoreFn = Callable[[StateKey, StateKey, Step], Score]


@dataclass(frozen=True)
class Host:
    """The node around one placement: host resources (None = unknown) and what per-node
    policies look at (device model and its price, capacities, requests held there)."""

    cpu_free: int | None
    memory_free: int | None
    cpu: int = 0
    memory: int = 0
    model: str = ""
    price: float = 0.0  # ModelPressure price of the node's model (fgd)
    cpu_total: int | None = None
    memory_total: int | None = None
    held: frozenset[DemandShape] = frozenset()  # GPU requests of the pods on the node
    shape: DemandShape = ()  # the pod's GPU request

    def after(self) -> tuple[int | None, int | None]:
        return (
            None if self.cpu_free is None else self.cpu_free - self.cpu,
            None if self.memory_free is None else self.memory_free - self.memory,
        )


@dataclass(frozen=True)
class Plan:
    after: StateKey
    steps: tuple[Step, ...]


class ClusterPolicy:
    """Scores pods on GPU states; memoised by (state, demand shape).

    ``host_aware`` policies (fgd) also look at host CPU/memory, so their score is per
    node rather than per GPU state.
    """

    def __init__(self, name: ClusterPolicyName | str, workload: Workload | None = None) -> None:
        self.name = ClusterPolicyName(name)
        if self.name is ClusterPolicyName.FGD and workload is None:
            raise ValueError("the fgd policy needs a target workload")
        self.workload = workload
        self.host_aware = self.name is ClusterPolicyName.FGD
        self.per_node = self.name in PER_NODE
        # Weight of the host-stranding term next to the FGD gradient (0 = plain FGD).
        self.stranded_weight = 1.0
        # Weight of the model-pressure price (0 = model-aware fragmentation only).
        self.pressure_weight = 1.0
        # fgd: device value a share placement loses for good (``prices.py``) ranks first.
        self.price_shares = True
        self._score: ScoreFn = {
            ClusterPolicyName.FGD: self._fgd_gpu,
            ClusterPolicyName.BEST_FIT: _best_fit,
            ClusterPolicyName.PACKING: _packing,
            ClusterPolicyName.SPREAD: _spread,
            ClusterPolicyName.RANDOM: _random,
            ClusterPolicyName.DOTPROD: _best_fit,  # devices inside the node: best fit
            ClusterPolicyName.CLUSTERING: _best_fit,
        }[self.name]
        self._plans: BoundedMemo[tuple[StateKey, DemandShape], tuple[Plan, ...]] = BoundedMemo()
        self._memo: BoundedMemo[tuple[StateKey, DemandShape], StateEval | None] = BoundedMemo()
        self.memo_limit = 400_000

    def _fgd_gpu(self, before: StateKey, after: StateKey, step: Step) -> Score:
        assert self.workload is not None
        delta = self.workload.fragmentation(after) - self.workload.fragmentation(before)
        return (round(delta, _ROUND), round(free_total(after), _ROUND))

    def plans(self, state: StateKey, demand: DemandShape) -> tuple[Plan, ...]:
        """Distinct ways to place ``demand`` on ``state``: every option of the first
        container that needs devices, later containers greedily by the GPU-only score."""
        key = (state, demand)
        got = self._plans.get(key)
        if got is None:
            got = self._make_plans(state, demand)
            self._plans.put(key, got, self.memo_limit)
        return got

    def _make_plans(self, state: StateKey, demand: DemandShape) -> tuple[Plan, ...]:
        wanted = [(m, c) for m, c in demand if m or c]
        if not wanted:
            return (Plan(state, ()),)
        out: list[Plan] = []
        m0, c0 = wanted[0]
        for after, step in _options(state, m0, c0):
            cur, steps = after, [step]
            for m, c in wanted[1:]:
                best: tuple[Score, StateKey, Step] | None = None
                for a2, s2 in _options(cur, m, c):
                    sc = self._score(cur, a2, s2)
                    if best is None or sc < best[0]:
                        best = (sc, a2, s2)
                if best is None:
                    break
                cur = best[1]
                steps.append(best[2])
            else:
                out.append(Plan(cur, tuple(steps)))
        return tuple(out)

    def potential(
        self, state: StateKey, cpu_free: int | None, memory_free: int | None, model: str = ""
    ) -> float:
        """fgd's node value: fragmentation against the workload that can run on the node's
        device model, plus weighted host stranding."""
        assert self.workload is not None
        w = self.workload.for_model(model)
        return w.fragmentation(state, cpu_free, memory_free) + self.stranded_weight * (
            w.stranded(state, cpu_free, memory_free)
        )

    @property
    def priced(self) -> bool:
        """Whether scores carry model-pressure prices (fgd on a workload with shapes
        bound to models); callers skip computing free capacity per model otherwise."""
        w = self.workload
        return self.host_aware and w is not None and bool(w.pressure) and self.pressure_weight > 0

    def prices(self, free: Mapping[str, float]) -> dict[str, float]:
        """Model-pressure price per model (empty unless ``priced``); ``free``: GPU-milli
        free per model."""
        if not self.priced:
            return {}
        assert self.workload is not None
        return self.workload.pressure.prices(free)

    def score(
        self, state: StateKey, plan: Plan, host: Host | None = None, before: float | None = None
    ) -> Score:
        """Score of ``plan`` on ``state``; ``before`` = ``potential`` of the node as it is
        (callers that score many plans of one node pass it in)."""
        if self.host_aware and self.workload is not None:
            return self._fgd_score(state, plan, host or Host(None, None), before)
        if self.name is ClusterPolicyName.DOTPROD:
            return _dotprod(state, plan, host or Host(None, None))
        if self.name is ClusterPolicyName.CLUSTERING and plan.steps:
            return _clustering(state, plan, host or Host(None, None))
        if not plan.steps:
            # Nothing of ours requested: prefer nodes with the least free GPU capacity so
            # GPU-free pods stay off nodes GPU pods still need.
            return (round(free_total(state), _ROUND),)
        cur = state
        total: Score = ()
        for step in plan.steps:
            nxt = _replace(cur, step.taken, _consumed(step))
            sc = self._score(cur, nxt, step)
            total = sc if not total else tuple(a + b for a, b in zip(total, sc, strict=True))
            cur = nxt
        return total

    def _fgd_score(self, state: StateKey, plan: Plan, h: Host, before: float | None) -> Score:
        assert self.workload is not None
        if before is None:
            before = self.potential(state, h.cpu_free, h.memory_free, h.model)
        cpu_after, mem_after = h.after()
        delta = self.potential(plan.after, cpu_after, mem_after, h.model) - before
        free_after = self.workload.usable(plan.after)[0]
        if h.price:
            taken = self.workload.usable(state)[0] - free_after
            delta += self.pressure_weight * h.price * taken
        lost = self._share_loss(plan, h.model) if self.price_shares else 0.0
        return (round(MILLI * lost, _ROUND), round(delta, _ROUND), round(free_after, _ROUND))

    def _share_loss(self, plan: Plan, model: str) -> float:
        assert self.workload is not None
        w = self.workload.for_model(model)
        return sum(w.share_loss(st.taken[0], st.memory_units, st.cores) for st in plan.steps)

    def parts_floor(self, parts: StateParts) -> Score:
        """A score no node in ``parts``' state can beat (``node_eval``)."""
        if self.name is ClusterPolicyName.DOTPROD:
            return parts.dotprod_floor
        return parts.clustering_floor

    def node_eval(self, parts: StateParts, h: Host) -> StateEval | None:
        """The best plan on one node for ``dotprod``/``clustering`` from the state's
        shared parts: the same result as scoring every plan with ``score``."""
        if self.name is ClusterPolicyName.DOTPROD:
            cpu, mem = _dotprod_host(h)
            return _first_best(parts, lambda _p, gpu: (round(gpu + cpu + mem, _ROUND),))
        if self.name is not ClusterPolicyName.CLUSTERING:
            raise ValueError(f"{self.name} is not scored from state parts")
        tier = _cluster_tier(h, parts.idle)

        def primary(plan: Plan, _gpu: float) -> Score:
            # no devices asked: the plan keeps the state, score() gives (free,) alone
            return (tier,) if plan.steps else ()

        return _first_best(parts, primary)

    def evaluate(
        self,
        state: StateKey,
        demand: DemandShape,
        host: Host | None = None,
        before: float | None = None,
    ) -> StateEval | None:
        """Best plan for ``demand`` on ``state`` (ties: first plan = smallest device key),
        or None when it does not fit. Memoised unless the score depends on the node.
        ``before``: as for ``score`` (computed once instead of once per plan)."""
        key = (state, demand)
        if not self.per_node and key in self._memo:
            return self._memo[key]
        best: StateEval | None = None
        for plan in self.plans(state, demand):
            sc = self.score(state, plan, host, before)
            if best is None or sc < best.score:
                best = StateEval(sc, plan.after, plan.steps)
        if not self.per_node:
            self._memo.put(key, best, self.memo_limit)
        return best


def _consumed(step: Step) -> tuple[DevKey, ...]:
    return tuple((d[0] - step.memory_units, d[1] - step.cores, d[2], d[3]) for d in step.taken)


def _best_fit(before: StateKey, after: StateKey, step: Step) -> Score:
    return (round(free_total(after), _ROUND),)


def _spread(before: StateKey, after: StateKey, step: Step) -> Score:
    return (round(-free_total(after), _ROUND),)


def _random(before: StateKey, after: StateKey, step: Step) -> Score:
    return (0.0,)


def _packing(before: StateKey, after: StateKey, step: Step) -> Score:
    if any(not is_whole_free(d) for d in step.taken):
        tier = 0.0  # a device someone already shares
    elif any(not is_whole_free(d) for d in before):
        tier = 1.0  # a node already in use
    else:
        tier = 2.0  # an idle node
    return (tier, round(free_total(after), _ROUND))


def _fraction(part: float, whole: float | None) -> float:
    return part / whole if whole else 0.0


def _dotprod_gpu(state: StateKey, plan: Plan) -> float:
    cap = MILLI * len(state)
    asked = free_total(state) - free_total(plan.after)
    return _fraction(free_total(state), cap) * _fraction(asked, cap)


def _dotprod_host(h: Host) -> tuple[float, float]:
    cpu = _fraction(h.cpu_free or 0, h.cpu_total) * _fraction(h.cpu, h.cpu_total)
    mem = _fraction(h.memory_free or 0, h.memory_total) * _fraction(h.memory, h.memory_total)
    return cpu, mem


def _dotprod(state: StateKey, plan: Plan, h: Host) -> Score:
    """Free resources . request, each dimension a fraction of the node's capacity."""
    cpu, mem = _dotprod_host(h)
    gpu = _dotprod_gpu(state, plan)
    return (round(gpu + cpu + mem, _ROUND), round(free_total(plan.after), _ROUND))


def _cluster_tier(h: Host, idle: bool) -> float:
    if h.shape in h.held:
        return 0.0  # pods with the same GPU request are here
    return 1.0 if idle else 2.0  # an idle node starts a new cluster


def _clustering(state: StateKey, plan: Plan, h: Host) -> Score:
    tier = _cluster_tier(h, all(is_whole_free(d) for d in state))
    return (tier, round(free_total(plan.after), _ROUND))


@dataclass(frozen=True)
class StateParts:
    """What the dotprod and clustering scores of every plan on one GPU state share
    across nodes: computed once per (state, request), combined per node with its host
    values (``ClusterPolicy.node_eval``). Same arithmetic, same order: same scores."""

    idle: bool
    plans: tuple[tuple[Plan, float, float], ...]  # (plan, dotprod GPU term, rounded free after)
    # no node in this state scores below these (host terms are >= 0, tiers >= 0)
    dotprod_floor: Score
    clustering_floor: Score


def state_parts(state: StateKey, plans: Sequence[Plan]) -> StateParts:
    got = tuple((p, _dotprod_gpu(state, p), round(free_total(p.after), _ROUND)) for p in plans)
    least_free = min(f for _, _, f in got)
    steps = any(p.steps for p in plans)
    return StateParts(
        all(is_whole_free(d) for d in state),
        got,
        (round(min(g for _, g, _ in got), _ROUND),),
        (0.0, least_free) if steps else (least_free,),
    )


def _first_best(parts: StateParts, primary: Callable[[Plan, float], Score]) -> StateEval | None:
    best: StateEval | None = None
    for plan, gpu, free_after in parts.plans:
        sc = (*primary(plan, gpu), free_after)
        if best is None or sc < best.score:
            best = StateEval(sc, plan.after, plan.steps)
    return best


def make_policy(name: ClusterPolicyName | str, workload: Workload | None = None) -> ClusterPolicy:
    return ClusterPolicy(name, workload)


def demand_shape(containers: Sequence[tuple[int, int]]) -> DemandShape:
    return tuple((m, c) for m, c in containers)
