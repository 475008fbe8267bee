"""A read-only ``ClusterView`` (extender.ports) for the extender's tests and benches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_share.extender.ports import ReadOnlyView
from gpu_share.sharing.placement import NodeSlots, Workload


class StaticView(ReadOnlyView):
    """The nodes of ``slots`` (the caller's mapping, read at each call: change it to change
    the cluster) and ``load`` as the workload; no pod is known, and a bind through this
    view is a test error."""

    read_only = "no binds through a StaticView"

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

