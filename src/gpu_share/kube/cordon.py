"""The agent's watch of its own Node, for the device cordons an admin writes there
(``sharing.cordon``): one list+watch (``kube.listwatch.ListWatch``) narrowed to the
node by a field selector, so a cordon is honoured within a second or two of its write.

Only the annotations under the cordon prefix are handed on, and only when they changed:
the kubelet's status updates and the agent's own inventory writes pass silently.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpu_share.kube.listwatch import ListWatch, WatchBackoff, rest_paged_list, rest_watch
from gpu_share.kube.rest import RestClient
from gpu_share.observability.loops import LoopSupervisor

__all__ = ["NODE_WATCH_LOOP", "NodeCordonWatch"]

NODE_WATCH_LOOP = "node-watch"
WATCH_TIMEOUT_S = 300
# A watch ends (and is reopened) every WATCH_TIMEOUT_S; relisting now and then repairs
# an event lost in between.
RESYNC_S = 600.0


class NodeCordonWatch:
    """Calls ``on_change(annotations)`` with the node's annotations under ``prefix``
    after the first list and whenever they change (``{}`` when the node is gone)."""

    def __init__(
        self,
        api: RestClient,
        node_name: str,
        prefix: str,
        on_change: Callable[[Mapping[str, str]], None],
        *,
        loops: LoopSupervisor | None = None,
        on_error: Callable[[str], None] | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._node = node_name
        self._prefix = prefix
        self._on_change = on_change
        self._loops = loops
        self._last: dict[str, str] | None = None
        selector = f"metadata.name={node_name}"
        op = f"node {node_name}"
        self._watch = ListWatch(
            NODE_WATCH_LOOP,
            lambda: rest_paged_list(api, f"list {op}", "/api/v1/nodes", fieldSelector=selector),
            rest_watch(api, f"watch {op}", "/api/v1/nodes", fieldSelector=selector),
            on_list=self._listed,
            on_event=self._event,
            timeout_s=timeout_s,
            resync_s=RESYNC_S,
            backoff=WatchBackoff(0.5, 30.0),
            on_error=on_error,
        )

    def start(self) -> None:
        self._watch.start(self._loops)

    def stop(self, timeout_s: float = 1.0) -> None:
        self._watch.stop(join_timeout_s=timeout_s)

    @property
    def synced(self) -> threading.Event:
        return self._watch.synced

    def _mine(self, obj: Mapping[str, Any]) -> dict[str, str] | None:
        meta = obj.get("metadata") or {}
        if meta.get("name") != self._node:
            return None
        return {
            str(k): v
            for k, v in (meta.get("annotations") or {}).items()
            if str(k).startswith(self._prefix) and isinstance(v, str)
        }

    def _listed(self, items: Sequence[Mapping[str, Any]]) -> None:
        found: dict[str, str] = {}
        for obj in items:
            mine = self._mine(obj)
            if mine is not None:
                found = mine
        self._hand_on(found)

    def _event(self, etype: str, obj: Mapping[str, Any]) -> None:
        mine = self._mine(obj)
        if mine is None:
            return
        self._hand_on({} if etype == "DELETED" else mine)

    def _hand_on(self, annotations: dict[str, str]) -> None:
        if annotations == self._last:
            return
        self._on_change(annotations)
        self._last = annotations  # after: a failed hand-on is retried by the relist
