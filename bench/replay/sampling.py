"""kube-scheduler's node sampling (``percentageOfNodesToScore``) in the replay.

kube-scheduler (pkg/scheduler/schedule_one.go) does not filter every node when the
percentage is below 100: it walks its node list from ``nextStartNodeIndex`` (wrapping
around) and stops once it has ``numFeasibleNodesToFind`` nodes that pass its own
filters; only those reach the extender, which picks the best of them (fgd). The next
pod's walk starts where this one stopped. Modelled here:

* ``nodes_to_find``: all nodes below 100 nodes or at >= 100 %; percentage 0 = adaptive
  ``50 - nodes/125`` (at least 5); at least 100 nodes.
* ``kube_feasible``: kube-scheduler's own filters: the node's device model is one the
  pod accepts (node affinity on the product label), host CPU and memory fit, and the
  node's totals of free memory units and cores cover the pod's (the extended resources
  as kube-scheduler counts them, per node) - not that one device fits.
* ``Window``: the walk, sequential (kube-scheduler checks in parallel and may overshoot
  by a few nodes): the first ``nodes_to_find`` feasible nodes from the start index; the
  start moves past the last one taken (past every node when fewer were found).
* ``Sampled.choose``: the extender's choice among the window's nodes, scored as it
  scores them (``PodScores`` per distinct node key, devices by ``evaluate_node``),
  lowest score, then the smallest name (deterministic ties) or a seeded draw among the
  equally best. With ``retry`` a pod nothing in its window takes is tried again in the
  next windows until they have covered every node once (kube-scheduler requeues it;
  other pods arriving meanwhile are not modelled); without, it fails as in the
  unsampled replay. At 100 % every node goes to the extender without the walk (a device
  that fits implies kube-scheduler's filters pass): the unsampled replay's choice. The
  node order is the order the index got them (the trace's).
  Model-pressure prices come from the candidates (as the extender computes them) or the
  whole cluster (as the unsampled replay does); the openb files have no model
  requirements, so there are no prices on them either way.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from gpu_share.sharing.placement import (
    ClusterIndex,
    NodeSlots,
    NoFit,
    Placement,
    PodDemand,
    PodScores,
    TieBreak,
    evaluate_node,
    host_nofit,
    model_free,
    node_key,
)

Score = tuple[float, ...]
SCORERS = 512  # PodScores kept (one per distinct pod request and prices), oldest dropped

MIN_NODES = 100  # minFeasibleNodesToFind
MIN_PERCENT = 5  # minFeasibleNodesPercentageToFind
ADAPTIVE = 0  # percentageOfNodesToScore 0: kube-scheduler's own default


def nodes_to_find(percentage: int, n_all: int) -> int:
    """How many feasible nodes kube-scheduler looks for among ``n_all``."""
    if n_all < MIN_NODES or percentage >= 100:
        return n_all
    if percentage == ADAPTIVE:
        percentage = max(50 - n_all // 125, MIN_PERCENT)
    return max(n_all * percentage // 100, MIN_NODES)


def kube_feasible(node: NodeSlots, pod: PodDemand) -> bool:
    """Whether kube-scheduler's own filters pass ``node`` for ``pod``."""
    if host_nofit(node, pod) is not None:
        return False
    healthy = [d for d in node.devices if d.healthy]
    memory = sum(c.memory_units for c in pod.containers)
    cores = sum(c.cores for c in pod.containers)
    return memory <= sum(d.memory_free for d in healthy) and cores <= sum(
        d.cores_free for d in healthy
    )


class Window:
    """kube-scheduler's rotating search over a fixed node order."""

    def __init__(self, order: Sequence[str], percentage: int) -> None:
        self.order = list(order)
        self.want = nodes_to_find(percentage, len(self.order))
        self.start = 0  # nextStartNodeIndex

    def next(self, feasible: Callable[[str], bool]) -> tuple[list[str], int]:
        """The feasible nodes this cycle finds and how many nodes it processed (feasible
        and infeasible up to the last one taken); advances the start index."""
        n = len(self.order)
        found: list[str] = []
        processed = n
        for i in range(n):
            name = self.order[(self.start + i) % n]
            if feasible(name):
                found.append(name)
                if len(found) == self.want:
                    processed = i + 1
                    break
        self.start = (self.start + processed) % n
        return found, processed


