"""The ledger: which container holds (or will hold) which part of which device.

One entry per container. An entry is created by the FIRST kubelet call for a container
(the decision, from the container's full request) and filled in as the kubelet's
Allocate calls arrive. The agent persists ``to_json()`` after every change and rebuilds
with ``Ledger.from_json`` at start; ``AllocationEngine.reconcile`` then corrects it from
PodResources.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from gpu_share.errors import AllocationError, LedgerError
from gpu_share.sharing.ids import device_of, parse_unit_ids, tally_devices, valid_uuid
from gpu_share.sharing.inventory import Inventory
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


class Ledger:
    def __init__(self) -> None:
        self._entries: dict[ContainerRef, LedgerEntry] = {}
        self._by_pod: dict[PodKey, dict[ContainerRef, LedgerEntry]] = {}
        self._sorted: list[LedgerEntry] | None = None  # ``entries``, until a change
        self._usage = _Accounts()  # kept up to date per change (``usage``)
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
            self._usage.add(key, _pod_part(self, pod.values()))
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
        acc = _Accounts()
        for key, pod in self._by_pod.items():
            acc.add(key, _pod_part(self, pod.values()))
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

    # -- persistence --------------------------------------------------------------
    def to_json(self) -> str:
        """The whole ledger (a snapshot); ``journal``: the journal generation whose
        records follow it."""
        return json.dumps(
            {
                "version": LEDGER_VERSION,
                "seq": self.seq,
                "memoryUnitMiB": self.unit_mib,
                "journal": self.journal,
                "entries": [_entry_to_dict(e) for e in self.entries],
                "absentSince": _absent_to_list(self._absent),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        """The ledger ``to_json`` wrote. Anything else raises ``LedgerError`` (reason
        ``LedgerMalformed``, or ``LedgerDuplicateUnit`` when one entry lists a unit
        twice), never another exception: the agent then quarantines the file and
        rebuilds from PodResources."""
        raw = _load_object(text, "ledger")
        version = raw.get("version")
        if version != LEDGER_VERSION:
            raise LedgerError(
                f"ledger version {_show(version)} is not supported (expected "
                f"{LEDGER_VERSION!r})",
                reason=MALFORMED,
            )
        led = cls()
        try:
            led.journal = _int(raw.get("journal", 0), "journal", 0)
            led._apply(raw, "")
        except _Bad as bad:
            raise LedgerError(f"ledger entry is malformed: {bad}", reason=MALFORMED) from bad
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
        record: dict[str, Any] = {"seq": self.seq, "memoryUnitMiB": self.unit_mib}
        record["entries"] = [_entry_to_dict(e) for e in changed.values() if e is not None]
        record["removed"] = [_ref_to_dict(r) for r, e in changed.items() if e is None]
        if absent:
            record["absentSince"] = _absent_to_list(self._absent)
        return json.dumps(record, sort_keys=True)

    def apply_record(self, text: str, where: str) -> None:
        """Replay one ``drain_changes`` record; ``LedgerError`` (LedgerMalformed) when
        it is not one."""
        raw = _load_object(text, where)
        try:
            for i, r in enumerate(_list(raw.get("removed", []), f"{where}.removed")):
                self._set(_ref_from_dict(r, f"{where}.removed[{i}]"), None)
            self._apply(raw, f"{where}.")
        except _Bad as bad:
            raise LedgerError(f"ledger journal is malformed: {bad}", reason=MALFORMED) from bad
        self.drain_changes()

    def _apply(self, raw: dict[str, Any], where: str) -> None:
        """Fields a snapshot and a journal record share; entries replace their ref's."""
        self.seq = _int(raw.get("seq", 0), f"{where}seq", 0)
        self.unit_mib = _int(raw.get("memoryUnitMiB", 0), f"{where}memoryUnitMiB", 0)
        if self.unit_mib > _MAX_UNIT_MIB:
            raise _Bad(f"{where}memoryUnitMiB: {self.unit_mib} is above {_MAX_UNIT_MIB}")
        seen: set[ContainerRef] = set()
        for i, d in enumerate(_list(raw.get("entries", []), f"{where}entries")):
            entry = _entry_from_dict(d, f"{where}entries[{i}]")
            if entry.ref in seen or (not where and self.get(entry.ref) is not None):
                raise _Bad(f"{entry.ref} is listed twice")
            seen.add(entry.ref)
            self.put(entry)
        if "absentSince" in raw or not where:
            self._absent.clear()
        for i, a in enumerate(_list(raw.get("absentSince", []), f"{where}absentSince")):
            at = f"{where}absentSince[{i}]"
            a = _dict(a, at)
            key = (_str(a, "namespace", at), _str(a, "podName", at))
            self._absent[key] = _num(a.get("since"), f"{at}.since")

    def anomalies(self, inventory: Inventory) -> list[LedgerAnomaly]:
        """What a loaded ledger says that cannot be true on this node: a unit held by
        containers of two pods (or by two non-init containers of one pod), an entry on a
        device (or unit) the inventory lacks. Such entries are kept: a unit counts once
        however many entries hold it, unknown devices are never offered, so nothing is
        over-committed; reconcile corrects them from PodResources."""
        out = [*self._shared_units()]
        for e in self.entries:
            out.extend(_unknown_in(e, inventory))
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


