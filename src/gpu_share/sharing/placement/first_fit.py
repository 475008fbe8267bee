"""Placement of DRA pods: the node is the policy's choice, the devices the allocator's.

In a DRA pool kube-scheduler's structured allocator picks the devices: it walks the
node's ResourceSlice in order (our slices list devices by index) and takes the first
that fits: for a share, the first device with the memory and cores free; for whole
devices, the first wholly free ones. So the extender scores each node by the policy's
score of that first-fit plan (``first_fit_plan``), not of the policy's own best plan:
the fgd node choice with first-fit devices places the openb streams as the simulator
does (docs/placement.md). ``FirstFitScores`` is ``PodScores``' counterpart for them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import replace

from gpu_share.sharing.placement.cluster_policy import ClusterPolicy, Plan, Score, Step
from gpu_share.sharing.placement.evaluate import host_nofit, host_of, no_fit_reason, node_key
from gpu_share.sharing.placement.fragmentation import fits_shared, whole_count
from gpu_share.sharing.placement.pod_scores import PodScores
from gpu_share.sharing.placement.slots import (
    ContainerPlacement,
    DeviceSlot,
    NodeSlots,
    NoFit,
    Placement,
    PodDemand,
)


def _take(free: list[DeviceSlot], m: int, c: int) -> tuple[list[DeviceSlot], int, int] | None:
    """The devices one container takes in slice order, with the per-device amounts."""
    k = whole_count(m, c, free[0].cores_total) if free else 0
    if k:
        whole = [d for d in free if d.whole_free][:k]
        if len(whole) < k:
            return None
        return whole, whole[0].memory_total, whole[0].cores_total
    for d in free:
        if fits_shared(d.key, m, c):
            return [d], m, c
    return None


def first_fit(
    node: NodeSlots, pod: PodDemand
) -> tuple[Plan, tuple[ContainerPlacement, ...]] | None:
    """The allocator's pick on ``node``: the plan the policy scores and the devices (as
    they were before), or None when no device set fits."""
    free = [d for d in sorted(node.devices, key=lambda d: d.index) if d.healthy]
    state = list(node.state)
    steps: list[Step] = []
    placed: list[ContainerPlacement] = []
    for c in pod.containers:
        if c.empty:
            continue
        got = _take(free, c.memory_units, c.cores)
        if got is None:
            return None
        devices, m, cores = got
        steps.append(Step(tuple(d.key for d in devices), m, cores))
        placed.append(ContainerPlacement(c.container, tuple(devices), m, cores))
        for d in devices:
            state.remove(d.key)
            after = replace(d, memory_free=d.memory_free - m, cores_free=d.cores_free - cores)
            state.append(after.key)
            free[free.index(d)] = after
    return Plan(tuple(sorted(state)), tuple(steps)), tuple(placed)


def _order(node: NodeSlots) -> tuple[tuple[int, int, int, int], ...]:
    return tuple(d.key for d in sorted(node.devices, key=lambda d: d.index) if d.healthy)


def _never(_key: Hashable) -> None:
    return None


class FirstFitScores(PodScores):
    """The policy's score of each node's first-fit plan for one pod, or why nothing fits
    (``PodScores``' interface). Memoised per node key and device order: two nodes in one
    GPU state with their devices in another order differ."""

    def __init__(
        self, policy: ClusterPolicy, pod: PodDemand, prices: Mapping[str, float] | None = None
    ) -> None:
        super().__init__(policy, pod, prices)
        self.known = _never  # the order is part of the key: every look-up is ``by_key``

    def of(self, node: NodeSlots, key: Hashable | None = None) -> Score | NoFit:
        return self.by_key(node, node_key(node) if key is None else key)

    def by_key(self, node: NodeSlots, key: Hashable) -> Score | NoFit:
        k = (key, _order(node))
        got = self._memo.get(k)
        if got is None:
            got = self._memo.put(k, self._compute(node), self.memo_limit)
        return got

    def placement(self, node: NodeSlots) -> Placement | NoFit:
        """The node's first-fit devices and their score (the bind's prediction)."""
        why = host_nofit(node, self.pod)
        if why is not None:
            return why
        got = first_fit(node, self.pod)
        if got is None:
            return NoFit(node.name, no_fit_reason(node, self.pod))
        plan, placed = got
        host = host_of(node, self.pod, self.prices, self._shape)
        return Placement(node.name, placed, self.policy.score(node.state, plan, host))

    def _compute(self, node: NodeSlots) -> Score | NoFit:
        got = self.placement(node)
        return got if isinstance(got, NoFit) else got.score
