"""The extender's cluster view (``extender.ports.ClusterView``) and binder, on the API server.

Nodes and pods are kept in memory by list+watch (one daemon thread each, relisting on
HTTP 410 or any error after a short pause); ``node()`` merges a node's inventory
annotation with the annotations of its pods and pending reservations
(``sharing.placement.view``), and its allocatable CPU/memory with the requests of every
pod bound to it, so the policy scores host resources as the trace replay does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client as k8s

from gpu_share.errors import KubeAccessError
from gpu_share.kube.client import KubeTimeouts, access_error, call_json
from gpu_share.sharing.annotations import AnnotationError, InventoryAnnotation, inventory_key
from gpu_share.sharing.placement import NodeSlots, Shape, Workload
from gpu_share.sharing.placement.view import Usage, node_slots, pod_usage
from gpu_share.sharing.quantity import QuantityError, cpu_milli, memory_mib, pod_host_request

log = logging.getLogger(__name__)
PENDING_TTL_S = 120.0  # a reservation the watch never confirmed is dropped after this


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
        timeouts: KubeTimeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._domain = domain
        self._mem, self._cores = memory_resource, core_resource
        self._default = default_workload
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
                if (p.get("spec") or {}).get("nodeName") == name:
                    ann = (p.get("metadata") or {}).get("annotations") or {}
                    usages.append(pod_usage(ann, self._domain, totals))
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
            slots = node_slots(inv, usages)
            cpu, mem = self._alloc.get(name, (None, None))
            return replace(
                slots,
                cpu_free=None if cpu is None else cpu - cpu_used,
                host_memory_free=None if mem is None else mem - mem_used,
            )

    def workload(self) -> Workload:
        """Requests of pods seen (bound or pending), else the configured default mix."""
        with self._lock:
            counts: dict[tuple[int, int, int, int], int] = {}
            for p in self._pods.values():
                cpu, mem = _host_request(p)
                for m, c in self._requests(p):
                    counts[(m, c, cpu, mem)] = counts.get((m, c, cpu, mem), 0) + 1
            key = tuple(sorted(counts.items()))
            # Same mix, same object: the policy built on it keeps its memo across requests.
            if self._wl is None or self._wl[0] != key:
                wl = (
                    Workload(Shape(m, c, float(n), cpu, mem) for (m, c, cpu, mem), n in key)
                    if key
                    else self._default
                )
                self._wl = (key, wl)
            return self._wl[1]

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        with self._lock:
            p = self._pods.get(pod_uid)
            bound = p is not None and (p.get("spec") or {}).get("nodeName") == node
            if not (bound and self._has_own_annotation(p or {})):
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
    def start(self) -> None:
        for what in ("nodes", "pods"):
            threading.Thread(
                target=self._run, args=(what,), name=f"view-{what}", daemon=True
            ).start()

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

    def _has_own_annotation(self, pod: Mapping[str, Any]) -> bool:
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        return any(
            k.startswith(f"gpu-share.{self._domain}/") and k.endswith(("/decision", "/assignment"))
            for k in ann
        )

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
                else:
                    self._nodes[name] = inv
                    self._alloc[name] = _allocatable(obj)
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
                return
            self._pods[uid] = dict(obj)
            if bound and self._has_own_annotation(obj):
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
                self._host.clear()
                self._host_node.clear()
        for item in page.get("items") or ():
            self._apply(what, "ADDED", item)
        self._synced[what].set()
        return str((page.get("metadata") or {}).get("resourceVersion", ""))

    def _run(self, what: str) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list(what)
                fn = (
                    self._core.list_node
                    if what == "nodes"
                    else self._core.list_pod_for_all_namespaces
                )
                resp = fn(
                    watch=True,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=300,
                    _preload_content=False,
                    _request_timeout=(self._t.connect, 300 + self._t.read),
                )
                for line in _lines(resp):
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        rv = ""  # 410 Gone and friends: relist
                        break
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                    if ev.get("type") != "BOOKMARK":
                        self._apply(what, str(ev.get("type")), obj)
                    if self._stop.is_set():
                        return
            except (k8s.ApiException, KubeAccessError, OSError, ValueError) as e:
                log.warning("watch %s: %s; relisting", what, e)
                rv = ""
                self._stop.wait(2.0)
            except Exception as e:  # urllib3 protocol errors etc.; keep watching
                log.warning("watch %s: %r; relisting", what, e)
                rv = ""
                self._stop.wait(2.0)


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
