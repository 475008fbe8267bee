"""The ledger's file format: entries to and from JSON, the one reader of the ledger
snapshot and journal records (untrusted: a corrupt file raises LedgerError, never another
exception), and what a loaded ledger may say that cannot be true on this node."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from gpu_share.errors import AllocationError, LedgerError
from gpu_share.sharing.ids import parse_unit_ids, valid_uuid
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    ResourceKind,
)
from gpu_share.sharing.node.ledger_entry import (
    LEDGER_VERSION,
    EntrySource,
    LedgerEntry,
    PodKey,
)

MALFORMED = "LedgerMalformed"  # not JSON, wrong version, wrong types, non-canonical ids
DUPLICATE_UNIT = "LedgerDuplicateUnit"  # one unit held twice
UNKNOWN_DEVICE = "LedgerUnknownDevice"  # a device or unit this node does not have


@dataclass(frozen=True)
class LedgerAnomaly:
    reason: str  # DUPLICATE_UNIT or UNKNOWN_DEVICE
    message: str


def unknown_in(e: LedgerEntry, inventory: Inventory) -> list[LedgerAnomaly]:
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


@dataclass(frozen=True)
class LedgerDoc:
    """What a snapshot or a journal record says. ``absent``: None when a record leaves
    the absent pods as they were (a snapshot always says them)."""

    seq: int
    unit_mib: int
    entries: tuple[LedgerEntry, ...]
    absent: dict[PodKey, float] | None
    removed: tuple[ContainerRef, ...] = ()
    journal: int = 0


def snapshot_json(seq: int, unit_mib: int, journal: int, entries: Iterable[LedgerEntry],
                  absent: Mapping[PodKey, float]) -> str:
    return json.dumps(
        {
            "version": LEDGER_VERSION,
            "seq": seq,
            "memoryUnitMiB": unit_mib,
            "journal": journal,
            "entries": [_entry_to_dict(e) for e in entries],
            "absentSince": _absent_to_list(absent),
        },
        sort_keys=True,
    )


def record_json(seq: int, unit_mib: int, changed: Mapping[ContainerRef, LedgerEntry | None],
                absent: Mapping[PodKey, float] | None) -> str:
    record: dict[str, Any] = {"seq": seq, "memoryUnitMiB": unit_mib}
    record["entries"] = [_entry_to_dict(e) for e in changed.values() if e is not None]
    record["removed"] = [_ref_to_dict(r) for r, e in changed.items() if e is None]
    if absent is not None:
        record["absentSince"] = _absent_to_list(absent)
    return json.dumps(record, sort_keys=True)


def read_snapshot(text: str) -> LedgerDoc:
    raw = _load_object(text, "ledger")
    version = raw.get("version")
    if version != LEDGER_VERSION:
        raise LedgerError(
            f"ledger version {_show(version)} is not supported (expected {LEDGER_VERSION!r})",
            reason=MALFORMED,
        )
    try:
        return _fields(raw, "", journal=_int(raw.get("journal", 0), "journal", 0))
    except _Bad as bad:
        raise LedgerError(f"ledger entry is malformed: {bad}", reason=MALFORMED) from bad


def read_record(text: str, where: str) -> LedgerDoc:
    raw = _load_object(text, where)
    try:
        removed = tuple(_ref_from_dict(r, f"{where}.removed[{i}]")
                        for i, r in enumerate(_list(raw.get("removed", []), f"{where}.removed")))
        return _fields(raw, f"{where}.", removed=removed)
    except _Bad as bad:
        raise LedgerError(f"ledger journal is malformed: {bad}", reason=MALFORMED) from bad


def _fields(raw: dict[str, Any], where: str, *, journal: int = 0,
            removed: tuple[ContainerRef, ...] = ()) -> LedgerDoc:
    seq = _int(raw.get("seq", 0), f"{where}seq", 0)
    unit_mib = _int(raw.get("memoryUnitMiB", 0), f"{where}memoryUnitMiB", 0)
    if unit_mib > _MAX_UNIT_MIB:
        raise _Bad(f"{where}memoryUnitMiB: {unit_mib} is above {_MAX_UNIT_MIB}")
    entries: dict[ContainerRef, LedgerEntry] = {}
    for i, d in enumerate(_list(raw.get("entries", []), f"{where}entries")):
        entry = _entry_from_dict(d, f"{where}entries[{i}]")
        if entry.ref in entries:
            raise _Bad(f"{entry.ref} is listed twice")
        entries[entry.ref] = entry
    absent: dict[PodKey, float] | None = None
    if "absentSince" in raw or not where:
        absent = {}
    for i, a in enumerate(_list(raw.get("absentSince", []), f"{where}absentSince")):
        at = f"{where}absentSince[{i}]"
        a = _dict(a, at)
        absent_key = (_str(a, "namespace", at), _str(a, "podName", at))
        assert absent is not None
        absent[absent_key] = _num(a.get("since"), f"{at}.since")
    return LedgerDoc(seq, unit_mib, tuple(entries.values()), absent, removed, journal)
