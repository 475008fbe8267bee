"""Pods from the API server as ``sharing.model.PodView``.

``KubePodSource`` answers each call with one API request (``kube.rest``).
``NodePodCache`` keeps the pods of one node in memory through list+watch (a thread) so
that the allocation path needs no request at all for a pod the watch delivered;
``fetch`` reads one on a miss.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpu_share.config.model import ResourcesConfig
from gpu_share.kube.listwatch import (
    ListWatch,
    WatchBackoff,
    WatchStream,
    rest_paged_list,
    rest_watch,
)
from gpu_share.kube.rest import ApiError, KubeTimeouts, RestClient, quote_name
from gpu_share.observability.loops import LoopSupervisor
from gpu_share.sharing.model import PodView
from gpu_share.sharing.placement.pod_request import read_pod_request

log = logging.getLogger(__name__)
ANNOTATION_PREFIX = "gpu-share."  # every annotation gpu-share writes or reads

__all__ = ["KubePodSource", "NodePodCache", "pod_view_from_dict"]


# ---------------------------------------------------------------- conversion


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

    Containers and their requests are read by ``sharing.placement.pod_request`` (kubelet admission
    order; a malformed amount counts as 0 and is logged).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    req = read_pod_request(obj, memory_resource, core_resource, placement=False)
    for problem in req.problems:  # the API server validates quantities; be safe anyway
        log.warning("pod %s/%s: ignoring %s", meta.get("namespace"), meta.get("name"), problem)
    return PodView(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node_name=str(spec.get("nodeName") or ""),
        containers=req.containers,
        phase=str(status.get("phase") or "Pending"),
        annotations=dict(meta.get("annotations") or {}),
        deleted=bool(meta.get("deletionTimestamp")),
        created_at=_epoch(meta.get("creationTimestamp")),
    )


# ---------------------------------------------------------------- direct source


class KubePodSource:
    """``agent.ports.PodSource`` with one API request per call."""

    def __init__(
        self,
        api: RestClient,
        *,
        memory_resource: str,
        core_resource: str,
        timeouts: KubeTimeouts | None = None,
        page_size: int = 500,
    ) -> None:
        # ``timeouts`` replace the client's own when given.
        self._api = api if timeouts is None else replace(api, timeouts=timeouts)
        self._memory_resource = memory_resource
        self._core_resource = core_resource
        self._page_size = page_size

    @classmethod
    def from_config(
        cls,
        api: RestClient,
        resources: ResourcesConfig,
        *,
        timeouts: KubeTimeouts | None = None,
    ) -> KubePodSource:
        return cls(
            api,
            memory_resource=resources.memory_resource,
            core_resource=resources.core_resource,
            timeouts=timeouts,
        )

    def view(self, obj: Mapping[str, Any]) -> PodView:
        return pod_view_from_dict(
            obj, memory_resource=self._memory_resource, core_resource=self._core_resource
        )

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        try:
            obj = self._api.get(
                f"get pod {namespace}/{name}",
                f"/api/v1/namespaces/{quote_name(namespace)}/pods/{quote_name(name)}",
            )
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return self.view(obj)

    def list_node_pods(self, node_name: str) -> list[PodView]:
        items, _ = self.list_node_pod_objects(node_name)
        return [self.view(o) for o in items]

    def list_node_pod_objects(self, node_name: str) -> tuple[list[dict[str, Any]], str]:
        """All pods bound to the node as JSON objects, and the list's resourceVersion."""
        return rest_paged_list(
            self._api,
            f"list pods of node {node_name}",
            "/api/v1/pods",
            page_size=self._page_size,
            fieldSelector=f"spec.nodeName={node_name}",
        )

    def open_node_watch(self, node_name: str, resource_version: str, timeout_s: int) -> WatchStream:
        """A watch of the node's pods from ``resource_version``. Raises
        ``ResourceExpired`` (410) or KubeAccessError."""
        return rest_watch(
            self._api,
            f"watch pods of node {node_name}",
            "/api/v1/pods",
            fieldSelector=f"spec.nodeName={node_name}",
        )(resource_version, timeout_s)


# ---------------------------------------------------------------- watch cache


def _slim(view: PodView) -> PodView:
    """Only the annotations gpu-share reads (its own, ``gpu-share.<domain>/...``): a
    tenant's other annotations (up to 256 KiB a pod) stay out of the cache."""
    if all(k.startswith(ANNOTATION_PREFIX) for k in view.annotations):
        return view
    kept = {k: v for k, v in view.annotations.items() if k.startswith(ANNOTATION_PREFIX)}
    return replace(view, annotations=kept)


