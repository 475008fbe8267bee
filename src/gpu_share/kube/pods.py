"""Pods from the API server as ``sharing.model.PodView``.

``KubePodSource`` answers each call with one API request. ``NodePodCache`` keeps the
pods of one node in memory through list+watch (a thread) so that the allocation path
usually needs no request at all; it falls back to a GET on a miss.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from kubernetes import client as k8s

from gpu_share.config.model import ResourcesConfig
from gpu_share.errors import KubeAccessError
from gpu_share.kube.client import (
    TRANSPORT_ERRORS,
    KubeTimeouts,
    access_error,
    call_json,
)
from gpu_share.observability.loops import Backoff, LoopSupervisor
from gpu_share.sharing.model import ContainerKind, ContainerRequest, ContainerView, PodView
from gpu_share.sharing.quantity import QuantityError, parse_quantity

log = logging.getLogger(__name__)

__all__ = ["KubePodSource", "NodePodCache", "pod_view_from_dict", "pod_view_from_v1"]


# ---------------------------------------------------------------- conversion


def _quantity(value: Any) -> int:
    """An extended-resource quantity as int; the API server only admits whole numbers,
    so anything else is a malformed object and counts as "not requested"."""
    if value is None:
        return 0
    try:
        q = parse_quantity(value)
    except QuantityError:
        log.warning("ignoring unparseable resource quantity %r", value)
        return 0
    if q < 0 or q.denominator != 1:
        log.warning("ignoring non-integer resource quantity %r", value)
        return 0
    return int(q)


def _amount(resources: Mapping[str, Any] | None, name: str) -> int:
    # Limits are authoritative for extended resources (requests must equal them when
    # both are set); requests alone are accepted as a fallback, per resource name.
    res = resources or {}
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    if name in limits:
        return _quantity(limits[name])
    return _quantity(requests.get(name))


def _container(
    c: Mapping[str, Any], kind: ContainerKind, memory_resource: str, core_resource: str
) -> ContainerView:
    res = c.get("resources")
    return ContainerView(
        name=str(c.get("name", "")),
        kind=kind,
        request=ContainerRequest(
            memory_units=_amount(res, memory_resource),
            cores=_amount(res, core_resource),
        ),
    )


def _epoch(ts: Any) -> float:
    if not ts:
        return 0.0
    if isinstance(ts, datetime):
        return ts.timestamp()
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def pod_view_from_dict(
    obj: Mapping[str, Any], *, memory_resource: str, core_resource: str
) -> PodView:
    """A pod in its JSON form (camelCase keys, as the API server sends it) -> PodView.

    Containers come in kubelet admission order: init containers in spec order (restartable
    ones, ``restartPolicy: Always``, are sidecars), then app containers in spec order.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    containers: list[ContainerView] = []
    for c in spec.get("initContainers") or ():
        kind = ContainerKind.SIDECAR if c.get("restartPolicy") == "Always" else ContainerKind.INIT
        containers.append(_container(c, kind, memory_resource, core_resource))
    for c in spec.get("containers") or ():
        containers.append(_container(c, ContainerKind.APP, memory_resource, core_resource))
    return PodView(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node_name=str(spec.get("nodeName") or ""),
        containers=tuple(containers),
        phase=str(status.get("phase") or "Pending"),
        annotations=dict(meta.get("annotations") or {}),
        deleted=bool(meta.get("deletionTimestamp")),
        created_at=_epoch(meta.get("creationTimestamp")),
    )


def pod_view_from_v1(pod: k8s.V1Pod, *, memory_resource: str, core_resource: str) -> PodView:
    """A generated ``V1Pod`` model -> PodView (via its JSON form)."""
    api: Any = k8s.ApiClient()
    obj = api.sanitize_for_serialization(pod)
    return pod_view_from_dict(obj, memory_resource=memory_resource, core_resource=core_resource)


# ---------------------------------------------------------------- direct source


