"""The engine's memory of pod specs (PodViews) between calls."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gpu_share.sharing.model import PodResourcesView, PodView, ResourceKind, ResourceNames
from gpu_share.sharing.node.ledger import PodKey


class PodViews:
    """PodViews seen, by pod key (requests never change, so a view stays true for the
    life of its pod)."""

    def __init__(self) -> None:
        self._views: dict[PodKey, PodView] = {}
        # Keys merged since the last ``prune``: a pod being admitted may not be in the
        # kubelet's list yet, and must not be fetched again at every call.
        self._recent: set[PodKey] = set()

    @property
    def views(self) -> Mapping[PodKey, PodView]:
        return self._views

    def get(self, key: PodKey) -> PodView | None:
        return self._views.get(key)

    def merge(self, pods: Mapping[PodKey, PodView | None] | None) -> None:
        """Take what the agent fetched; a key mapped to None is a pod that is gone."""
        for key, view in (pods or {}).items():
            if view is None:
                self._views.pop(key, None)
            else:
                self._views[key] = view
                self._recent.add(key)

    def prune(self, keep: Collection[PodKey]) -> int:
        """Forget every view but ``keep``'s (the pods the kubelet and the ledger have
        now) and those merged since the last prune: the agent remembers what the node has,
        not every pod it ever saw. Returns how many were forgotten."""
        gone = [k for k in self._views if k not in keep and k not in self._recent]
        for k in gone:
            del self._views[k]
        self._recent = set()
        return len(gone)

    def drop(self, key: PodKey) -> None:
        self._views.pop(key, None)

    def needs(self, pr: PodResourcesView, names: ResourceNames) -> list[PodKey]:
        """Pods whose PodView the agent must fetch: unknown ones, and those with a
        container still missing a resource it requests (being admitted, or a new pod of
        a reused name)."""
        need: list[PodKey] = []
        for p in pr.pods:
            key = (p.namespace, p.name)
            view = self._views.get(key)
            devs = {c.name: c.devices for c in p.containers}
            if view is None or any(
                c.request.amount(k) > 0 and not devs.get(c.name, {}).get(names.name_of(k))
                for c in view.containers
                for k in ResourceKind
            ):
                need.append(key)
        return need