class NodePodCache:
    """The pods of one node, fed by a watch (``kube.listwatch.ListWatch``) in a daemon
    thread: the agent's pod source.

    Bounded: only pods bound to this node (field selector, and checked again), each
    as a ``PodView`` (our requests per container, phase, uid, gpu-share annotations).

    - ``get`` answers from memory and never touches the network: None when the pod is
      unknown, being deleted (a StatefulSet pod's successor reuses the name, so a
      terminating entry may already be stale) or the watch is not healthy.
    - ``fetch`` is the fresh read for a pod ``get`` did not answer: one GET, whose
      answer is kept (a pod on this node) or dropped (404). Raises KubeAccessError.
    - ``get_pod``/``list_node_pods`` make it an ``agent.ports.PodSource``: ``get`` then
      ``fetch``; the list from memory while the watch is healthy, else from the API.

    Lifecycle: ``start()`` once, ``stop()`` once; ``stop`` interrupts the open watch and
    joins the thread within its timeout.
    """

    def __init__(
        self,
        source: KubePodSource,
        node_name: str,
        *,
        watch_timeout_s: int = 300,
        resync_s: float | None = 900.0,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        loops: LoopSupervisor | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._source = source
        self._node = node_name
        self._loops = loops
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodView] = {}
        # Failures are logged (rate-limited), reported to on_error (a metric) and
        # followed by a jittered pause within backoff_s, then a relist.
        self._watch = ListWatch(
            "pod-watch",
            lambda: source.list_node_pod_objects(node_name),
            lambda rv, timeout_s: source.open_node_watch(node_name, rv, timeout_s),
            on_list=self._replace,
            on_event=self._apply,
            timeout_s=watch_timeout_s,
            resync_s=resync_s,
            backoff=WatchBackoff(*backoff_s),
            on_error=on_error,
        )

    # -- lifecycle

    def start(self) -> None:
        if self._watch.thread is not None:
            raise RuntimeError("NodePodCache already started")
        self._watch.start(self._loops)

    def stop(self, timeout: float = 5.0) -> None:
        self._watch.stop(join_timeout_s=timeout)
        self._watch.synced.clear()

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list arrived (and the watch is healthy)."""
        return self._watch.synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._watch.synced.is_set()

    @property
    def relists(self) -> int:
        """How many full lists were made (observability / tests)."""
        return self._watch.lists

    # -- reads

    def get(self, namespace: str, name: str) -> PodView | None:
        """The pod from memory, or None (unknown, terminating, watch not healthy)."""
        if not self._watch.synced.is_set():
            return None
        with self._lock:
            pod = self._pods.get((namespace, name))
        return None if pod is None or pod.deleted else pod

    def fetch(self, namespace: str, name: str) -> PodView | None:
        """A fresh read of one pod (one GET), kept when it is on this node."""
        pod = self._source.get_pod(namespace, name)
        with self._lock:
            if pod is not None and pod.node_name == self._node:
                # The GET is the freshest knowledge; a later DELETED of an older uid is
                # ignored by _apply.
                pod = self._pods[(namespace, name)] = _slim(pod)
            else:
                self._pods.pop((namespace, name), None)
        return pod

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        return self.get(namespace, name) or self.fetch(namespace, name)

    def list_node_pods(self, node_name: str) -> list[PodView]:
        if node_name == self._node and self._watch.synced.is_set():
            with self._lock:
                return list(self._pods.values())
        return self._source.list_node_pods(node_name)

    # -- watch handlers (the watch thread)

    def _view(self, obj: Mapping[str, Any]) -> PodView | None:
        view = self._source.view(obj)
        return _slim(view) if view.node_name == self._node else None

    def _replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        fresh = {}
        for obj in items:
            view = self._view(obj)
            if view is not None:
                fresh[(view.namespace, view.name)] = view
        with self._lock:
            self._pods = fresh

    def _apply(self, etype: str, obj: Mapping[str, Any]) -> None:
        view = self._view(obj)
        if view is None:
            return
        key = (view.namespace, view.name)
        with self._lock:
            if etype != "DELETED":
                self._pods[key] = view
            elif (old := self._pods.get(key)) is not None and old.uid == view.uid:
                del self._pods[key]
