"""The ledger: which container holds (or will hold) which part of which device.

One entry per container. An entry is created by the FIRST kubelet call for a container
(the decision, from the container's full request) and filled in as the kubelet's
Allocate calls arrive. The agent persists ``to_json()`` after every change and rebuilds
with ``Ledger.from_json`` at start; ``AllocationEngine.reconcile`` then corrects it from
PodResources.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ResourceKind,
)
from gpu_share.sharing.node import ledger_codec as codec
from gpu_share.sharing.node.ledger_codec import (
    DUPLICATE_UNIT,
    MALFORMED,
    UNKNOWN_DEVICE,
    LedgerAnomaly,
    unknown_in,
)
from gpu_share.sharing.node.ledger_entry import (
    LEDGER_VERSION,
    DeviceUsage,
    EntrySource,
    EntryState,
    LedgerEntry,
    PodKey,
)
from gpu_share.sharing.node.ledger_usage import Accounts, pod_part

__all__ = [
    "DUPLICATE_UNIT", "LEDGER_VERSION", "MALFORMED", "UNKNOWN_DEVICE", "DeviceUsage",
    "EntrySource", "EntryState", "Ledger", "LedgerAnomaly", "LedgerEntry", "PodKey",
]


class Ledger:
    def __init__(self) -> None:
        self._entries: dict[ContainerRef, LedgerEntry] = {}
        self._by_pod: dict[PodKey, dict[ContainerRef, LedgerEntry]] = {}
        self._sorted: list[LedgerEntry] | None = None  # ``entries``, until a change
        self._usage = Accounts()  # kept up to date per change (``usage``)
        # Open offers (offered, not yet allocated) by kind and ids, for Allocate's lookup.
        self._offers: dict[tuple[ResourceKind, frozenset[str]], set[ContainerRef]] = {}
        self._absent: dict[PodKey, float] = {}
        # What changed since the last ``drain_changes`` (the agent's journal record).
        self._changed: dict[ContainerRef, LedgerEntry | None] = {}
        self._absent_changed = False
        self.seq = 0  # for synthetic refs of degraded entries
        self._unit_mib = 0
        # Journal generation a snapshot (``to_json``) is followed by (agent.state).
        self.journal = 0

    @property
    def unit_mib(self) -> int:
        """Memory unit size (MiB) the entries' memory ids and amounts are counted in; 0:
        unknown (written by an agent that did not record it)."""
        return self._unit_mib

    @unit_mib.setter
    def unit_mib(self, value: int) -> None:
        if value != self._unit_mib:
            self._unit_mib = value
            self._absent_changed = True  # a record is due (it carries the unit)

    @property
    def absent_since(self) -> dict[PodKey, float]:
        """Read it; change it through ``absent_for`` / ``mark_present`` (journaled)."""
        return self._absent

    # -- lookup -------------------------------------------------------------------
    @property
    def entries(self) -> list[LedgerEntry]:
        if self._sorted is None:
            self._sorted = sorted(self._entries.values(), key=lambda e: (e.ref, e.order))
        return list(self._sorted)

    def unordered(self) -> Iterable[LedgerEntry]:
        """The entries in no particular order (no sort: for scans whose result is
        ordered afterwards). Do not change the ledger while iterating."""
        return self._entries.values()

    def get(self, ref: ContainerRef) -> LedgerEntry | None:
        return self._entries.get(ref)

    def find(self, namespace: str, pod: str, container: str, pod_uid: str) -> LedgerEntry | None:
        """The entry of this container; an entry with an unknown uid ("") matches any uid,
        an entry of another uid (an older pod of the same name) does not."""
        for e in self._by_pod.get((namespace, pod), {}).values():
            r = e.ref
            if r.container_name == container and (
                not r.pod_uid or not pod_uid or r.pod_uid == pod_uid
            ):
                return e
        return None

    def pod_entries(self, key: PodKey) -> list[LedgerEntry]:
        return sorted(
            self._by_pod.get(key, {}).values(), key=lambda e: (e.order, e.ref.container_name)
        )

    def pod_keys(self) -> set[PodKey]:
        return set(self._by_pod)

    def holder_of(self, kind: ResourceKind, unit: str) -> LedgerEntry | None:
        for e in self._entries.values():
            if unit in e.ids(kind):
                return e
        return None

    def offered_to_others(self, kind: ResourceKind, ref: ContainerRef) -> frozenset[str]:
        """Ids of ``kind`` open offers of other containers name (not yet allocated)."""
        return frozenset(
            u
            for e in self._entries.values()
            if e.ref != ref and not e.allocated(kind)
            for u in e.offered(kind)
        )

    # -- mutation -----------------------------------------------------------------
    def put(self, entry: LedgerEntry) -> None:
        self._set(entry.ref, entry)

    def remove(self, ref: ContainerRef) -> LedgerEntry | None:
        old = self._entries.get(ref)
        if old is not None:
            self._set(ref, None)
        return old

    def release_pod(self, key: PodKey) -> list[ContainerRef]:
        refs = sorted(self._by_pod.get(key, {}))
        for r in refs:
            self._set(r, None)
        self.mark_present(key)
        return refs

    def _set(self, ref: ContainerRef, entry: LedgerEntry | None) -> None:
        """The one place entries change: indexes, usage and the change set follow."""
        key = (ref.namespace, ref.pod_name)
        self._usage.drop(key)
        self._index_offers(self._entries.get(ref), add=False)
        self._index_offers(entry, add=True)
        pod = self._by_pod.setdefault(key, {})
        if entry is None:
            self._entries.pop(ref, None)
            pod.pop(ref, None)
        else:
            self._entries[ref] = entry
            pod[ref] = entry
        if pod:
            self._usage.add(key, pod_part(self, pod.values()))
        else:
            del self._by_pod[key]
        self._sorted = None
        self._changed[ref] = entry

    def _index_offers(self, e: LedgerEntry | None, *, add: bool) -> None:
        for kind in ResourceKind if e is not None else ():
            assert e is not None
            if e.allocated(kind) or not e.offered(kind):
                continue
            key = (kind, frozenset(e.offered(kind)))
            refs = self._offers.setdefault(key, set())
            if add:
                refs.add(e.ref)
            else:
                refs.discard(e.ref)
                if not refs:
                    del self._offers[key]

    def open_offer(self, kind: ResourceKind, ids: Iterable[str]) -> LedgerEntry | None:
        """The entry whose open offer of ``kind`` is exactly ``ids`` (the first in
        ``entries`` order when several are)."""
        refs = self._offers.get((kind, frozenset(ids)))
        if not refs:
            return None
        return min((self._entries[r] for r in refs), key=lambda e: (e.ref, e.order))

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
        """Per device: units held (a unit counts once however many entries hold it) plus
        reservations of decided kinds; a device held exclusively is wholly used. Kept up
        to date per change, not recounted from every entry per call."""
        return self._usage.of(inventory)

    def recount_usage(self, inventory: Inventory) -> dict[str, DeviceUsage]:
        """``usage`` counted from scratch over every entry (tests hold the two equal)."""
        acc = Accounts()
        for key, pod in self._by_pod.items():
            acc.add(key, pod_part(self, pod.values()))
        return acc.of(inventory)

    # -- absence (pods the kubelet no longer lists) -------------------------------
    def mark_present(self, key: PodKey) -> None:
        if self._absent.pop(key, None) is not None:
            self._absent_changed = True

    def absent_for(self, key: PodKey, now: float) -> float:
        """Seconds since ``key`` was first seen absent (0 the first time)."""
        if key not in self._absent:
            self._absent[key] = now
            self._absent_changed = True
        return now - self._absent[key]

    def set_absent_since(self, key: PodKey, since: float) -> None:
        self._absent[key] = since
        self._absent_changed = True

    # -- persistence (the format: ledger_codec.py) ---------------------------------
    def to_json(self) -> str:
        """The whole ledger (a snapshot); ``journal``: the journal generation whose
        records follow it."""
        return codec.snapshot_json(self.seq, self.unit_mib, self.journal, self.entries,
                                   self._absent)

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        """The ledger ``to_json`` wrote. Anything else raises ``LedgerError`` (reason
        ``LedgerMalformed``, or ``LedgerDuplicateUnit`` when one entry lists a unit
        twice), never another exception: the agent then quarantines the file and
        rebuilds from PodResources."""
        doc = codec.read_snapshot(text)
        led = cls()
        led.journal = doc.journal
        led._load(doc)
        led.drain_changes()  # what was read is not a change
        return led

    def drain_changes(self) -> str | None:
        """One journal record (a JSON line, no newline) of what changed since the last
        call; None when nothing did. Replaying the records in order over the snapshot
        (``apply_record``) gives this ledger back."""
        changed, self._changed = self._changed, {}
        absent, self._absent_changed = self._absent_changed, False
        if not changed and not absent:
            return None
        return codec.record_json(self.seq, self.unit_mib, changed,
                                 self._absent if absent else None)

    def apply_record(self, text: str, where: str) -> None:
        """Replay one ``drain_changes`` record; ``LedgerError`` (LedgerMalformed) when
        it is not one."""
        doc = codec.read_record(text, where)
        for ref in doc.removed:
            self._set(ref, None)
        self._load(doc)
        self.drain_changes()

    def _load(self, doc: codec.LedgerDoc) -> None:
        """Fields a snapshot and a journal record share; entries replace their ref's."""
        self.seq, self.unit_mib = doc.seq, doc.unit_mib
        for entry in doc.entries:
            self.put(entry)
        if doc.absent is not None:
            self._absent = dict(doc.absent)

    def anomalies(self, inventory: Inventory) -> list[LedgerAnomaly]:
        """What a loaded ledger says that cannot be true on this node: a unit held by
        containers of two pods (or by two non-init containers of one pod), an entry on a
        device (or unit) the inventory lacks. Such entries are kept: a unit counts once
        however many entries hold it, unknown devices are never offered, so nothing is
        over-committed; reconcile corrects them from PodResources."""
        out = [*self._shared_units()]
        for e in self.entries:
            out.extend(unknown_in(e, inventory))
        return out

    def _shared_units(self) -> list[LedgerAnomaly]:
        holders: dict[tuple[ResourceKind, str], list[LedgerEntry]] = {}
        for e in self.entries:
            for kind in ResourceKind:
                for u in e.ids(kind):
                    holders.setdefault((kind, u), []).append(e)
        out = []
        for (_kind, unit), es in sorted(holders.items()):
            pods = {(e.pod_key, e.ref.pod_uid) for e in es}
            apps = [e for e in es if e.container_kind is not ContainerKind.INIT]
            # Reuse: a pod's init containers hand their units to its later containers.
            if len(pods) > 1 or len(apps) > 1:
                who = ", ".join(str(e.ref) for e in es[:3])
                out.append(
                    LedgerAnomaly(DUPLICATE_UNIT, f"unit {unit} is held by {len(es)} "
                                  f"containers ({who})")
                )
        return out
