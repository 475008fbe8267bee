"""Choosing a node and devices for a pod among many: ``choose`` evaluates every node
(``evaluate.evaluate_node``; fine for a few hundred), ``ClusterIndex`` scores once per
distinct GPU state (the trace replay); both on the same policy scores.

Tie-breaking is explicit: ``deterministic`` takes the lexicographically smallest node
name, then the lowest device index; ``random`` draws uniformly among the equally best
nodes with the caller's seeded ``random.Random`` (devices: still lowest index).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Mapping, Sequence

from gpu_share.sharing.placement.cluster_policy import (
    ClusterPolicy,
    DemandShape,
    Plan,
    Score,
    StateEval,
    StateParts,
    state_parts,
)
from gpu_share.sharing.placement.evaluate import (
    apply,
    evaluate_node,
    host_fits,
    host_nofit,
    host_of,
    model_free,
    pod_shape,
    realise,
)
from gpu_share.sharing.placement.memo import BoundedMemo
from gpu_share.sharing.placement.slots import (
    NodeSlots,
    NoFit,
    Placement,
    PodDemand,
    StateKey,
    TieBreak,
)


def choose(
    policy: ClusterPolicy,
    nodes: Iterable[NodeSlots],
    pod: PodDemand,
    tie_break: TieBreak = TieBreak.DETERMINISTIC,
    rng: random.Random | None = None,
) -> Placement | None:
    """The best node for ``pod`` among ``nodes`` (no index; fine for a few hundred)."""
    best: list[Placement] = []
    listed = sorted(nodes, key=lambda n: n.name)
    prices = policy.prices(model_free(listed)) if policy.priced else {}
    for node in listed:
        p = evaluate_node(policy, node, pod, prices)
        if isinstance(p, NoFit):
            continue
        if not best or p.score < best[0].score:
            best = [p]
        elif p.score == best[0].score:
            best.append(p)
    if not best:
        return None
    if tie_break is TieBreak.RANDOM:
        return (rng or random.Random(0)).choice(best)
    return best[0]


class _Best:
    """The best-scoring nodes so far: the smallest name (deterministic ties) or all of
    them in the order offered (random ties)."""

    def __init__(self, rand: bool) -> None:
        self.rand = rand
        self.score: Score | None = None
        self.items: list[tuple[str, StateEval]] = []

    def offer(self, name: str, ev: StateEval) -> None:
        if self.score is None or ev.score < self.score:
            self.score = ev.score
            self.items = [(name, ev)]
        elif ev.score == self.score and self.rand:
            self.items.append((name, ev))
        elif ev.score == self.score and name < self.items[0][0]:
            self.items = [(name, ev)]


class ClusterIndex:
    """Nodes grouped by GPU state, so a pod is scored once per distinct state.

    Groups keep their node names sorted; the deterministic choice is the first name of
    the best group whose host resources fit, random ties collect every fitting name of
    every equally best group.
    """

    def __init__(
        self,
        policy: ClusterPolicy,
        nodes: Iterable[NodeSlots],
        tie_break: TieBreak = TieBreak.DETERMINISTIC,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.tie_break = TieBreak(tie_break)
        self.rng = rng or random.Random(0)
        self.nodes: dict[str, NodeSlots] = {}
        self._sid: dict[StateKey, int] = {}
        self._states: list[StateKey] = []
        self._groups: dict[int, list[str]] = {}
        self._node_sid: dict[str, int] = {}
        self._shape_id: dict[DemandShape, int] = {}
        self._memo: BoundedMemo[tuple[int, int], StateEval | None] = BoundedMemo()
        self._before: dict[str, float] = {}  # fgd potential of each node as it is
        self._model_free: dict[str, float] = {}  # free GPU-milli per device model
        # dotprod/clustering: plan parts shared by the nodes of a state, per (state, shape)
        self._parts: BoundedMemo[tuple[int, int], StateParts] = BoundedMemo()
        # False: score those two plan by plan as the extender does (tests compare both)
        self.shared_parts = not policy.host_aware
        for n in nodes:
            self._add(n)

    def _state_id(self, state: StateKey) -> int:
        sid = self._sid.get(state)
        if sid is None:
            sid = len(self._states)
            self._sid[state] = sid
            self._states.append(state)
        return sid

    def _add(self, node: NodeSlots) -> None:
        if node.name in self.nodes:
            raise ValueError(f"duplicate node {node.name!r}")
        sid = self._state_id(node.state)
        self.nodes[node.name] = node
        self._count_free(node, 1.0)
        self._node_sid[node.name] = sid
        bisect.insort(self._groups.setdefault(sid, []), node.name)

    def _remove(self, name: str) -> None:
        self._before.pop(name, None)
        sid = self._node_sid.pop(name)
        self._count_free(self.nodes.pop(name), -1.0)
        g = self._groups[sid]
        g.pop(bisect.bisect_left(g, name))
        if not g:
            del self._groups[sid]

    def _count_free(self, node: NodeSlots, sign: float) -> None:
        free = model_free([node])[node.model]
        self._model_free[node.model] = self._model_free.get(node.model, 0.0) + sign * free

    def update(self, node: NodeSlots) -> None:
        """Replace (or add) one node's view."""
        if node.name in self.nodes:
            self._remove(node.name)
        self._add(node)

    def _eval(self, sid: int, shape_id: int, shape: DemandShape) -> StateEval | None:
        key = (sid, shape_id)
        if key in self._memo:
            return self._memo[key]
        return self._memo.put(key, self.policy.evaluate(self._states[sid], shape),
                              self.policy.memo_limit)

    def choose(self, pod: PodDemand) -> Placement | None:
        shape = pod_shape(pod)
        shape_id = self._shape_id.setdefault(shape, len(self._shape_id))
        if self.policy.per_node:
            return self._choose_per_node(pod, shape, shape_id)
        best = _Best(self.tie_break is TieBreak.RANDOM)
        for sid, names in self._groups.items():
            ev = self._eval(sid, shape_id, shape)
            if ev is None or (best.score is not None and ev.score > best.score):
                continue
            for n in self._fitting(names, pod, all_of_them=best.rand):
                best.offer(n, ev)
        return self._realise(best, pod)

    def _choose_per_node(
        self, pod: PodDemand, shape: DemandShape, shape_id: int
    ) -> Placement | None:
        # Scores depend on each node (host resources, model): GPU states only prune.
        if self.shared_parts:
            return self._choose_by_parts(pod, shape, shape_id)
        best = _Best(self.tie_break is TieBreak.RANDOM)
        prices = self.policy.prices(self._model_free)
        for sid, names in self._groups.items():
            state = self._states[sid]
            if not self.policy.plans(state, shape):
                continue
            for n in names:
                ev = self._node_eval(n, state, pod, (prices, shape))
                if ev is not None:
                    best.offer(n, ev)
        return self._realise(best, pod)

    def _realise(self, best: _Best, pod: PodDemand) -> Placement | None:
        if not best.items:
            return None
        name, ev = self.rng.choice(best.items) if best.rand else best.items[0]
        return realise(self.nodes[name], pod, ev)

    def _choose_by_parts(
        self, pod: PodDemand, shape: DemandShape, shape_id: int
    ) -> Placement | None:
        """dotprod/clustering: as ``_choose_per_node`` scoring plan by plan, from the
        parts each GPU state shares across its nodes (``StateParts``)."""
        best = _Best(self.tie_break is TieBreak.RANDOM)
        for sid, names in self._groups.items():
            plans = self.policy.plans(self._states[sid], shape)
            if plans:
                self._offer_parts(best, self._state_parts(sid, shape_id, plans), names, pod)
        return self._realise(best, pod)

    def _offer_parts(
        self, best: _Best, parts: StateParts, names: Sequence[str], pod: PodDemand
    ) -> None:
        """dotprod/clustering: the nodes of one GPU state, unless the state's floor shows
        that none of them can reach the best so far."""
        if best.score is not None and self.policy.parts_floor(parts) > best.score:
            return
        shape = pod_shape(pod)
        for n in names:
            ev = self._parts_eval(n, parts, pod, shape)
            if ev is not None:
                best.offer(n, ev)

    def _state_parts(self, sid: int, shape_id: int, plans: Sequence[Plan]) -> StateParts:
        key = (sid, shape_id)
        got = self._parts.get(key)
        if got is None:
            got = self._parts.put(key, state_parts(self._states[sid], plans),
                                  self.policy.memo_limit)
        return got

    def _parts_eval(
        self, name: str, parts: StateParts, pod: PodDemand, shape: DemandShape
    ) -> StateEval | None:
        node = self.nodes[name]
        if host_nofit(node, pod) is not None:
            return None
        return self.policy.node_eval(parts, host_of(node, pod, None, shape))

    def _node_eval(
        self,
        name: str,
        state: StateKey,
        pod: PodDemand,
        ctx: tuple[Mapping[str, float], DemandShape],
    ) -> StateEval | None:
        node = self.nodes[name]
        if host_nofit(node, pod) is not None:
            return None
        host = host_of(node, pod, *ctx)
        before: float | None = None
        if self.policy.host_aware:
            before = self._before.get(name)
            if before is None:
                before = self.policy.potential(
                    state, node.cpu_free, node.host_memory_free, node.model
                )
                self._before[name] = before
        return self.policy.evaluate(state, ctx[1], host, before)

    def _fitting(self, names: Sequence[str], pod: PodDemand, all_of_them: bool) -> list[str]:
        out: list[str] = []
        for n in names:
            if host_fits(self.nodes[n], pod) is None:
                out.append(n)
                if not all_of_them:
                    break
        return out

    def commit(self, pod: PodDemand, placement: Placement) -> None:
        self.update(apply(self.nodes[placement.node], pod, placement))

    def place(self, pod: PodDemand) -> Placement | None:
        """Choose and commit; None when no node fits."""
        p = self.choose(pod)
        if p is not None:
            self.commit(pod, p)
        return p
