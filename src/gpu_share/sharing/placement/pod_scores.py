"""A pod's fit and score per distinct node state, for the extender's filter and
prioritize (``evaluate_node`` without the device pick)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

from gpu_share.sharing.placement.cluster_policy import ClusterPolicy, Plan, Score
from gpu_share.sharing.placement.evaluate import (
    host_nofit,
    host_of,
    no_fit_reason,
    node_key,
    pod_shape,
)
from gpu_share.sharing.placement.memo import BoundedMemo
from gpu_share.sharing.placement.slots import NodeSlots, NoFit, PodDemand, StateKey


class PodScores:
    """``evaluate_node``'s answer for one pod without its device pick (``realise``):
    the placement's score, or the same NoFit. Computed once per distinct ``node_key``
    (as ``ClusterIndex`` scores once per GPU state); filter and prioritize need no more,
    bind still picks devices with ``evaluate_node``."""

    memo_limit = 100_000

    def __init__(
        self, policy: ClusterPolicy, pod: PodDemand, prices: Mapping[str, float] | None = None
    ) -> None:
        self.policy = policy
        self.pod = pod
        self.prices: dict[str, float] = dict(prices or {})
        self._shape = pod_shape(pod)
        self._memo: BoundedMemo[Hashable, Score | NoFit] = BoundedMemo()
        # The memo's look-up (None: not scored yet, then ``by_key``): a loop over
        # thousands of nodes calls it without a method of ours around it.
        self.known: Callable[[Hashable], Score | NoFit | None] = self._memo.get
        # Per GPU state: its plans for the pod, or why no device set fits (the reason
        # reads healthy devices only, which the state holds; ``of`` puts the asker's
        # name on it). Nodes that differ only in host values, model or held requests
        # share it: a new shape costs one plan enumeration per state, then a host check
        # and a look-up per node key, and no new object per key that does not fit.
        self._by_state: BoundedMemo[StateKey, tuple[Plan, ...] | NoFit] = BoundedMemo()

    def of(self, node: NodeSlots, key: Hashable | None = None) -> Score | NoFit:
        """``key``: ``node_key(node)`` when the caller keeps it."""
        k = node_key(node) if key is None else key
        got = self._memo.get(k)
        if got is None:
            got = self._compute(node)
            self._memo.put(k, got, self.memo_limit)
        if isinstance(got, NoFit) and got.node != node.name:
            return NoFit(node.name, got.reason, got.cause)  # as replace(), a third of its cost
        return got

    def by_key(self, node: NodeSlots, key: Hashable) -> Score | NoFit:
        """``of`` without the rename: a NoFit may name another node of the same key (its
        reason is this node's too). The extender's batch path: no object per node."""
        got = self._memo.get(key)
        if got is None:
            got = self._memo.put(key, self._compute(node), self.memo_limit)
        return got

    def _plans(self, node: NodeSlots) -> tuple[Plan, ...] | NoFit:
        state = node.state
        got = self._by_state.get(state)
        if got is None:
            plans = self.policy.plans(state, self._shape)
            got = plans if plans else NoFit(node.name, no_fit_reason(node, self.pod))
            self._by_state.put(state, got, self.memo_limit)
        return got

    def _compute(self, node: NodeSlots) -> Score | NoFit:
        why = host_nofit(node, self.pod)
        if why is not None:
            return why
        plans = self._plans(node)
        if isinstance(plans, NoFit):
            return plans
        state = node.state
        before: float | None = None
        if self.policy.host_aware:  # what score() would compute once per plan
            before = self.policy.potential(state, node.cpu_free, node.host_memory_free, node.model)
        host = host_of(node, self.pod, self.prices, self._shape)
        ev = self.policy.evaluate(state, self._shape, host, before)
        assert ev is not None  # there is a plan
        return ev.score
