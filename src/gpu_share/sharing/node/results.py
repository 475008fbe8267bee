"""What the agent passes to the engine per call, and what it gets back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_share.sharing.model import ContainerRef, PodResourcesView, PodView
from gpu_share.sharing.node.ledger import EntrySource, LedgerEntry, PodKey
from gpu_share.sharing.node.notes import Note


@dataclass(frozen=True)
class CallContext:
    """What the agent could learn for one kubelet call.

    ``pr``: PodResources ``List`` (None: kubelet unreachable). ``pods``: PodViews the
    agent fetched for ``context_needs`` (None: API server unreachable); a key mapped to
    None means the API server says the pod does not exist.
    """

    pr: PodResourcesView | None
    pods: Mapping[PodKey, PodView | None] | None
    now: float


@dataclass(frozen=True)
class Preferred:
    ids: list[str]
    entry: LedgerEntry
    identity_source: EntrySource  # node-agent, or degraded (synthetic ref)
    notes: tuple[Note, ...] = ()  # facts for logs/events
    ambiguity: int = 0  # other containers that qualified for this call
    changed: bool = True  # the ledger changed (the offer is recorded): persist it


@dataclass(frozen=True)
class Allocation:
    entry: LedgerEntry
    complete_container: bool  # every requested resource of the container allocated
    identity_source: EntrySource
    notes: tuple[Note, ...] = ()
    ambiguity: int = 0


@dataclass(frozen=True)
class ReconcileResult:
    released: tuple[ContainerRef, ...] = ()
    adopted: tuple[ContainerRef, ...] = ()  # new entries from PodResources
    attributed: tuple[ContainerRef, ...] = ()  # degraded entries now named
    corrected: tuple[ContainerRef, ...] = ()  # ids replaced by what PodResources says
    waiting: tuple[PodKey, ...] = ()  # absent pods still inside the grace period

    @property
    def changed(self) -> bool:
        return bool(self.released or self.adopted or self.attributed or self.corrected)

    @property
    def pods_touched(self) -> list[PodKey]:
        refs = [*self.released, *self.adopted, *self.attributed, *self.corrected]
        return sorted({(r.namespace, r.pod_name) for r in refs if r.namespace})
