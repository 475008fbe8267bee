"""The extender's cluster view (``extender.ports.ClusterView``) on the API server.

Nodes and pods are kept in memory by list+watch (``kube.listwatch.ListWatch``, one
daemon thread each: relisting on HTTP 410, on a periodic resync, and after any error
following a jittered pause); ``node()`` merges a node's inventory
annotation with the annotations of its pods and pending reservations
(``sharing.placement.view``), and its allocatable CPU/memory with the requests of every
pod bound to it, so the policy scores host resources as the trace replay does.

Pod annotations are tenant-writable, so a pod's ``decision`` and ``assignment`` count only
when they verify for that pod on its node (``view_trust``; ``_trusted``, computed once per
watch event). Otherwise the pod is accounted as an unannotated one: by the node's
inventory annotation (the agent's ledger). The binder is ``kube.binder.KubeBinder``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from gpu_share.kube.listwatch import ListWatch, WatchBackoff, rest_paged_kept, rest_watch
from gpu_share.kube.rest import ApiError, KubeTimeouts, RestClient, quote_name
from gpu_share.kube.view_objects import allocatable, slim_node, slim_pod
from gpu_share.kube.view_trust import AnnotationTrust
from gpu_share.observability.loops import LoopSupervisor
from gpu_share.sharing.annotations import (
    AnnotationError,
    InventoryAnnotation,
    enforcement_key,
    enforcement_problem,
    inventory_key,
)
from gpu_share.sharing.placement import ModelReq, NodeSlots, Shape, Workload
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL, node_model
from gpu_share.sharing.placement.pod_request import PodRequest, read_pod_request
from gpu_share.sharing.placement.view import Usage, node_slots, pod_usage

log = logging.getLogger(__name__)
PENDING_TTL_S = 120.0  # a reservation the watch never confirmed is dropped after this
WATCH_TIMEOUT_S = 300  # server-side end of one watch
WATCH_BACKOFF = WatchBackoff(0.5, 30.0)  # pause after failed watches (jittered, growing)
WATCH_RESYNC_S = 1800.0  # a full relist now and then repairs any event missed
# A quiet watch beats once per WATCH_TIMEOUT_S; room for a read timeout and a pause.
WATCH_MAX_AGE_S = WATCH_TIMEOUT_S + 180.0
_PATHS = {"nodes": "/api/v1/nodes", "pods": "/api/v1/pods"}  # what -> its list path
# (memory units, cores, host cpu m, host memory Mi, models) of one container's ask
_ShapeKey = tuple[int, int, int, int, ModelReq]


class KubeClusterView:
    def __init__(
        self,
        api: RestClient,
        *,
        domain: str,
        memory_resource: str,
        core_resource: str,
        default_workload: Workload,
        decision_key: bytes,
        previous_keys: tuple[bytes, ...] = (),
        timeouts: KubeTimeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_untrusted: Callable[[str], None] | None = None,
        model_label: str = DEFAULT_MODEL_LABEL,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        """``decision_key``: the extender's HMAC key; pod annotations that do not verify
        under it (or under ``previous_keys``, a rotation's) are ignored.
        ``on_untrusted(reason)``: called per ignored annotation (a metric hook).
        ``on_error(watch name)``: called per failed watch pass. ``timeouts`` replace
        the client's own when given."""
        self._api = api if timeouts is None else replace(api, timeouts=timeouts)
        self._domain = domain
        self._key = decision_key
        self._verifier = AnnotationTrust(domain, (decision_key, *previous_keys), clock,
                                         on_untrusted)
        self.untrusted: Counter[str] = self._verifier.untrusted  # reason -> ignored
        # uid -> the pod's annotations that verified (what node() counts)
        self._trusted: dict[str, dict[str, str]] = {}
        # node -> uids of the pods bound there with a trusted decision: node() reads only
        # its own pods (a scan of every pod per node made filter O(nodes x pods)).
        self._on_node: dict[str, set[str]] = {}
        self._node_of: dict[str, str] = {}  # uid -> its key in _on_node
        # node -> what node() last built for it, while nothing on the node changed and no
        # bind reservation is pending there (filter reads every node per request).
        self._slots: dict[str, NodeSlots] = {}
        self._mem, self._cores = memory_resource, core_resource
        self._default = default_workload
        self._model_label = model_label  # node label naming the GPU model (placement.pod_models)
        self._model: dict[str, str] = {}  # node -> its model as requirements name it
        self._unavailable: dict[str, str] = {}  # node -> why it takes no new slice
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, InventoryAnnotation] = {}
        self._alloc: dict[str, tuple[int | None, int | None]] = {}  # node -> cpu m, memory Mi
        # uid -> node name ("" while pending) of each pod using our resources; not the
        # object: 50,000 of those (managedFields and all) outgrow the extender's memory.
        self._pods: dict[str, str] = {}
        self._asks: dict[str, PodRequest] = {}  # uid -> its parsed ask (same pods)
        # The mix of _asks, kept as they change: workload() runs on every request.
        self._shapes: dict[_ShapeKey, int] = {}
        # node -> uid -> (cpu m, memory Mi) of every bound pod; by node, as filter reads it
        self._host: dict[str, dict[str, tuple[int, int]]] = {}
        self._host_node: dict[str, str] = {}  # uid -> node, to drop a pod from _host
        # Bind reservations: uid -> node -> (node, usage, host ask, when). One per node:
        # a pod whose bind's outcome is unknown may be bound again elsewhere, and the
        # first reservation stays until the watch or the expiry settles it.
        self._pending: dict[str, dict[str, tuple[str, Usage, tuple[int, int], float]]] = {}
        # The same reservations by node, and the oldest one's time: node() runs for every
        # node of every request and must not scan every reservation of the cluster.
        self._pending_on: dict[str, set[str]] = {}
        self._oldest_pending = float("inf")
        self._wl: tuple[tuple[tuple[_ShapeKey, int], ...], Workload] | None = None
        # The sorted mix behind _wl; replaced (a new object) whenever _shapes changes.
        self._shapes_key: tuple[tuple[_ShapeKey, int], ...] | None = None
        self._stop = threading.Event()
        self._watches = {
            what: ListWatch(
                f"view-{what}",
                partial(self._list, what),
                rest_watch(self._api, f"watch {what}", _PATHS[what]),
                on_list=partial(self._replace, what),
                on_event=partial(self._apply, what),
                stop=self._stop,
                timeout_s=WATCH_TIMEOUT_S,
                resync_s=WATCH_RESYNC_S,
                backoff=WATCH_BACKOFF,
                on_error=on_error,
            )
            for what in _PATHS
        }

    # -- ClusterView
    def node(self, name: str) -> NodeSlots | None:
        return self.nodes((name,))[name]

    def nodes(self, names: Sequence[str]) -> dict[str, NodeSlots | None]:
        now = self._clock()
        with self._lock:
            self._expire(now)
            get, pending = self._slots.get, self._pending_on
            out: dict[str, NodeSlots | None] = {}
            for name in names:
                cached = None if name in pending else get(name)
                out[name] = cached if cached is not None else self._build(name)
            return out

    def _build(self, name: str) -> NodeSlots | None:
        """The node's slots from its inventory and pods (caller holds the lock; cached
        unless a bind reservation is pending there)."""
        inv = self._nodes.get(name)
        if inv is None:
            return None
        mine = self._pending_on.get(name, ())
        totals = {d.id: (d.memory_total, d.cores_total) for d in inv.devices}
        usages = []
        counted = set()
        # A bound pod without a verified annotation counts by its bind reservation
        # (if any, below) and else by the inventory, like an unannotated pod.
        for uid in self._on_node.get(name, ()):
            usages.append(pod_usage(self._trusted[uid], self._domain, totals))
            counted.add(uid)
        on_node = self._host.get(name, {})
        cpu_used = sum(c for c, _ in on_node.values())
        mem_used = sum(m for _, m in on_node.values())
        # A bind's reservation counts until the watch shows the pod bound here (the
        # annotated-but-unbound pod, seen between patch and binding, counts nowhere).
        for uid in mine:
            _, u, (c, m), _at = self._pending[uid][name]
            if uid not in counted:
                usages.append(u)
                if uid not in on_node:
                    cpu_used, mem_used = cpu_used + c, mem_used + m
        slots = node_slots(inv, usages, self._model.get(name),
                           self._unavailable.get(name, ""))
        cpu, mem = self._alloc.get(name, (None, None))
        out = replace(
            slots,
            cpu_free=None if cpu is None else cpu - cpu_used,
            host_memory_free=None if mem is None else mem - mem_used,
        )
        if not mine:
            self._slots[name] = out
        return out

    def workload(self) -> Workload:
        """Requests of pods seen (bound or pending), else the configured default mix."""
        with self._lock:
            if self._wl is None or self._shapes_key is None:
                key = tuple(
                    sorted(self._shapes.items(), key=lambda kv: (kv[0][:4], str(kv[0][4])))
                )
                # Same mix, same object: the policy built on it keeps its memo.
                if self._wl is None or self._wl[0] != key:
                    wl = (
                        Workload(
                            Shape(m, c, float(n), cpu, mem, r) for (m, c, cpu, mem, r), n in key
                        )
                        if key
                        else self._default
                    )
                    self._wl = (key, wl)
                self._shapes_key = self._wl[0]
            return self._wl[1]

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        with self._lock:
            bound = self._pods.get(pod_uid) == node
            if not (bound and self._trusted.get(pod_uid)):
                ask = self._asks.get(pod_uid)
                host = (ask.cpu, ask.memory) if ask is not None else (0, 0)
                self._set_pending(pod_uid, (node, dict(shares), host, self._clock()))
            self._slots.pop(node, None)

    def unreserve(self, pod_uid: str, node: str) -> None:
        with self._lock:
            self._drop_pending(pod_uid, node)

    # -- reservations (caller holds the lock)
    def _set_pending(self, uid: str, entry: tuple[str, Usage, tuple[int, int], float]) -> None:
        node = entry[0]
        self._pending.setdefault(uid, {})[node] = entry
        self._pending_on.setdefault(node, set()).add(uid)
        self._slots.pop(node, None)
        self._oldest_pending = min(self._oldest_pending, entry[3])

    def _drop_pending(self, uid: str, node: str | None = None) -> None:
        """The reservation of ``uid`` on ``node`` (None: on every node) is gone."""
        by_node = self._pending.get(uid)
        if by_node is None:
            return
        for n in [node] if node is not None else list(by_node):
            if by_node.pop(n, None) is not None:
                self._slots.pop(n, None)
                _discard(self._pending_on, n, uid)
        if not by_node:
            del self._pending[uid]

    def _expire(self, now: float) -> None:
        """Drops the reservations older than PENDING_TTL_S (only when one may be)."""
        if now - self._oldest_pending <= PENDING_TTL_S:
            return
        for uid, by_node in list(self._pending.items()):
            for node, (*_rest, at) in list(by_node.items()):
                if now - at > PENDING_TTL_S:
                    self._drop_pending(uid, node)
        self._oldest_pending = min(
            (e[3] for by_node in self._pending.values() for e in by_node.values()),
            default=float("inf"))

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        op = f"get pod {namespace}/{name}"
        try:
            obj: Mapping[str, Any] = self._api.get(
                op, f"/api/v1/namespaces/{quote_name(namespace)}/pods/{quote_name(name)}")
            return obj
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    # -- watch
    def start(self, loops: LoopSupervisor | None = None) -> None:
        """Watch nodes and pods in two supervised threads (``self.loops``: each watch
        beats its heartbeat, so ``self.loops.check`` is a liveness probe naming a watch
        that stopped; a failure is logged, reported to ``on_error`` and paused for)."""
        self.loops = loops or LoopSupervisor()
        for lw in self._watches.values():
            lw.start(self.loops, max_age_s=WATCH_MAX_AGE_S)

    def stop(self) -> None:
        for lw in self._watches.values():
            lw.stop()

    def stats(self) -> tuple[int, int, dict[str, int], dict[str, int]]:
        """For metrics: nodes with an inventory, pods asking our resources, and per watch
        its full lists and its failed passes (running totals)."""
        with self._lock:
            nodes, pods = len(self._nodes), len(self._pods)
        lists = {what: lw.lists for what, lw in self._watches.items()}
        return nodes, pods, lists, {what: lw.errors for what, lw in self._watches.items()}

    def wait_synced(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        return all(
            lw.synced.wait(max(0.0, end - time.monotonic())) for lw in self._watches.values()
        )

    def _ask(self, pod: Mapping[str, Any]) -> PodRequest:
        ask = read_pod_request(
            pod, self._mem, self._cores, domain=self._domain, model_label=self._model_label,
            claims=True,  # a DRA pod counts by its claims' templates and the decision
        )
        if ask.problems and ask.uses_ours:  # quantities are validated; models are not
            meta = pod.get("metadata") or {}
            log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), ask.problems[0])
        return ask

    def _apply(self, what: str, etype: str, obj: Mapping[str, Any]) -> None:
        if what == "nodes":
            self._apply_node(etype, obj)
        else:
            self._apply_pod(etype, obj)

    def _apply_node(self, etype: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        text = (meta.get("annotations") or {}).get(inventory_key(self._domain))
        inv = None
        if text and etype != "DELETED":
            try:
                inv = InventoryAnnotation.decode(text)
            except AnnotationError as e:
                log.warning("node %s: %s", name, e)
        with self._lock:
            self._slots.pop(name, None)
            if inv is None:
                self._nodes.pop(name, None)
                self._alloc.pop(name, None)
                self._model.pop(name, None)
                self._unavailable.pop(name, None)
            else:
                self._nodes[name] = inv
                self._alloc[name] = allocatable(obj)
                first = inv.devices[0].model if inv.devices else ""
                self._model[name] = node_model(meta.get("labels"), self._model_label, first)
                self._unavailable[name] = enforcement_problem(
                    (meta.get("annotations") or {}).get(enforcement_key(self._domain)))

    def _apply_pod(self, etype: str, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        phase = (obj.get("status") or {}).get("phase")
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        gone = etype == "DELETED" or phase in ("Succeeded", "Failed")
        ask = None if gone else self._ask(obj)  # parsed outside the lock
        with self._lock:
            # Host requests of every bound pod, ours or not: they share the node's CPU.
            old = self._host_node.pop(uid, None)
            if old is not None:
                self._host[old].pop(uid, None)
                self._slots.pop(old, None)
            self._slots.pop(node, None)
            for pending_node in self._pending.get(uid, {}):
                self._slots.pop(pending_node, None)
            if ask is not None and node:
                self._host.setdefault(node, {})[uid] = (ask.cpu, ask.memory)
                self._host_node[uid] = node
            self._unindex(uid)
            self._count(self._asks.get(uid), -1)
            if ask is None or not ask.uses_ours:
                self._pods.pop(uid, None)
                self._asks.pop(uid, None)
                self._drop_pending(uid)
                self._trusted.pop(uid, None)
                return
            self._pods[uid] = node
            self._asks[uid] = ask
            self._count(ask, 1)
            trusted = self._verifier.trusted(uid, node, obj)
            if trusted:
                self._trusted[uid] = trusted
            else:
                self._trusted.pop(uid, None)
            if node and trusted:
                self._drop_pending(uid)
                self._on_node.setdefault(node, set()).add(uid)
                self._node_of[uid] = node

    def _count(self, ask: PodRequest | None, delta: int) -> None:
        """Adds ``ask`` to (or takes it from) the mix (caller holds the lock)."""
        if ask is None:
            return
        for c in ask.containers:
            if c.request.empty:
                continue
            k = (c.request.memory_units, c.request.cores, ask.cpu, ask.memory, ask.models)
            n = self._shapes.get(k, 0) + delta
            if n > 0:
                self._shapes[k] = n
            else:
                self._shapes.pop(k, None)
        self._shapes_key = None  # workload() sorts afresh

    def _unindex(self, uid: str) -> None:
        """Drops ``uid`` from the by-node index (caller holds the lock)."""
        old = self._node_of.pop(uid, None)
        if old is not None:
            self._slots.pop(old, None)
            _discard(self._on_node, old, uid)

    def _list(self, what: str) -> tuple[list[dict[str, Any]], str]:
        keep = slim_node if what == "nodes" else slim_pod
        return rest_paged_kept(self._api, f"list {what}", _PATHS[what], {}, keep=keep)

    def _replace(self, what: str, items: Sequence[Mapping[str, Any]]) -> None:
        """A fresh list: forget what the last one and its watch said."""
        with self._lock:
            self._slots.clear()
            if what == "nodes":
                self._nodes.clear()
                self._alloc.clear()
            else:
                self._pods.clear()
                self._asks.clear()
                self._shapes.clear()
                self._shapes_key = None
                self._trusted.clear()
                self._on_node.clear()
                self._node_of.clear()
                self._host.clear()
                self._host_node.clear()
        for item in items:
            self._apply(what, "ADDED", item)


def _discard(index: dict[str, set[str]], node: str, uid: str) -> None:
    """``uid`` out of ``index[node]``; an emptied entry goes."""
    on = index.get(node)
    if on is not None:
        on.discard(uid)
        if not on:
            del index[node]
