"""The ledger: which container holds (or will hold) which part of which device.

One entry per container. An entry is created by the FIRST kubelet call for a container
(the decision, from the container's full request) and filled in as the kubelet's
Allocate calls arrive. The agent persists ``to_json()`` after every change and rebuilds
with ``Ledger.from_json`` at start; ``AllocationEngine.reconcile`` then corrects it from
PodResources.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpu_share.errors import AllocationError, LedgerError
from gpu_share.sharing.ids import parse_unit_ids
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
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

    def ids(self, kind: ResourceKind) -> tuple[str, ...]:
        return self.memory_ids if kind is ResourceKind.MEMORY else self.core_ids

    def offered(self, kind: ResourceKind) -> tuple[str, ...]:
        return self.offered_memory_ids if kind is ResourceKind.MEMORY else self.offered_core_ids

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
        t = tuple(sorted(ids))
        if kind is ResourceKind.MEMORY:
            return replace(self, memory_ids=t, updated_at=now)
        return replace(self, core_ids=t, updated_at=now)

    def with_offer(self, kind: ResourceKind, ids: Iterable[str], now: float) -> LedgerEntry:
        t = tuple(ids)
        if kind is ResourceKind.MEMORY:
            return replace(self, offered_memory_ids=t, updated_at=now)
        return replace(self, offered_core_ids=t, updated_at=now)


@dataclass
class DeviceUsage:
    """Units of one device taken, by held ids plus reservations of decided entries."""

    memory_used: int = 0
    cores_used: int = 0
    # Pods holding or reserving anything on the device.
    pods: set[PodKey] = field(default_factory=set)
    exclusive_pods: set[PodKey] = field(default_factory=set)

    def used(self, kind: ResourceKind) -> int:
        return self.memory_used if kind is ResourceKind.MEMORY else self.cores_used


class Ledger:
    def __init__(self) -> None:
        self._entries: dict[ContainerRef, LedgerEntry] = {}
        self.absent_since: dict[PodKey, float] = {}
        self.seq = 0  # for synthetic refs of degraded entries

    # -- lookup -------------------------------------------------------------------
    @property
    def entries(self) -> list[LedgerEntry]:
        return sorted(self._entries.values(), key=lambda e: (e.ref, e.order))

    def get(self, ref: ContainerRef) -> LedgerEntry | None:
        return self._entries.get(ref)

    def find(self, namespace: str, pod: str, container: str, pod_uid: str) -> LedgerEntry | None:
        """The entry of this container; an entry with an unknown uid ("") matches any uid,
        an entry of another uid (an older pod of the same name) does not."""
        for e in self._entries.values():
            r = e.ref
            if (r.namespace, r.pod_name, r.container_name) == (namespace, pod, container) and (
                not r.pod_uid or not pod_uid or r.pod_uid == pod_uid
            ):
                return e
        return None

    def pod_entries(self, key: PodKey) -> list[LedgerEntry]:
        return sorted(
            (e for e in self._entries.values() if e.pod_key == key),
            key=lambda e: (e.order, e.ref.container_name),
        )

    def pod_keys(self) -> set[PodKey]:
        return {e.pod_key for e in self._entries.values()}

    def holder_of(self, kind: ResourceKind, unit: str) -> LedgerEntry | None:
        for e in self._entries.values():
            if unit in e.ids(kind):
                return e
        return None

    # -- mutation -----------------------------------------------------------------
    def put(self, entry: LedgerEntry) -> None:
        self._entries[entry.ref] = entry

    def remove(self, ref: ContainerRef) -> LedgerEntry | None:
        return self._entries.pop(ref, None)

    def release_pod(self, key: PodKey) -> list[ContainerRef]:
        refs = sorted(r for r, e in self._entries.items() if e.pod_key == key)
        for r in refs:
            del self._entries[r]
        self.absent_since.pop(key, None)
        return refs

    def next_synthetic_ref(self, kind: ResourceKind) -> ContainerRef:
        self.seq += 1
        return ContainerRef("", f"unattributed-{self.seq}", kind.value)

    # -- accounting ---------------------------------------------------------------
    def reuse_pool(self, entry: LedgerEntry, kind: ResourceKind) -> set[str]:
        """IDs the kubelet will offer ``entry`` for reuse: those of earlier classic init
        containers of its pod, minus those earlier sidecars/app containers took."""
        pool: set[str] = set()
        if entry.order < 0:
            return pool
        for e in self.pod_entries(entry.pod_key):
            if e.order < 0 or e.order >= entry.order or (e.ref.pod_uid != entry.ref.pod_uid):
                continue
            if e.container_kind is ContainerKind.INIT:
                pool |= set(e.ids(kind))
            else:
                pool -= set(e.ids(kind))
        return pool

    def usage(self, inventory: Inventory) -> dict[str, DeviceUsage]:
        out = {d.uuid: DeviceUsage() for d in inventory.devices}
        held: dict[tuple[str, ResourceKind], set[str]] = {}
        reserved: dict[tuple[str, ResourceKind], int] = {}
        for e in self._entries.values():
            for kind in ResourceKind:
                for u in parse_unit_ids(e.ids(kind)):
                    held.setdefault((u.device, kind), set()).add(str(u))
                    if u.device in out:
                        out[u.device].pods.add(e.pod_key)
            for s in e.shares:
                if s.device not in out:
                    continue
                out[s.device].pods.add(e.pod_key)
                if s.exclusive:
                    out[s.device].exclusive_pods.add(e.pod_key)
                for kind in ResourceKind:
                    if e.allocated(kind):
                        continue
                    amount = s.memory_units if kind is ResourceKind.MEMORY else s.cores
                    pool = {u for u in self.reuse_pool(e, kind) if u.startswith(s.device + "::")}
                    need = max(0, amount - len(pool))
                    reserved[(s.device, kind)] = reserved.get((s.device, kind), 0) + need
        for d in inventory.devices:
            du = out[d.uuid]
            if du.exclusive_pods:
                du.memory_used, du.cores_used = d.memory_units, d.cores
                continue
            du.memory_used = len(held.get((d.uuid, ResourceKind.MEMORY), ())) + reserved.get(
                (d.uuid, ResourceKind.MEMORY), 0
            )
            du.cores_used = len(held.get((d.uuid, ResourceKind.CORE), ())) + reserved.get(
                (d.uuid, ResourceKind.CORE), 0
            )
        return out

    # -- persistence --------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "version": LEDGER_VERSION,
                "seq": self.seq,
                "entries": [_entry_to_dict(e) for e in self.entries],
                "absentSince": [
                    {"namespace": k[0], "podName": k[1], "since": v}
                    for k, v in sorted(self.absent_since.items())
                ],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise LedgerError(f"ledger is not JSON: {e}") from e
        if not isinstance(raw, dict):
            raise LedgerError("ledger is not a JSON object")
        version = raw.get("version")
        if version != LEDGER_VERSION:
            raise LedgerError(
                f"ledger version {version!r} is not supported (expected {LEDGER_VERSION!r})"
            )
        led = cls()
        try:
            led.seq = int(raw.get("seq", 0))
            for d in raw.get("entries", []):
                led.put(_entry_from_dict(d))
            for a in raw.get("absentSince", []):
                led.absent_since[(str(a["namespace"]), str(a["podName"]))] = float(a["since"])
        except (KeyError, TypeError, ValueError, AttributeError, AllocationError) as e:
            raise LedgerError(f"ledger entry is malformed: {e!r}") from e
        return led


def _entry_to_dict(e: LedgerEntry) -> dict[str, Any]:
    return {
        "namespace": e.ref.namespace,
        "podName": e.ref.pod_name,
        "containerName": e.ref.container_name,
        "podUid": e.ref.pod_uid,
        "containerKind": e.container_kind.value,
        "order": e.order,
        "request": {"memoryUnits": e.request.memory_units, "cores": e.request.cores},
        "shares": [
            {
                "device": s.device,
                "memoryUnits": s.memory_units,
                "cores": s.cores,
                "exclusive": s.exclusive,
            }
            for s in e.shares
        ],
        "memoryIds": list(e.memory_ids),
        "coreIds": list(e.core_ids),
        "offeredMemoryIds": list(e.offered_memory_ids),
        "offeredCoreIds": list(e.offered_core_ids),
        "source": e.source.value,
        "createdAt": e.created_at,
        "updatedAt": e.updated_at,
    }


def _strs(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"expected a list of strings, got {v!r}")
    return tuple(v)


def _entry_from_dict(d: dict[str, Any]) -> LedgerEntry:
    req = d["request"]
    e = LedgerEntry(
        ref=ContainerRef(
            str(d["namespace"]), str(d["podName"]), str(d["containerName"]), str(d["podUid"])
        ),
        request=ContainerRequest(int(req["memoryUnits"]), int(req["cores"])),
        shares=tuple(
            DeviceShare(
                str(s["device"]), int(s["memoryUnits"]), int(s["cores"]), bool(s["exclusive"])
            )
            for s in d["shares"]
        ),
        source=EntrySource(d["source"]),
        created_at=float(d["createdAt"]),
        updated_at=float(d["updatedAt"]),
        container_kind=ContainerKind(d["containerKind"]),
        order=int(d["order"]),
        memory_ids=_strs(d["memoryIds"]),
        core_ids=_strs(d["coreIds"]),
        offered_memory_ids=_strs(d.get("offeredMemoryIds", [])),
        offered_core_ids=_strs(d.get("offeredCoreIds", [])),
    )
    parse_unit_ids(e.memory_ids, ResourceKind.MEMORY)
    parse_unit_ids(e.core_ids, ResourceKind.CORE)
    return e
