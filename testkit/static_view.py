"""A read-only ``ClusterView`` (extender.ports) for the extender's tests and benches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_share.sharing.placement import NodeSlots, Workload


class StaticView:
    """The nodes of ``slots`` (the caller's mapping, read at each call: change it to change
    the cluster) and ``load`` as the workload; no pod is known, and a bind through this
    view is a test error."""

    def __init__(self, slots: Mapping[str, NodeSlots | None], load: Workload) -> None:
        self.slots = slots
        self.load = load

    def nodes(self, names: Sequence[str]) -> dict[str, NodeSlots | None]:
        got = self.slots.get
        return {n: got(n) for n in names}

    def node(self, name: str) -> NodeSlots | None:
        return self.slots.get(name)

    def workload(self) -> Workload:
        return self.load

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        raise AssertionError("no binds through a StaticView")

    def unreserve(self, pod_uid: str, node: str) -> None:
        raise AssertionError("no binds through a StaticView")

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None
