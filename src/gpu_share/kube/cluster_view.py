"""The extender's cluster view (``extender.ports.ClusterView``) and binder, on the API server.

Nodes and pods are kept in memory by list+watch (one daemon thread each, relisting on
HTTP 410 or any error after a short pause); ``node()`` merges a node's inventory
annotation with the annotations of its pods and pending reservations
(``sharing.placement.view``), and its allocatable CPU/memory with the requests of every
pod bound to it, so the policy scores host resources as the trace replay does.

Pod annotations are tenant-writable, so a pod's ``decision`` and ``assignment`` count only
when their HMAC verifies under the extender's key AND they were signed for that pod's UID
on the node it is bound to (``_trusted``, computed once per watch event). Anything else is
ignored (counted in ``untrusted`` by reason, logged at most once a minute) and the pod is
accounted as an unannotated one: by the node's inventory annotation (the agent's ledger).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client as k8s

from gpu_share.kube.client import KubeTimeouts, access_error, call_json
from gpu_share.observability.loops import Backoff, LoopSupervisor
from gpu_share.sharing.annotations import (
    MALFORMED,
    AnnotationError,
    InventoryAnnotation,
    assignment_key,
    inventory_key,
    verify_assignment,
)
from gpu_share.sharing.decision import DecisionError, decision_key, verify_binding
from gpu_share.sharing.model_req import DEFAULT_MODEL_LABEL, models_or_any, node_model
from gpu_share.sharing.placement import ModelReq, NodeSlots, Shape, Workload
from gpu_share.sharing.placement.view import Usage, node_slots, pod_usage
from gpu_share.sharing.quantity import QuantityError, cpu_milli, memory_mib, pod_host_request

log = logging.getLogger(__name__)
PENDING_TTL_S = 120.0  # a reservation the watch never confirmed is dropped after this
UNTRUSTED_LOG_EVERY_S = 60.0  # ignored annotations: one summary log line at most this often
WATCH_TIMEOUT_S = 300  # server-side end of one watch
WATCH_PAUSE_S = 2.0  # first pause after a failed watch (then growing, at most 30 s)
# A quiet watch beats once per WATCH_TIMEOUT_S; room for a read timeout and a pause.
WATCH_MAX_AGE_S = WATCH_TIMEOUT_S + 180.0


def _lines(resp: Any) -> Iterator[bytes]:
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[:nl], buf[nl + 1 :]
            if line.strip():
                yield line
    if buf.strip():
        yield buf


class KubeClusterView:
    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        domain: str,
        memory_resource: str,
        core_resource: str,
        default_workload: Workload,
        decision_key: bytes,
        timeouts: KubeTimeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_untrusted: Callable[[str], None] | None = None,
        model_label: str = DEFAULT_MODEL_LABEL,
    ) -> None:
        """``decision_key``: the extender's HMAC key; pod annotations that do not verify
        under it are ignored. ``on_untrusted(reason)``: called per ignored annotation (a
        metric hook)."""
        self._core = k8s.CoreV1Api(api_client)
        self._domain = domain
        self._key = decision_key
        self._on_untrusted = on_untrusted
        self.untrusted: Counter[str] = Counter()  # reason -> annotations ignored
        self._untrusted_logged: tuple[float, int] = (float("-inf"), 0)
        # uid -> the pod's annotations that verified (what node() counts)
        self._trusted: dict[str, dict[str, str]] = {}
        self._mem, self._cores = memory_resource, core_resource
        self._default = default_workload
        self._model_label = model_label  # node label naming the GPU model (model_req)
        self._model: dict[str, str] = {}  # node -> its model as requirements name it
        self._t = timeouts or KubeTimeouts()
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, InventoryAnnotation] = {}
        self._alloc: dict[str, tuple[int | None, int | None]] = {}  # node -> cpu m, memory Mi
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> pod object using our resources
        # node -> uid -> (cpu m, memory Mi) of every bound pod; by node, as filter reads it
        self._host: dict[str, dict[str, tuple[int, int]]] = {}
        self._host_node: dict[str, str] = {}  # uid -> node, to drop a pod from _host
        self._pending: dict[str, tuple[str, Usage, tuple[int, int], float]] = {}
        self._wl: tuple[tuple[tuple[tuple[int, int, int, int], int], ...], Workload] | None = None
        self._stop = threading.Event()
        self._synced = {"nodes": threading.Event(), "pods": threading.Event()}

    # -- ClusterView
    def node(self, name: str) -> NodeSlots | None:
        now = self._clock()
        with self._lock:
            inv = self._nodes.get(name)
            if inv is None:
                return None
            totals = {d.id: (d.memory_total, d.cores_total) for d in inv.devices}
            usages = []
            counted = set()
            for uid, p in self._pods.items():
                trusted = self._trusted.get(uid)
                # A bound pod without a verified annotation counts by its bind reservation
                # (if any, below) and else by the inventory, like an unannotated pod.
                if trusted and (p.get("spec") or {}).get("nodeName") == name:
                    usages.append(pod_usage(trusted, self._domain, totals))
                    counted.add(uid)
            on_node = self._host.get(name, {})
            cpu_used = sum(c for c, _ in on_node.values())
            mem_used = sum(m for _, m in on_node.values())
            # A bind's reservation counts until the watch shows the pod bound here (the
            # annotated-but-unbound pod, seen between patch and binding, counts nowhere).
            for uid, (n, u, (c, m), at) in list(self._pending.items()):
                if now - at > PENDING_TTL_S:
                    del self._pending[uid]
                elif n == name and uid not in counted:
                    usages.append(u)
                    if uid not in on_node:
                        cpu_used, mem_used = cpu_used + c, mem_used + m
            slots = node_slots(inv, usages, self._model.get(name))
            cpu, mem = self._alloc.get(name, (None, None))
            return replace(
                slots,
                cpu_free=None if cpu is None else cpu - cpu_used,
                host_memory_free=None if mem is None else mem - mem_used,
            )

    def workload(self) -> Workload:
        """Requests of pods seen (bound or pending), else the configured default mix."""
        with self._lock:
            counts: dict[tuple[int, int, int, int, ModelReq], int] = {}
            for p in self._pods.values():
                cpu, mem = _host_request(p)
                req = models_or_any(p, self._model_label, self._domain)
                for m, c in self._requests(p):
                    counts[(m, c, cpu, mem, req)] = counts.get((m, c, cpu, mem, req), 0) + 1
            key = tuple(sorted(counts.items(), key=lambda kv: (kv[0][:4], str(kv[0][4]))))
            # Same mix, same object: the policy built on it keeps its memo across requests.
            if self._wl is None or self._wl[0] != key:
                wl = (
                    Workload(Shape(m, c, float(n), cpu, mem, r) for (m, c, cpu, mem, r), n in key)
                    if key
                    else self._default
                )
                self._wl = (key, wl)
            return self._wl[1]

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        with self._lock:
            p = self._pods.get(pod_uid)
            bound = p is not None and (p.get("spec") or {}).get("nodeName") == node
            if not (bound and self._trusted.get(pod_uid)):
                host = _host_request(p) if p is not None else (0, 0)
                self._pending[pod_uid] = (node, dict(shares), host, self._clock())

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        op = f"get pod {namespace}/{name}"
        try:
            obj: Mapping[str, Any] = call_json(
                op, self._core.read_namespaced_pod, name, namespace, timeouts=self._t
            )
            return obj
        except k8s.ApiException as e:
            if e.status == 404:
                return None
            raise access_error(op, e) from e

    # -- watch
    def start(self, loops: LoopSupervisor | None = None) -> None:
        """Watch nodes and pods in two supervised loops (``self.loops``: a failure is
        logged, counted and followed by a pause; ``self.loops.check`` is a liveness
        probe naming a watch that stopped beating)."""
        self.loops = loops or LoopSupervisor(backoff=Backoff(WATCH_PAUSE_S, 30.0))
        self._rv = {"nodes": "", "pods": ""}
        for what in ("nodes", "pods"):
            self.loops.spawn(
                f"view-{what}",
                lambda what=what: self._watch_once(what),  # type: ignore[misc]
                max_age_s=WATCH_MAX_AGE_S,
                stop=self._stop,
            )

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        return all(e.wait(max(0.0, end - time.monotonic())) for e in self._synced.values())

    def _requests(self, pod: Mapping[str, Any]) -> list[tuple[int, int]]:
        out = []
        spec = pod.get("spec") or {}
        for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
            res = c.get("resources") or {}
            # Limits win over requests, as in kube/pods.py.
            amounts = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            try:
                m, k = int(str(amounts.get(self._mem, 0))), int(str(amounts.get(self._cores, 0)))
            except ValueError:
                continue
            if m or k:
                out.append((m, k))
        return out

    def _trust(self, uid: str, node: str, pod: Mapping[str, Any]) -> dict[str, str]:
        """The pod's decision/assignment annotations that verify for (uid, node)."""
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        out: dict[str, str] = {}
        if not node:
            return out  # annotated but not bound yet: nothing to count, nothing to judge
        checks: tuple[tuple[str, Callable[[str, bytes, str, str], object]], ...] = (
            (assignment_key(self._domain), verify_assignment),
            (decision_key(self._domain), verify_binding),
        )
        for key, check in checks:
            text = ann.get(key)
            if not isinstance(text, str) or not text:
                continue
            try:
                check(text, self._key, uid, node)
            except (AnnotationError, DecisionError) as e:
                self._untrusted(e.reason, pod)
                continue
            except Exception:  # tenant input must never break the watch
                self._untrusted(MALFORMED, pod)
                continue
            out[key] = text
        return out

    def _untrusted(self, reason: str, pod: Mapping[str, Any]) -> None:
        self.untrusted[reason] += 1
        if self._on_untrusted is not None:
            try:
                self._on_untrusted(reason)
            except Exception:  # a broken metric hook must not break the watch
                log.exception("on_untrusted hook failed")
        now, total = self._clock(), sum(self.untrusted.values())
        last, seen = self._untrusted_logged
        if now - last >= UNTRUSTED_LOG_EVERY_S:
            meta = pod.get("metadata") or {}
            who = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            log.warning(
                "ignoring gpu-share annotations that do not verify (%s on pod %s; %d ignored "
                "since the last report, by reason: %s)",
                reason, who[:200], total - seen, dict(self.untrusted),
            )
            self._untrusted_logged = (now, total)

    def _apply(self, what: str, etype: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        with self._lock:
            if what == "nodes":
                name = str(meta.get("name", ""))
                text = (meta.get("annotations") or {}).get(inventory_key(self._domain))
                inv = None
                if text and etype != "DELETED":
                    try:
                        inv = InventoryAnnotation.decode(text)
                    except AnnotationError as e:
                        log.warning("node %s: %s", name, e)
                if inv is None:
                    self._nodes.pop(name, None)
                    self._alloc.pop(name, None)
                    self._model.pop(name, None)
                else:
                    self._nodes[name] = inv
                    self._alloc[name] = _allocatable(obj)
                    first = inv.devices[0].model if inv.devices else ""
                    self._model[name] = node_model(meta.get("labels"), self._model_label, first)
                return
            uid = str(meta.get("uid", ""))
            phase = (obj.get("status") or {}).get("phase")
            node = str((obj.get("spec") or {}).get("nodeName") or "")
            bound = bool(node)
            # Host requests of every bound pod, ours or not: they share the node's CPU.
            old = self._host_node.pop(uid, None)
            if old is not None:
                self._host[old].pop(uid, None)
            if etype != "DELETED" and phase not in ("Succeeded", "Failed") and bound:
                self._host.setdefault(node, {})[uid] = _host_request(obj)
                self._host_node[uid] = node
            if etype == "DELETED" or phase in ("Succeeded", "Failed") or not self._requests(obj):
                self._pods.pop(uid, None)
                self._pending.pop(uid, None)
                self._trusted.pop(uid, None)
                return
            self._pods[uid] = dict(obj)
            trusted = self._trust(uid, node, obj)
            if trusted:
                self._trusted[uid] = trusted
            else:
                self._trusted.pop(uid, None)
            if bound and trusted:
                self._pending.pop(uid, None)

    def _list(self, what: str) -> str:
        fn = self._core.list_node if what == "nodes" else self._core.list_pod_for_all_namespaces
        page = call_json(f"list {what}", fn, timeouts=self._t)
        with self._lock:
            if what == "nodes":
                self._nodes.clear()
                self._alloc.clear()
            else:
                self._pods.clear()
                self._trusted.clear()
                self._host.clear()
                self._host_node.clear()
        for item in page.get("items") or ():
            self._apply(what, "ADDED", item)
        self._synced[what].set()
        return str((page.get("metadata") or {}).get("resourceVersion", ""))

    def _watch_once(self, what: str) -> None:
        """One pass: list when needed, then one watch until it ends. Whatever it raises
        goes to the supervisor (logged, counted, a pause) and the next pass relists."""
        rv = self._rv[what]
        self._rv[what] = ""  # relist after a failure
        if not rv:
            rv = self._list(what)
        fn = self._core.list_node if what == "nodes" else self._core.list_pod_for_all_namespaces
        resp = fn(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(self._t.connect, WATCH_TIMEOUT_S + self._t.read),
        )
        for line in _lines(resp):
            ev = json.loads(line)
            obj = ev.get("object") or {}
            if ev.get("type") == "ERROR":
                return  # 410 Gone and friends: relist
            rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
            if ev.get("type") != "BOOKMARK":
                self._apply(what, str(ev.get("type")), obj)
            if self._stop.is_set():
                return
        self._rv[what] = rv  # the watch timed out cleanly: resume from here


def _host_request(pod: Mapping[str, Any]) -> tuple[int, int]:
    try:
        return pod_host_request(pod)
    except QuantityError as e:  # the API server validates quantities; be safe anyway
        log.warning("pod %s: %s", (pod.get("metadata") or {}).get("name"), e)
        return (0, 0)


def _allocatable(node: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The node's allocatable CPU (millicores) and memory (MiB); None = not reported."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = cpu_milli(alloc["cpu"], up=False) if "cpu" in alloc else None
        mem = memory_mib(alloc["memory"], up=False) if "memory" in alloc else None
    except QuantityError as e:
        log.warning("node %s: %s", (node.get("metadata") or {}).get("name"), e)
        return (None, None)
    return (cpu, mem)


class KubeBinder:
    """``extender.ports.Binder``: annotate (uid-checked merge patch), then bind."""

    def __init__(self, api_client: k8s.ApiClient, timeouts: KubeTimeouts | None = None) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._t = timeouts or KubeTimeouts()

    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        if annotations:
            op = f"annotate pod {namespace}/{name}"
            # metadata.uid in the patch makes the server refuse a same-named new pod.
            body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
            try:
                call_json(
                    op, self._core.patch_namespaced_pod, name, namespace, body, timeouts=self._t
                )
            except k8s.ApiException as e:
                raise access_error(op, e) from e
        op = f"bind pod {namespace}/{name} to {node}"
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            call_json(
                op, self._core.create_namespaced_binding, namespace, binding, timeouts=self._t
            )
        except k8s.ApiException as e:
            raise access_error(op, e) from e
