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
from collections.abc import Iterable
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


_IDS = PerKind("memory_ids", "core_ids")
_OFFERED = PerKind("offered_memory_ids", "offered_core_ids")


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
        self.absent_since: dict[PodKey, float] = {}
        self.seq = 0  # for synthetic refs of degraded entries
        # Memory unit size (MiB) the entries' memory ids and amounts are counted in; 0:
        # unknown (written by an agent that did not record it).
        self.unit_mib = 0

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
            _count_held(e, out, held)
            _count_shares(e, out)
            self._count_reserved(e, out, reserved)
        for d in inventory.devices:
            du = out[d.uuid]
            if du.exclusive_pods:
                du.memory_used, du.cores_used = d.memory_units, d.cores
                continue
            du.memory_used, du.cores_used = _used(d.uuid, held, reserved).values()
        return out

    def _count_reserved(
        self,
        e: LedgerEntry,
        out: dict[str, DeviceUsage],
        reserved: dict[tuple[str, ResourceKind], int],
    ) -> None:
        """A decided, not yet allocated kind reserves its share, less the reuse pool the
        kubelet will hand the container on that device."""
        for kind in ResourceKind:
            if e.allocated(kind):
                continue
            pool = tally_devices(self.reuse_pool(e, kind))
            for s in e.shares:
                if s.device in out:
                    key = (s.device, kind)
                    need = max(0, s.amount(kind) - pool.get(s.device, 0))
                    reserved[key] = reserved.get(key, 0) + need

    # -- absence (pods the kubelet no longer lists) -------------------------------
    def mark_present(self, key: PodKey) -> None:
        self.absent_since.pop(key, None)

    def absent_for(self, key: PodKey, now: float) -> float:
        """Seconds since ``key`` was first seen absent (0 the first time)."""
        return now - self.absent_since.setdefault(key, now)

    # -- persistence --------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "version": LEDGER_VERSION,
                "seq": self.seq,
                "memoryUnitMiB": self.unit_mib,
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
        """The ledger ``to_json`` wrote. Anything else raises ``LedgerError`` (reason
        ``LedgerMalformed``, or ``LedgerDuplicateUnit`` when one entry lists a unit
        twice), never another exception: the agent then quarantines the file and
        rebuilds from PodResources."""
        try:
            raw = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError, MemoryError) as e:
            # ValueError covers JSONDecodeError and integers over the digit limit.
            raise LedgerError(f"ledger is not JSON: {_short(e)}", reason=MALFORMED) from e
        if not isinstance(raw, dict):
            raise LedgerError("ledger is not a JSON object", reason=MALFORMED)
        version = raw.get("version")
        if version != LEDGER_VERSION:
            raise LedgerError(
                f"ledger version {_show(version)} is not supported (expected "
                f"{LEDGER_VERSION!r})",
                reason=MALFORMED,
            )
        led = cls()
        try:
            led.seq = _int(raw.get("seq", 0), "seq", 0)
            led.unit_mib = _int(raw.get("memoryUnitMiB", 0), "memoryUnitMiB", 0)
            if led.unit_mib > _MAX_UNIT_MIB:
                raise _Bad(f"memoryUnitMiB: {led.unit_mib} is above {_MAX_UNIT_MIB}")
            for i, d in enumerate(_list(raw.get("entries", []), "entries")):
                entry = _entry_from_dict(d, f"entries[{i}]")
                if led.get(entry.ref) is not None:
                    raise _Bad(f"{entry.ref} is listed twice")
                led.put(entry)
            for i, a in enumerate(_list(raw.get("absentSince", []), "absentSince")):
                where = f"absentSince[{i}]"
                a = _dict(a, where)
                key = (_str(a, "namespace", where), _str(a, "podName", where))
                led.absent_since[key] = _num(a.get("since"), f"{where}.since")
        except _Bad as bad:
            raise LedgerError(f"ledger entry is malformed: {bad}", reason=MALFORMED) from bad
        return led

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


def _count_held(
    e: LedgerEntry, out: dict[str, DeviceUsage], held: dict[tuple[str, ResourceKind], set[str]]
) -> None:
    # A unit counts once however many entries hold it (init-container reuse).
    for kind in ResourceKind:
        for unit in e.ids(kind):
            dev = device_of(unit)
            held.setdefault((dev, kind), set()).add(unit)
            if dev in out:
                out[dev].pods.add(e.pod_key)


def _used(
    uuid: str,
    held: dict[tuple[str, ResourceKind], set[str]],
    reserved: dict[tuple[str, ResourceKind], int],
) -> PerKind[int]:
    return PerKind.build(lambda k: len(held.get((uuid, k), ())) + reserved.get((uuid, k), 0))


def _count_shares(e: LedgerEntry, out: dict[str, DeviceUsage]) -> None:
    for s in e.shares:
        if s.device in out:
            out[s.device].pods.add(e.pod_key)
            if s.exclusive:
                out[s.device].exclusive_pods.add(e.pod_key)


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
        ref=ContainerRef(
            _str(d, "namespace", where),
            _str(d, "podName", where),
            _str(d, "containerName", where),
            _str(d, "podUid", where),
        ),
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