class KubePodSource:
    """``agent.ports.PodSource`` with one API request per call."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        memory_resource: str,
        core_resource: str,
        timeouts: KubeTimeouts | None = None,
        page_size: int = 500,
    ) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._memory_resource = memory_resource
        self._core_resource = core_resource
        self._timeouts = timeouts or KubeTimeouts()
        self._page_size = page_size

    @classmethod
    def from_config(
        cls,
        api_client: k8s.ApiClient,
        resources: ResourcesConfig,
        *,
        timeouts: KubeTimeouts | None = None,
    ) -> KubePodSource:
        return cls(
            api_client,
            memory_resource=resources.memory_resource,
            core_resource=resources.core_resource,
            timeouts=timeouts,
        )

    def view(self, obj: Mapping[str, Any]) -> PodView:
        return pod_view_from_dict(
            obj, memory_resource=self._memory_resource, core_resource=self._core_resource
        )

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        op = f"get pod {namespace}/{name}"
        try:
            obj = call_json(
                op, self._core.read_namespaced_pod, name, namespace, timeouts=self._timeouts
            )
        except k8s.ApiException as e:
            if e.status == 404:
                return None
            raise access_error(op, e) from e
        return self.view(obj)

    def list_node_pods(self, node_name: str) -> list[PodView]:
        items, _ = self.list_node_pod_objects(node_name)
        return [self.view(o) for o in items]

    def list_node_pod_objects(self, node_name: str) -> tuple[list[dict[str, Any]], str]:
        """All pods bound to the node as JSON objects, and the list's resourceVersion."""
        op = f"list pods of node {node_name}"
        items: list[dict[str, Any]] = []
        cont: str | None = None
        rv = ""
        # A node holds at most a few hundred pods; the bound only guards against a
        # server that keeps answering with a continue token.
        for _ in range(1000):
            kwargs: dict[str, Any] = {
                "field_selector": f"spec.nodeName={node_name}",
                "limit": self._page_size,
            }
            if cont:
                kwargs["_continue"] = cont
            try:
                page = call_json(
                    op, self._core.list_pod_for_all_namespaces, timeouts=self._timeouts, **kwargs
                )
            except k8s.ApiException as e:
                raise access_error(op, e) from e
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or rv)
            cont = meta.get("continue") or None
            if not cont:
                return items, rv
        raise KubeAccessError(f"{op}: too many pages")

    def open_node_watch(self, node_name: str, resource_version: str, timeout_s: int) -> Any:
        """A streaming watch of the node's pods from ``resource_version`` (the raw
        urllib3 response; newline-delimited JSON events). Raises ApiException."""
        return self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name}",
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _preload_content=False,
            # The server ends the watch after timeout_s; the read timeout only catches a
            # connection that went silent without closing.
            _request_timeout=(self._timeouts.connect, timeout_s + self._timeouts.read),
        )


# ---------------------------------------------------------------- watch cache


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


def _lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited JSON events of a streaming watch answer."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl], buf[nl + 1 :]
            if line.strip():
                yield line
    if buf.strip():
        yield buf


