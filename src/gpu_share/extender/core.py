"""Extender logic on JSON-shaped dicts (the Go field names of k8s.io/kube-scheduler/extender/v1)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_share.config.model import DEFAULT_DRA_DRIVER
from gpu_share.errors import BindRefused
from gpu_share.extender.api import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
)
from gpu_share.extender.dra_bind import Claimed, claimed_devices, dra_placement
from gpu_share.extender.ports import Binder, ClaimSource, ClusterView
from gpu_share.sharing.decision import ContainerDecision, Decision, decision_key, sign
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import (
    ClusterPolicy,
    NodeSlots,
    NoFit,
    NoFitCause,
    Placement,
    PodDemand,
    PodScores,
    evaluate_node,
    model_free,
    node_key,
)
from gpu_share.sharing.placement.first_fit import FirstFitScores
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL
from gpu_share.sharing.placement.pod_request import PodRequest, parse_pod_request

MAX_PRIORITY = 10  # extenderv1.MaxExtenderPriority
_NO_INV = NoFitCause.NO_INVENTORY
_NO_INV_REASON = "node has no gpu-share inventory (agent not running?)"
_NO_INV_ANY = NoFit("", _NO_INV_REASON, _NO_INV)  # ``_raw``'s, one object for every node
# Bind outcomes (``on_bind``; observability.metrics.BIND_OUTCOMES).
BIND_BOUND, BIND_NO_FIT, BIND_POD_NOT_FOUND = "bound", "no_fit", "pod_not_found"
BIND_INVALID_POD, BIND_API_ERROR = "invalid_pod", "api_error"
_SCORED_PODS = 32  # pod shapes whose per-node scores are kept (prioritize follows filter)
_KEYED_NODES = 200_000  # bound on the node -> node_key cache
Score = tuple[float, ...]
_Prices = tuple[tuple[str, float], ...]
Scorer = PodScores | FirstFitScores


@dataclass(frozen=True)
class ExtenderSettings:
    resources: ResourceNames
    domain: str
    key: bytes
    model_label: str = DEFAULT_MODEL_LABEL  # node label naming the GPU model
    dra_driver: str = DEFAULT_DRA_DRIVER  # whose claim results are our devices


def pod_ask(pod: Mapping[str, Any], settings: ExtenderSettings) -> PodRequest:
    """What ``pod`` asks (``sharing.placement.pod_request``); raises ``PodRequestError`` (a
    ValueError) on a malformed quantity, models annotation or affinity."""
    names = settings.resources
    return parse_pod_request(
        pod, names.memory, names.core, domain=settings.domain,
        model_label=settings.model_label, claims=True,
    )


def ranked(names: list[str], fits: Mapping[str, Score]) -> list[HostPriority]:
    """Priorities from the policy's scores of the fitting nodes (lower is better)."""
    # By score, ties by name: sorting the names, then (stable) by score alone, orders as
    # the (score, name) pairs do without building them.
    order = sorted(sorted(fits), key=fits.__getitem__)
    # Only the policy's choice (ties: smallest name) gets the maximum, so the
    # scheduler's own random tie-break among top scores cannot overrule it.
    scores: dict[str, int] = {}
    last = max(1, len(order) - 1)
    for rank, n in enumerate(order):
        scores[n] = (
            MAX_PRIORITY
            if rank == 0
            else (MAX_PRIORITY - 1) - (MAX_PRIORITY - 1) * (rank - 1) // last
        )
    get = scores.get
    return [{"Host": n, "Score": get(n, 0)} for n in names]


def _no_hook(_outcome: str) -> None:
    pass