@dataclass(frozen=True)
class _PodPart:
    """One pod's contribution to usage: its held units, the devices it is on (held or
    decided), those it holds exclusively, and what its decided kinds reserve."""

    units: tuple[tuple[str, ResourceKind, str], ...]
    devices: frozenset[str]
    exclusive: frozenset[str]
    reserved: tuple[tuple[str, ResourceKind, int], ...]


def _pod_part(ledger: Ledger, entries: Iterable[LedgerEntry]) -> _PodPart:
    units: list[tuple[str, ResourceKind, str]] = []
    devices: set[str] = set()
    exclusive: set[str] = set()
    reserved: list[tuple[str, ResourceKind, int]] = []
    for e in entries:
        for kind in ResourceKind:
            units.extend((device_of(u), kind, u) for u in e.ids(kind))
        devices.update(s.device for s in e.shares)
        exclusive.update(s.device for s in e.shares if s.exclusive)
        reserved.extend(_reserved(ledger, e))
    devices.update(d for d, _k, _u in units)
    return _PodPart(tuple(units), frozenset(devices), frozenset(exclusive), tuple(reserved))


def _reserved(ledger: Ledger, e: LedgerEntry) -> list[tuple[str, ResourceKind, int]]:
    """A decided, not yet allocated kind reserves its share, less the reuse pool the
    kubelet will hand the container on that device."""
    out = []
    for kind in ResourceKind:
        if e.allocated(kind):
            continue
        pool = tally_devices(ledger.reuse_pool(e, kind)) if e.order >= 0 else {}
        for s in e.shares:
            need = max(0, s.amount(kind) - pool.get(s.device, 0))
            if need:
                out.append((s.device, kind, need))
    return out