class NodePodCache:
    """Pods of one node kept in memory by list+watch in a daemon thread.

    Also an ``agent.ports.PodSource``: ``get_pod`` answers from memory and falls back to a
    GET when the pod is unknown or being deleted (a StatefulSet pod's successor reuses the
    name, so a terminating entry may already be stale). ``list_node_pods`` answers from
    memory only while the watch is healthy.

    Lifecycle: ``start()`` once, ``stop()`` once; ``stop`` interrupts the open watch and
    joins the thread within its timeout.
    """

    def __init__(
        self,
        source: KubePodSource,
        node_name: str,
        *,
        watch_timeout_s: int = 300,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        loops: LoopSupervisor | None = None,
    ) -> None:
        self._source = source
        self._node = node_name
        self._watch_timeout_s = watch_timeout_s
        # The watch runs supervised: a failure is logged (rate-limited), counted, and
        # followed by a growing pause within backoff_s.
        self._loops = loops or LoopSupervisor(backoff=Backoff(*backoff_s))
        self._rv: str | None = None  # None: relist first
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodView] = {}
        self._healthy = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self.relists = 0  # how many full lists were made (observability / tests)

    # -- lifecycle

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("NodePodCache already started")
        # A quiet watch beats once per server-side timeout; allow that, a read timeout
        # and the longest pause, with room.
        max_age = self._watch_timeout_s + 180.0
        self._thread = self._loops.spawn(
            "pod-watch", self._step, max_age_s=max_age, stop=self._stop
        )

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._interrupt()
        if self._thread is not None:
            self._thread.join(timeout)
        self._healthy.clear()

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list arrived (and the watch is healthy)."""
        return self._healthy.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._healthy.is_set()

    # -- PodSource

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        with self._lock:
            pod = self._pods.get((namespace, name))
        if pod is not None and not pod.deleted and self._healthy.is_set():
            return pod
        pod = self._source.get_pod(namespace, name)
        if pod is not None and pod.node_name == self._node:
            with self._lock:
                self._store(pod)
        return pod

    def list_node_pods(self, node_name: str) -> list[PodView]:
        if node_name == self._node and self._healthy.is_set():
            with self._lock:
                return list(self._pods.values())
        return self._source.list_node_pods(node_name)

    # -- internals

    def _store(self, pod: PodView) -> None:
        # Only reached when the entry was missing, terminating or the watch unhealthy:
        # the GET is then the freshest knowledge (a later DELETED of an older uid is
        # ignored by _apply).
        self._pods[(pod.namespace, pod.name)] = pod

    def _interrupt(self) -> None:
        resp = self._resp
        if resp is None:
            return
        # urllib3 >= 2.3 can unblock a read from another thread; older ones stop at
        # the next event or at the server-side watch timeout.
        with contextlib.suppress(Exception):
            if hasattr(resp, "shutdown"):
                resp.shutdown()

    def _step(self) -> None:
        """One pass: list when needed, then one watch. Whatever it raises goes to the
        supervisor (logged, counted, a pause) and the next pass relists."""
        try:
            if self._rv is None:
                self._rv = self._relist()
            self._rv = self._watch(self._rv)
        except _Gone:
            log.info("pod watch of node %s expired (410); relisting", self._node)
            self._rv = None
        except Exception:
            self._rv = None
            if not self._stop.is_set():
                self._healthy.clear()
                raise

    def _relist(self) -> str:
        items, rv = self._source.list_node_pod_objects(self._node)
        fresh = {}
        for obj in items:
            view = self._source.view(obj)
            fresh[(view.namespace, view.name)] = view
        with self._lock:
            self._pods = fresh
        self.relists += 1
        self._healthy.set()
        return rv

    def _watch(self, rv: str) -> str:
        try:
            resp = self._source.open_node_watch(self._node, rv, self._watch_timeout_s)
        except k8s.ApiException as e:
            if e.status == 410:
                raise _Gone() from e
            raise access_error(f"watch pods of node {self._node}", e) from e
        except TRANSPORT_ERRORS as e:
            raise KubeAccessError(f"watch pods of node {self._node}: {e}") from e
        self._resp = resp
        try:
            if self._stop.is_set():
                return rv
            for line in _lines(resp):
                if self._stop.is_set():
                    break
                rv = self._apply(json.loads(line), rv)
        except TRANSPORT_ERRORS as e:
            if self._stop.is_set():
                return rv
            raise KubeAccessError(f"watch pods of node {self._node}: {e}") from e
        finally:
            self._resp = None
            # Close, never release: a watch connection that was shut down (or cut
            # mid-stream) returned to the shared pool makes the next request hang.
            with contextlib.suppress(Exception):
                resp.close()
        return rv

    def _apply(self, event: Mapping[str, Any], rv: str) -> str:
        etype = event.get("type")
        obj = event.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Gone()
            raise KubeAccessError(
                f"watch pods of node {self._node}: {obj.get('message', 'error event')}"
            )
        new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
        if etype == "BOOKMARK":
            return new_rv
        view = self._source.view(obj)
        key = (view.namespace, view.name)
        with self._lock:
            if etype in ("ADDED", "MODIFIED"):
                self._pods[key] = view
            elif etype == "DELETED":
                old = self._pods.get(key)
                if old is not None and old.uid == view.uid:
                    del self._pods[key]
        return new_rv
