"""A ledger entry: one container's decision (its request, its shares on devices) and the
ids the kubelet allocated or was offered for it; and a device's usage as the ledger
counts it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    PerKind,
    ResourceKind,
)

LEDGER_VERSION = "v1"

PodKey = tuple[str, str]  # (namespace, pod name)


class EntrySource(StrEnum):
    NODE_AGENT = "node-agent"  # identity resolved at call time
    DEGRADED = "degraded"  # placed without knowing the container (synthetic ref)
    RECONCILED = "reconciled"  # adopted/attributed from PodResources later
    EXTENDER = "extender"  # device(s) chosen by the scheduler extender (signed decision)


class EntryState(StrEnum):
    DECIDED = "decided"  # device(s) chosen, no Allocate yet
    PARTIAL = "partially-allocated"  # some requested resources allocated
    COMPLETE = "complete"  # every requested resource allocated


@dataclass(frozen=True)
class LedgerEntry:
    ref: ContainerRef
    request: ContainerRequest
    shares: tuple[DeviceShare, ...]
    source: EntrySource
    created_at: float
    updated_at: float
    container_kind: ContainerKind = ContainerKind.APP
    order: int = -1  # position in kubelet admission order; -1 unknown
    memory_ids: tuple[str, ...] = ()
    core_ids: tuple[str, ...] = ()
    # What our last GetPreferredAllocation answered, to attribute the Allocate after it.
    offered_memory_ids: tuple[str, ...] = ()
    offered_core_ids: tuple[str, ...] = ()

    @property
    def pod_key(self) -> PodKey:
        return (self.ref.namespace, self.ref.pod_name)

    @property
    def degraded(self) -> bool:
        return self.source is EntrySource.DEGRADED

    @property
    def known_ref(self) -> ContainerRef | None:
        """The ref errors and Events name: None for a blind (degraded) entry."""
        return None if self.degraded else self.ref

    def ids(self, kind: ResourceKind) -> tuple[str, ...]:
        ids: tuple[str, ...] = getattr(self, _IDS[kind])
        return ids

    def offered(self, kind: ResourceKind) -> tuple[str, ...]:
        ids: tuple[str, ...] = getattr(self, _OFFERED[kind])
        return ids

    def allocated(self, kind: ResourceKind) -> bool:
        return bool(self.ids(kind))

    @property
    def state(self) -> EntryState:
        wanted = [k for k in ResourceKind if self.request.amount(k) > 0]
        done = [k for k in wanted if self.allocated(k)]
        if wanted and len(done) == len(wanted):
            return EntryState.COMPLETE
        return EntryState.PARTIAL if done else EntryState.DECIDED

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(s.device for s in self.shares)

    @property
    def exclusive(self) -> bool:
        return any(s.exclusive for s in self.shares)

    def with_ids(self, kind: ResourceKind, ids: Iterable[str], now: float) -> LedgerEntry:
        changes: dict[str, Any] = {_IDS[kind]: tuple(sorted(ids)), "updated_at": now}
        return replace(self, **changes)

    def with_offer(self, kind: ResourceKind, ids: Iterable[str], now: float) -> LedgerEntry:
        changes: dict[str, Any] = {_OFFERED[kind]: tuple(ids), "updated_at": now}
        return replace(self, **changes)


# Dicts, not PerKind: read for every entry on every call.
_IDS = {ResourceKind.MEMORY: "memory_ids", ResourceKind.CORE: "core_ids"}
_OFFERED = {ResourceKind.MEMORY: "offered_memory_ids", ResourceKind.CORE: "offered_core_ids"}


@dataclass
class DeviceUsage:
    """Units of one device taken, by held ids plus reservations of decided entries."""

    memory_used: int = 0
    cores_used: int = 0
    # Pods holding or reserving anything on the device.
    pods: set[PodKey] = field(default_factory=set)
    exclusive_pods: set[PodKey] = field(default_factory=set)

    def used(self, kind: ResourceKind) -> int:
        return PerKind(self.memory_used, self.cores_used)[kind]