class Extender:
    def __init__(
        self,
        settings: ExtenderSettings,
        view: ClusterView,
        binder: Binder,
        policy_factory: Callable[[ClusterView], ClusterPolicy],
        clock: Callable[[], float] = time.time,
        on_bind: Callable[[str], None] | None = None,
        claims: ClaimSource | None = None,
    ) -> None:
        """``on_bind(outcome)``: called once per bind (``BIND_*``; a metric hook).
        ``claims``: reads a DRA pod's allocated claims at bind (None: predicted)."""
        self.settings = settings
        self._claims = claims
        self._on_bind = on_bind or _no_hook
        self.view = view
        self.binder = binder
        self._policy_factory = policy_factory
        self._clock = clock
        self._lock = threading.Lock()  # binds decide and reserve one at a time
        # Requests of pods seen in filter/prioritize, for bind (which names only the pod).
        self._seen: OrderedDict[str, PodRequest] = OrderedDict()
        self._seen_lock = threading.Lock()
        # (demand, prices) -> its PodScores: prioritize reuses filter's, later pods of the
        # same shape reuse both (same policy object; the scores are keyed by node
        # content, so a node that changed is scored afresh).
        self._scored: OrderedDict[tuple[PodDemand, _Prices, bool], Scorer] = OrderedDict()
        # node -> (the NodeSlots the view returned, the id of its node_key): the view hands
        # back the same object while nothing on the node changed, so the key is built and
        # hashed once. Ids are never reused, so a cleared table only costs misses.
        self._keys: dict[str, tuple[NodeSlots, int]] = {}
        self._key_ids: dict[Hashable, int] = {}
        self._next_id = itertools.count()

    def _remember(self, pod: Mapping[str, Any]) -> PodRequest:
        reqs = pod_ask(pod, self.settings)
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if uid:
            with self._seen_lock:
                self._seen[uid] = reqs
                self._seen.move_to_end(uid)
                while len(self._seen) > 4096:
                    self._seen.popitem(last=False)
        return reqs

    @staticmethod
    def _node_names(args: ExtenderArgs) -> list[str]:
        if "NodeNames" in args:
            return list(args["NodeNames"])
        return [str(n["metadata"]["name"]) for n in args["Nodes"]["items"]]

    def _node_key(self, name: str, node: NodeSlots) -> int:
        got = self._keys.get(name)
        if got is not None and got[0] is node:
            return got[1]
        key = node_key(node)
        kid = self._key_ids.get(key)
        if kid is None:
            if len(self._key_ids) >= _KEYED_NODES:
                self._key_ids.clear()
            kid = self._key_ids[key] = next(self._next_id)
        if len(self._keys) >= _KEYED_NODES:
            self._keys.clear()
        self._keys[name] = (node, kid)
        return kid

    def _pod_scores(
        self, policy: ClusterPolicy, demand: PodDemand, prices: _Prices, first: bool
    ) -> Scorer:
        """The scorer of an earlier request that answers alike, else a new one;
        ``first``: a DRA pod, whose devices are the allocator's first fit."""
        key = (demand, prices, first)
        with self._seen_lock:
            got = self._scored.get(key)
            if got is None or got.policy is not policy:
                kind = FirstFitScores if first else PodScores
                got = self._scored[key] = kind(policy, demand, dict(prices))
            self._scored.move_to_end(key)
            while len(self._scored) > _SCORED_PODS:
                self._scored.popitem(last=False)
        return got

    def _scores(
        self, names: list[str], demand: PodDemand, first: bool = False
    ) -> dict[str, Score | NoFit]:
        """``_evaluate``'s answers without the device pick: the score of each fitting
        node, the NoFit of the others; one evaluation per distinct node state."""
        out = self._raw(names, demand, first)
        for n, r in out.items():
            if isinstance(r, NoFit) and r.node != n:
                out[n] = NoFit(n, r.reason, r.cause)
        return out

    def _raw(
        self, names: list[str], demand: PodDemand, first: bool = False
    ) -> dict[str, Score | NoFit]:
        """``_scores`` where a NoFit may name another node (same reason): filter reads
        the reasons, prioritize the scores, so no NoFit is made per node."""
        policy = self._policy_factory(self.view)
        slots = self.view.nodes(names)
        free = model_free(s for s in slots.values() if s is not None) if policy.priced else {}
        prices = tuple(sorted(policy.prices(free).items()))
        scorer = self._pod_scores(policy, demand, prices, first)
        known, keys = scorer.known, self._keys
        out: dict[str, Score | NoFit] = {}
        for n, s in slots.items():
            if s is None:
                out[n] = _NO_INV_ANY
                continue
            got = keys.get(n)  # ``_node_key``'s hit, inline: the loop's common case
            kid = got[1] if got is not None and got[0] is s else self._node_key(n, s)
            r = known(kid)
            out[n] = scorer.by_key(s, kid) if r is None else r
        return out

    def _evaluate(self, names: list[str], demand: PodDemand) -> dict[str, Placement | NoFit]:
        policy = self._policy_factory(self.view)
        slots = self.view.nodes(names)
        # Model pressure over the candidates (the replay: over the cluster).
        free = model_free(s for s in slots.values() if s is not None) if policy.priced else {}
        prices = policy.prices(free)
        out: dict[str, Placement | NoFit] = {}
        for n, s in slots.items():
            out[n] = (
                NoFit(n, _NO_INV_REASON, _NO_INV)
                if s is None
                else evaluate_node(policy, s, demand, prices)
            )
        return out

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        try:
            reqs = self._remember(args["Pod"])
        except ValueError as e:
            return {
                "NodeNames": None,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": str(e),
            }
        names = self._node_names(args)
        failed: dict[str, str] = {}
        # A DRA pod's fit is kube-scheduler's own (its allocator, on the slices and
        # claims): the extender only ranks the nodes that passed it (prioritize).
        if reqs.uses_ours and not reqs.from_claims:
            said: dict[str, str] = {}  # reason -> its message: one string per reason
            for n, r in self._raw(names, reqs.demand()).items():
                if isinstance(r, NoFit):
                    msg = said.get(r.reason)
                    if msg is None:
                        msg = said[r.reason] = f"gpu-share: {r.reason}"
                    failed[n] = msg
        keep = [n for n in names if n not in failed]
        result: ExtenderFilterResult = {
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        if "NodeNames" in args:
            result["NodeNames"] = keep
        else:
            kept = set(keep)
            items = [x for x in args["Nodes"]["items"] if x["metadata"]["name"] in kept]
            result["Nodes"] = {"items": items}
        return result

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        names = self._node_names(args)
        try:
            reqs = self._remember(args["Pod"])
        except ValueError:
            reqs = PodRequest()
        if not reqs.uses_ours:
            return [{"Host": n, "Score": 0} for n in names]
        evals = self._raw(names, reqs.demand(), reqs.from_claims)
        return ranked(names, {n: r for n, r in evals.items() if not isinstance(r, NoFit)})

    def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        outcome, result = self._bind(args)
        self._on_bind(outcome)
        return result

    def _bind(self, args: ExtenderBindingArgs) -> tuple[str, ExtenderBindingResult]:
        ns, name = args["PodNamespace"], args["PodName"]
        uid, node = args["PodUID"], args["Node"]
        reqs = self._request_of(ns, name, uid)
        if not isinstance(reqs, PodRequest):
            return reqs
        claimed = None
        if reqs.from_claims and self._claims is not None:  # API reads: before the lock
            claimed = claimed_devices(self.view, self._claims, ns, name, node,
                                      self.settings.dra_driver)
        # Decide and reserve one bind at a time; the API calls run outside the lock, so
        # binds overlap (each sees the reservations of those before it).
        with self._lock:
            decided = self._decide(uid, node, reqs, claimed)
            if isinstance(decided, str):
                return BIND_NO_FIT, {"Error": f"gpu-share: {node}: {decided}"}
            annotations, shares = decided
            if shares:
                self.view.reserve(uid, node, shares)
        try:
            self.binder.annotate_and_bind(ns, name, uid, node, annotations)
        except Exception as e:  # surfaced to the scheduler, which retries the pod
            if isinstance(e, BindRefused) and shares:
                self.view.unreserve(uid, node)
            # Any other error may have bound the pod: its reservation stays until the
            # watch shows the pod or the reservation expires (never over-commit).
            return BIND_API_ERROR, {"Error": f"bind {ns}/{name} to {node}: {e}"}
        return BIND_BOUND, {"Error": ""}

    def _request_of(
        self, ns: str, name: str, uid: str
    ) -> PodRequest | tuple[str, ExtenderBindingResult]:
        """What the pod asks (seen at filter, else read now), or the bind's refusal."""
        with self._seen_lock:
            reqs = self._seen.get(uid)
        if reqs is not None:
            return reqs
        pod = self.view.pod(ns, name)
        if pod is None:
            return BIND_POD_NOT_FOUND, {"Error": f"pod {ns}/{name} not found"}
        try:
            return pod_ask(pod, self.settings)
        except ValueError as e:
            return BIND_INVALID_POD, {"Error": f"pod {ns}/{name}: {e}"}

    def _decide(
        self, uid: str, node: str, reqs: PodRequest, claimed: Claimed | None = None
    ) -> tuple[dict[str, str], dict[str, tuple[int, int]]] | str:
        """The signed decision's annotation and the shares it takes per device, or why the
        node cannot take the pod. Under ``_lock``."""
        annotations: dict[str, str] = {}
        shares: dict[str, tuple[int, int]] = {}
        asking = reqs.asking
        if not asking:
            return annotations, shares
        if reqs.from_claims:  # allocated already: record what it got, never refuse
            policy = self._policy_factory(self.view)
            got = dra_placement(self.view.node(node), reqs.demand(), claimed, policy)
            if got is None:
                return annotations, shares
            r: Placement | NoFit = got
        else:
            r = self._evaluate([node], reqs.demand())[node]
        if isinstance(r, NoFit):
            return r.reason
        decision = Decision(
            pod_uid=uid,
            node=node,
            containers={
                cp.container: ContainerDecision(
                    tuple(d.uuid for d in cp.devices), asking[cp.container]
                )
                for cp in r.containers
            },
            issued_at=int(self._clock()),
        )
        annotations[decision_key(self.settings.domain)] = sign(decision, self.settings.key)
        for cp in r.containers:
            for d in cp.devices:
                m, c = shares.get(d.uuid, (0, 0))
                shares[d.uuid] = (m + cp.memory_units, c + cp.cores)
        return annotations, shares