class _Accounts:
    """Usage summed over pods' parts; a pod's part is taken out and put back whole
    whenever one of its entries changes."""

    def __init__(self) -> None:
        self._parts: dict[PodKey, _PodPart] = {}
        self._held: dict[tuple[str, ResourceKind], dict[str, int]] = {}  # unit -> holders
        self._pods: dict[str, set[PodKey]] = {}
        self._exclusive: dict[str, set[PodKey]] = {}
        self._reserved: dict[tuple[str, ResourceKind], int] = {}

    def add(self, key: PodKey, part: _PodPart) -> None:
        self._parts[key] = part
        for dev, kind, unit in part.units:
            held = self._held.setdefault((dev, kind), {})
            held[unit] = held.get(unit, 0) + 1
        for dev in part.devices:
            self._pods.setdefault(dev, set()).add(key)
        for dev in part.exclusive:
            self._exclusive.setdefault(dev, set()).add(key)
        for dev, kind, n in part.reserved:
            self._reserved[(dev, kind)] = self._reserved.get((dev, kind), 0) + n

    def drop(self, key: PodKey) -> None:
        part = self._parts.pop(key, None)
        if part is None:
            return
        for dev, kind, unit in part.units:
            held = self._held[(dev, kind)]
            held[unit] -= 1
            if not held[unit]:
                del held[unit]
        for dev in part.devices:
            self._pods[dev].discard(key)
        for dev in part.exclusive:
            self._exclusive[dev].discard(key)
        for dev, kind, n in part.reserved:
            self._reserved[(dev, kind)] -= n

    def _used(self, uuid: str, kind: ResourceKind) -> int:
        return len(self._held.get((uuid, kind), ())) + self._reserved.get((uuid, kind), 0)

    def of(self, inventory: Inventory) -> dict[str, DeviceUsage]:
        out = {}
        for d in inventory.devices:
            du = DeviceUsage(
                pods=set(self._pods.get(d.uuid, ())),
                exclusive_pods=set(self._exclusive.get(d.uuid, ())),
            )
            if du.exclusive_pods:
                du.memory_used, du.cores_used = d.memory_units, d.cores
            else:
                du.memory_used, du.cores_used = (
                    self._used(d.uuid, k) for k in (ResourceKind.MEMORY, ResourceKind.CORE)
                )
            out[d.uuid] = du
        return out


MALFORMED = "LedgerMalformed"  # not JSON, wrong version, wrong types, non-canonical ids
DUPLICATE_UNIT = "LedgerDuplicateUnit"  # one unit held twice
UNKNOWN_DEVICE = "LedgerUnknownDevice"  # a device or unit this node does not have


@dataclass(frozen=True)
class LedgerAnomaly:
    reason: str  # DUPLICATE_UNIT or UNKNOWN_DEVICE
    message: str


def _unknown_in(e: LedgerEntry, inventory: Inventory) -> list[LedgerAnomaly]:
    out = []
    for dev in sorted({s.device for s in e.shares} - {d.uuid for d in inventory.devices}):
        out.append(LedgerAnomaly(UNKNOWN_DEVICE, f"{e.ref} has a share of unknown device {dev}"))
    for kind in ResourceKind:
        for u in parse_unit_ids(e.ids(kind), kind):
            if not inventory.contains_unit(u.device, kind, u.index):
                out.append(LedgerAnomaly(UNKNOWN_DEVICE, f"{e.ref} holds unknown unit {u}"))
    return out


def _load_object(text: str, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError, MemoryError) as e:
        # ValueError covers JSONDecodeError and integers over the digit limit.
        raise LedgerError(f"{what} is not JSON: {_short(e)}", reason=MALFORMED) from e
    if not isinstance(raw, dict):
        raise LedgerError(f"{what} is not a JSON object", reason=MALFORMED)
    return raw


def _absent_to_list(absent: Mapping[PodKey, float]) -> list[dict[str, Any]]:
    return [{"namespace": k[0], "podName": k[1], "since": v} for k, v in sorted(absent.items())]


def _ref_to_dict(r: ContainerRef) -> dict[str, str]:
    return {
        "namespace": r.namespace,
        "podName": r.pod_name,
        "containerName": r.container_name,
        "podUid": r.pod_uid,
    }


def _ref_from_dict(v: Any, where: str) -> ContainerRef:
    d = _dict(v, where)
    return ContainerRef(
        _str(d, "namespace", where),
        _str(d, "podName", where),
        _str(d, "containerName", where),
        _str(d, "podUid", where),
    )


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


# Bounds of what a ledger may say: far above anything real, small enough to be cheap.
_MAX_INT = 10**9
_MAX_STR = 253  # Kubernetes names are at most 253 characters
_MAX_LIST = 1_000_000
_MAX_UNIT_MIB = 1024 * 1024  # AgentConfig.memory_unit_mib's upper bound