class Sampled:
    """An index's nodes seen through kube-scheduler's window; ``choose``/``commit`` as
    ``ClusterIndex``'s (commit goes to the index, which keeps every node's view)."""

    def __init__(
        self,
        index: ClusterIndex,
        percentage: int,
        retry: bool = True,
        prices: str = "candidates",
    ) -> None:
        if prices not in ("candidates", "cluster"):
            raise ValueError(f"prices: candidates or cluster, not {prices!r}")
        self.index = index
        self.window = Window(list(index.nodes), percentage)  # the order nodes were added
        self.retry = retry
        self.prices = prices
        self.rng: random.Random = index.rng
        self._scores: dict[tuple[PodDemand, tuple[tuple[str, float], ...]], PodScores] = {}
        self._keys: dict[str, tuple[NodeSlots, Hashable]] = {}
        self._totals: dict[str, tuple[NodeSlots, int, int]] = {}
        self._all = sorted(index.nodes)
        self.windows = 0  # filter cycles run (retries included)
        self.candidates = 0  # nodes passed to the extender, summed over cycles

    def choose(self, pod: PodDemand) -> Placement | None:
        if self.window.want >= len(self.window.order):
            # Every node: kube-scheduler's filters add nothing to the extender's own
            # check (a fitting device implies the totals), so skip the walk.
            self.windows += 1
            self.candidates += len(self._all)
            return self.best(self._all, pod, presorted=True)
        feasible = self.feasible(pod)
        covered = 0
        while covered < len(self.window.order):
            names, processed = self.window.next(feasible)
            covered += processed
            self.windows += 1
            self.candidates += len(names)
            got = self.best(names, pod)
            if got is not None or not self.retry:
                return got
        return None

    def feasible(self, pod: PodDemand) -> Callable[[str], bool]:
        """``kube_feasible`` by node name, with each node's free totals kept until the
        node changes (the walk checks hundreds of nodes per pod)."""
        nodes, totals = self.index.nodes, self._totals
        memory = sum(c.memory_units for c in pod.containers)
        cores = sum(c.cores for c in pod.containers)
        allowed: dict[str, bool] = {}

        def ok(name: str) -> bool:
            node = nodes[name]
            t = totals.get(name)
            if t is None or t[0] is not node:
                healthy = [d for d in node.devices if d.healthy]
                t = totals[name] = (
                    node,
                    sum(d.memory_free for d in healthy),
                    sum(d.cores_free for d in healthy),
                )
            if memory > t[1] or cores > t[2] or node.unavailable:
                return False
            if node.cpu_free is not None and pod.cpu > node.cpu_free:
                return False
            if node.host_memory_free is not None and pod.host_memory > node.host_memory_free:
                return False
            m = allowed.get(node.model)
            if m is None:
                m = allowed[node.model] = pod.models.allows(node.model)
            return m

        return ok

    def best(
        self, names: Sequence[str], pod: PodDemand, presorted: bool = False
    ) -> Placement | None:
        """The extender's pick among ``names``: scores per distinct node key
        (``PodScores``, as its filter and prioritize), devices by ``evaluate_node`` (as
        its bind); lowest score, then the smallest name or a seeded draw."""
        nodes = self.index.nodes
        policy = self.index.policy
        if not policy.priced:
            prices: dict[str, float] = {}
        elif self.prices == "cluster":
            prices = policy.prices(model_free(nodes.values()))
        else:
            prices = policy.prices(model_free(nodes[n] for n in names))
        scorer = self._scorer(pod, prices)
        best: list[str] = []
        top: Score | None = None
        for n in names if presorted else sorted(names):
            sc = scorer.by_key(nodes[n], self._key(n))
            if isinstance(sc, NoFit):
                continue
            if top is None or sc < top:
                top, best = sc, [n]
            elif sc == top:
                best.append(n)
        if not best:
            return None
        name = self.rng.choice(best) if self.index.tie_break is TieBreak.RANDOM else best[0]
        got = evaluate_node(policy, nodes[name], pod, prices)
        assert isinstance(got, Placement) and got.score == top
        return got

    def _scorer(self, pod: PodDemand, prices: dict[str, float]) -> PodScores:
        key = (pod, tuple(sorted(prices.items())))
        got = self._scores.pop(key, None)
        if got is None:
            got = PodScores(self.index.policy, pod, prices)
            if len(self._scores) >= SCORERS:
                del self._scores[next(iter(self._scores))]
        self._scores[key] = got  # most recent last
        return got

    def _key(self, name: str) -> Hashable:
        node = self.index.nodes[name]
        got = self._keys.get(name)
        if got is None or got[0] is not node:
            got = self._keys[name] = (node, node_key(node))
        return got[1]

    def commit(self, pod: PodDemand, placement: Placement) -> None:
        self.index.commit(pod, placement)


def tag(sample: int | None, retry: bool = True) -> str:
    """A sampled run's policy suffix: "" (no sampling), "@10%", "@adaptive", "+once"."""
    if sample is None:
        return ""
    return ("@adaptive" if sample == ADAPTIVE else f"@{sample}%") + ("" if retry else "+once")


def markdown(results: Sequence[Mapping[str, Any]]) -> None:
    """Allocation % at 100 % arrived per trace and sampling percentage (mean of seeds),
    the change against no sampling, and the nodes the extender saw per filter cycle."""
    runs: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in results:
        if r["tie"] != "deterministic" or "100" not in {str(k) for k in r["allocation"]}:
            continue
        tr = str(r["trace"]) + (f" ({r['nodes']} nodes)" if r.get("nodes") else "")
        s = r.get("sample")
        col = "off" if s is None else tag(s, r.get("retry", True)).lstrip("@")
        runs.setdefault((tr, str(r["policy"]), col), []).append(r)
    if not any(k[2] != "off" for k in runs):
        return
    order = ["off", "100%", "50%", "30%", "20%", "10%", "adaptive"]
    cols = sorted({k[2] for k in runs}, key=lambda c: (order.index(c) if c in order else 99, c))
    print("\n| trace | policy | seeds | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for tr, pol in sorted({(k[0], k[1]) for k in runs}):
        off = runs.get((tr, pol, "off"))
        base = _mean_at_100(off) if off else None
        cells, seeds = [], set()
        for c in cols:
            rs = runs.get((tr, pol, c), [])
            if not rs:
                cells.append("-")
                continue
            seeds.add(len(rs))
            m = _mean_at_100(rs)
            cand = sum(int(r.get("candidates", 0)) for r in rs)
            cyc = sum(int(r.get("windows", 0)) for r in rs)
            extra = "" if c == "off" or base is None else f" ({m - base:+.2f})"
            seen = f", {cand / cyc:.0f} n" if cyc else ""
            cells.append(f"{m:.2f}{extra}{seen}")
        n = "/".join(str(x) for x in sorted(seeds))
        print(f"| {tr} | {pol} | {n} | " + " | ".join(cells) + " |")


def _mean_at_100(rs: Sequence[Mapping[str, Any]]) -> float:
    vals = [float(r["allocation"].get("100", r["allocation"].get(100))) for r in rs]
    return sum(vals) / len(vals)
