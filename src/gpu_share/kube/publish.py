"""Annotations and Events written to the API server (``agent.ports.Publisher``).

Nothing here raises into the caller: publishing is advisory and runs on the allocation
path, so a failure is logged, counted in ``failures`` and handed to ``on_error``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest import ApiError, KubeTimeouts, RestClient, quote_name

log = logging.getLogger(__name__)

__all__ = ["COMPONENT", "KubePublisher"]

# Event source component; one name everywhere (the DaemonSet's container is named so).
COMPONENT = "gpu-share-plugin"

# Namespace of Events about the node (cluster-scoped): where the kubelet puts them.
NODE_EVENT_NAMESPACE = "default"


@dataclass
class _Sent:
    """An Event already created, kept to aggregate identical ones into its count."""

    name: str
    namespace: str
    count: int
    first_seen: float  # monotonic


class _Recent:
    """Events created within ``window_s``, by (object, reason, message, type), oldest
    first; at most ``limit`` of them."""

    def __init__(self, window_s: float, limit: int, clock: Callable[[], float]) -> None:
        self._window = window_s
        self._limit = limit
        self._clock = clock
        self._sent: OrderedDict[tuple[str, ...], _Sent] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sent)

    def get(self, key: tuple[str, ...]) -> _Sent | None:
        # Entries are in creation order, so expired ones are at the front.
        now = self._clock()
        while self._sent:
            first = next(iter(self._sent.values()))
            if now - first.first_seen < self._window:
                break
            self._sent.popitem(last=False)
        return self._sent.get(key)

    def forget(self, key: tuple[str, ...]) -> None:
        self._sent.pop(key, None)

    def add(self, key: tuple[str, ...], name: str, namespace: str) -> None:
        self._sent[key] = _Sent(name, namespace, 1, self._clock())
        while len(self._sent) > self._limit:
            self._sent.popitem(last=False)


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubePublisher:
    """``agent.ports.Publisher`` over the API server.

    Identical events ((object, reason, message, type)) within ``event_window_s`` of the
    first one are folded into that Event by patching its ``count`` and
    ``lastTimestamp``, as the kubelet's event correlator does; after the window a new
    Event is created.
    """

    def __init__(
        self,
        api: RestClient,
        *,
        host_node: str,
        component: str = COMPONENT,
        timeouts: KubeTimeouts | None = None,
        event_window_s: float = 60.0,
        max_tracked_events: int = 256,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        # ``timeouts`` replace the client's own when given.
        self._api = api if timeouts is None else replace(api, timeouts=timeouts)
        self._host = host_node
        self._component = component
        self._wall = wall_clock
        self._on_error = on_error
        self._lock = threading.Lock()
        self._sent = _Recent(event_window_s, max_tracked_events, clock)
        self.failures: Counter[str] = Counter()  # op kind -> failed calls

    # -- annotations

    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None],
                      labels: Mapping[str, str | None] | None = None) -> bool:
        """True when written (or nothing to write); False when it could not be: the
        caller writes it again later (annotations are state). ``labels`` go in the
        same patch."""
        if not annotations and not labels:
            return True
        patch = _annotation_patch(annotations)
        if labels:
            patch["metadata"]["labels"] = dict(labels)
        return self._guarded(
            "annotate_node",
            f"annotate node {node_name}",
            self._api.patch,
            f"/api/v1/nodes/{quote_name(node_name)}",
            patch,
        )

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> bool:
        """As ``annotate_node``; a pod that is gone (404) counts as done."""
        if not annotations:
            return True
        return self._guarded(
            "annotate_pod",
            f"annotate pod {namespace}/{name}",
            self._api.patch,
            f"/api/v1/namespaces/{quote_name(namespace)}/pods/{quote_name(name)}",
            _annotation_patch(annotations),
            gone_ok=True,
        )

    def node_annotations(self, node_name: str) -> dict[str, str] | None:
        """The node's current annotations (None if the node does not exist).
        A read for start-up, not the allocation path: raises KubeAccessError."""
        try:
            obj = self._api.get(f"get node {node_name}", f"/api/v1/nodes/{quote_name(node_name)}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return dict((obj.get("metadata") or {}).get("annotations") or {})

    # -- events

    def pod_event(
        self,
        namespace: str,
        name: str,
        *,
        reason: str,
        message: str,
        warning: bool,
        uid: str = "",
    ) -> None:
        """``uid`` ties the Event to this incarnation of the pod (``kubectl describe``
        matches on it); when not given it is looked up, best effort."""
        ref = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}
        self._event(namespace, ref, reason, message, warning, uid_lookup=(namespace, name, uid))

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None:
        # The kubelet records node events with uid = node name; kubectl describe node
        # finds them so.
        ref = {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name}
        self._event(NODE_EVENT_NAMESPACE, ref, reason, message, warning, uid_lookup=None)

    def _event(
        self,
        namespace: str,
        ref: dict[str, str],
        reason: str,
        message: str,
        warning: bool,
        *,
        uid_lookup: tuple[str, str, str] | None,
    ) -> None:
        etype = "Warning" if warning else "Normal"
        message = message[:1024]  # the API server rejects very long messages
        key = (ref["kind"], ref.get("namespace", ""), ref["name"], reason, message, etype)
        with self._lock:
            sent = self._sent.get(key)
            if sent is not None:
                sent.count += 1
                patch = {"count": sent.count, "lastTimestamp": _rfc3339(self._wall())}
                if self._guarded(
                    "event",
                    f"update event {sent.namespace}/{sent.name}",
                    self._api.patch,
                    f"/api/v1/namespaces/{quote_name(sent.namespace)}/events/"
                    f"{quote_name(sent.name)}",
                    patch,
                    not_found_ok=True,
                ):
                    return
                # Gone (expired or deleted) or failed: start a fresh Event.
                self._sent.forget(key)
            if uid_lookup is not None:
                ns, name, uid = uid_lookup
                uid = uid or self._pod_uid(ns, name)
                if uid:
                    ref["uid"] = uid
            stamp = self._wall()
            ev_name = f"{ref['name']}.{time.time_ns():x}"
            body = {
                "metadata": {"name": ev_name, "namespace": namespace},
                "involvedObject": ref,
                "reason": reason,
                "message": message,
                "type": etype,
                "source": {"component": self._component, "host": self._host},
                "firstTimestamp": _rfc3339(stamp),
                "lastTimestamp": _rfc3339(stamp),
                "count": 1,
                "reportingComponent": self._component,
                "reportingInstance": self._host,
            }
            if self._guarded(
                "event",
                f"create event for {ref['kind']} {ref['name']}",
                self._api.create,
                f"/api/v1/namespaces/{quote_name(namespace)}/events",
                body,
            ):
                self._sent.add(key, ev_name, namespace)

    def _pod_uid(self, namespace: str, name: str) -> str:
        try:
            obj = self._api.get(
                f"get pod {namespace}/{name}",
                f"/api/v1/namespaces/{quote_name(namespace)}/pods/{quote_name(name)}",
            )
        except KubeAccessError:
            return ""
        return str((obj.get("metadata") or {}).get("uid") or "")

    # -- error policy

    def _guarded(
        self, kind: str, op: str, fn: Callable[[str, str, Any], Any], path: str, body: Any,
        *, not_found_ok: bool = False, gone_ok: bool = False,
    ) -> bool:
        """Run one write (``fn(op, path, body)``); True on success. Never raises (see
        module doc). A 404 answers False quietly with ``not_found_ok``, True with
        ``gone_ok`` (nothing left to write)."""
        try:
            fn(op, path, body)
        except ApiError as e:
            if gone_ok and e.status == 404:
                return True
            if not_found_ok and e.status == 404:
                return False
            self._failed(kind, e)
            return False
        except KubeAccessError as e:
            self._failed(kind, e)
            return False
        except Exception as e:  # advisory writes must never break allocation
            self._failed(kind, e)
            return False
        return True

    def _failed(self, kind: str, exc: BaseException) -> None:
        self.failures[kind] += 1
        log.warning("publishing failed (%s): %s", kind, exc)
        if self._on_error is not None:
            try:
                self._on_error(kind, exc)
            except Exception:  # a broken hook must not turn into a raise either
                log.exception("on_error hook failed")


def _annotation_patch(annotations: Mapping[str, str | None]) -> dict[str, Any]:
    # Strategic-merge patch of metadata.annotations: a null value deletes the key.
    return {"metadata": {"annotations": dict(annotations)}}