class _Bad(Exception):
    """A ledger field is missing or of the wrong type/range (becomes LedgerError)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _short(e: BaseException) -> str:
    return _show(f"{type(e).__name__}: {e}")


def _show(v: object, limit: int = 80) -> str:
    """Bounded repr of a value read from the file (never echo it whole)."""
    text = repr(v) if isinstance(v, str | int | float | bool | None) else f"<{type(v).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _Bad(f"{where}: expected an object, got {_show(v)}")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list) or len(v) > _MAX_LIST:
        raise _Bad(f"{where}: expected a list, got {_show(v)}")
    return v


def _int(v: Any, where: str, lo: int) -> int:
    # bool is an int subclass; 1e999 and 2.5 are floats: all refused.
    if type(v) is not int or not lo <= v <= _MAX_INT:
        raise _Bad(f"{where}: expected an integer in [{lo}, {_MAX_INT}], got {_show(v)}")
    return v


def _num(v: Any, where: str) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or abs(v) > 1e12:
        raise _Bad(f"{where}: expected a finite number, got {_show(v)}")
    return float(v)


def _str(d: dict[str, Any], key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or len(v) > _MAX_STR:
        raise _Bad(f"{where}.{key}: expected a string, got {_show(v)}")
    return v


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"{where}: expected true or false, got {_show(v)}")
    return v


_E = TypeVar("_E", bound=StrEnum)


def _enum(cls: type[_E], v: Any, where: str) -> _E:
    if isinstance(v, str):
        for member in cls:
            if member.value == v:
                return member
    raise _Bad(f"{where}: expected one of {[m.value for m in cls]}, got {_show(v)}")


def _ids(d: dict[str, Any], key: str, where: str, kind: ResourceKind) -> tuple[str, ...]:
    """A list of canonical unit ids of ``kind``, none twice."""
    v = _list(d.get(key, []), f"{where}.{key}")
    if not all(isinstance(x, str) for x in v):
        raise _Bad(f"{where}.{key}: expected a list of strings")
    try:
        parse_unit_ids(v, kind)
    except AllocationError as e:
        raise _Bad(f"{where}.{key}: {e.message}") from e
    if len(set(v)) != len(v):
        raise LedgerError(
            f"ledger entry is malformed: {where}.{key} lists a unit twice", reason=DUPLICATE_UNIT
        )
    return tuple(v)


def _share_from_dict(v: Any, where: str) -> DeviceShare:
    s = _dict(v, where)
    device = _str(s, "device", where)
    if not valid_uuid(device):
        raise _Bad(f"{where}.device: not a device uuid: {_show(device)}")
    return DeviceShare(
        device,
        _int(s.get("memoryUnits"), f"{where}.memoryUnits", 0),
        _int(s.get("cores"), f"{where}.cores", 0),
        _bool(s.get("exclusive"), f"{where}.exclusive"),
    )


def _entry_from_dict(v: Any, where: str) -> LedgerEntry:
    d = _dict(v, where)
    req = _dict(d.get("request"), f"{where}.request")
    mem, core = ResourceKind.MEMORY, ResourceKind.CORE
    return LedgerEntry(
        ref=_ref_from_dict(d, where),
        request=ContainerRequest(
            _int(req.get("memoryUnits"), f"{where}.request.memoryUnits", 0),
            _int(req.get("cores"), f"{where}.request.cores", 0),
        ),
        shares=tuple(
            _share_from_dict(s, f"{where}.shares[{i}]")
            for i, s in enumerate(_list(d.get("shares"), f"{where}.shares"))
        ),
        source=_enum(EntrySource, d.get("source"), f"{where}.source"),
        created_at=_num(d.get("createdAt"), f"{where}.createdAt"),
        updated_at=_num(d.get("updatedAt"), f"{where}.updatedAt"),
        container_kind=_enum(ContainerKind, d.get("containerKind"), f"{where}.containerKind"),
        order=_int(d.get("order"), f"{where}.order", -1),
        memory_ids=_ids(d, "memoryIds", where, mem),
        core_ids=_ids(d, "coreIds", where, core),
        offered_memory_ids=_ids(d, "offeredMemoryIds", where, mem),
        offered_core_ids=_ids(d, "offeredCoreIds", where, core),
    )
