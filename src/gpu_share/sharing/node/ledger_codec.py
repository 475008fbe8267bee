"""The ledger's file format: entries to and from JSON, the one reader of the ledger
snapshot and journal records (untrusted: a corrupt file raises LedgerError, never another
exception), and what a loaded ledger may say that cannot be true on this node."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, model_validator

from gpu_share.errors import AllocationError, LedgerError
from gpu_share.sharing.ids import parse_unit_ids, valid_uuid
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    ResourceKind,
    camel_fields,
)
from gpu_share.sharing.node.ledger_entry import (
    LEDGER_VERSION,
    EntrySource,
    LedgerEntry,
    PodKey,
)
from gpu_share.sharing.untrusted import (
    BY_VALUE,
    MAX_COUNT,
    MAX_ITEMS,
    MAX_NAME,
    Count,
    Document,
    Instant,
    Name,
    read_json,
    shown,
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


def _absent_to_list(absent: Mapping[PodKey, float]) -> list[dict[str, Any]]:
    return [{"namespace": k[0], "podName": k[1], "since": v} for k, v in sorted(absent.items())]


def _ref_to_dict(r: ContainerRef) -> dict[str, str]:
    return camel_fields(r, "namespace", "pod_name", "container_name", "pod_uid")


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


_MAX_UNIT_MIB = 1024 * 1024  # AgentConfig.memory_unit_mib's upper bound
_Ids = Annotated[list[Annotated[str, Field(max_length=MAX_NAME)]], Field(max_length=MAX_ITEMS)]


class _Ref(Document):
    namespace: Name
    pod_name: Name = Field(alias="podName")
    container_name: Name = Field(alias="containerName")
    pod_uid: Name = Field(alias="podUid")

    def ref(self) -> ContainerRef:
        return ContainerRef(self.namespace, self.pod_name, self.container_name, self.pod_uid)


class _Request(Document):
    memory_units: Count = Field(alias="memoryUnits")
    cores: Count


class _Share(Document):
    device: Name
    memory_units: Count = Field(alias="memoryUnits")
    cores: Count
    exclusive: bool


class _Entry(_Ref):
    container_kind: Annotated[ContainerKind, BY_VALUE] = Field(alias="containerKind")
    order: Annotated[int, Field(ge=-1, le=MAX_COUNT)]
    request: _Request
    shares: Annotated[list[_Share], Field(max_length=MAX_ITEMS)]
    memory_ids: _Ids = Field(default_factory=list, alias="memoryIds")
    core_ids: _Ids = Field(default_factory=list, alias="coreIds")
    offered_memory_ids: _Ids = Field(default_factory=list, alias="offeredMemoryIds")
    offered_core_ids: _Ids = Field(default_factory=list, alias="offeredCoreIds")
    source: Annotated[EntrySource, BY_VALUE]
    created_at: Instant = Field(alias="createdAt")
    updated_at: Instant = Field(alias="updatedAt")


class _Absent(Document):
    namespace: Name
    pod_name: Name = Field(alias="podName")
    since: Instant


class _Fields(Document):
    """What a snapshot and a journal record both say."""

    seq: Count = 0
    unit_mib: Annotated[int, Field(ge=0, le=_MAX_UNIT_MIB)] = Field(
        default=0, alias="memoryUnitMiB")
    entries: Annotated[list[_Entry], Field(max_length=MAX_ITEMS)] = Field(
        default_factory=list)
    # A record without it leaves the absent pods as they were (model_fields_set).
    absent_since: Annotated[list[_Absent], Field(max_length=MAX_ITEMS)] = Field(
        default_factory=list, alias="absentSince")


class _Snapshot(_Fields):
    journal: Count = 0

    @model_validator(mode="before")
    @classmethod
    def _version_first(cls, raw: Any) -> Any:
        # An older or newer file is named as such, before its fields are judged.
        version = raw.get("version") if isinstance(raw, dict) else None
        if isinstance(raw, dict) and version != LEDGER_VERSION:
            raise ValueError(f"version {shown(version)} is not supported "
                             f"(expected {LEDGER_VERSION!r})")
        return raw


class _Record(_Fields):
    removed: Annotated[list[_Ref], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)


def _malformed(message: str) -> LedgerError:
    return LedgerError(message, reason=MALFORMED)


def _ids(ids: list[str], where: str, kind: ResourceKind) -> tuple[str, ...]:
    """Canonical unit ids of ``kind``, none twice."""
    try:
        parse_unit_ids(ids, kind)
    except AllocationError as e:
        raise _malformed(f"ledger entry is malformed: {where}: {e.message}") from e
    if len(set(ids)) != len(ids):
        raise LedgerError(
            f"ledger entry is malformed: {where} lists a unit twice", reason=DUPLICATE_UNIT
        )
    return tuple(ids)


def _share(s: _Share, where: str) -> DeviceShare:
    if not valid_uuid(s.device):
        raise _malformed(f"ledger entry is malformed: {where}.device: not a device uuid: "
                         f"{shown(s.device)}")
    return DeviceShare(s.device, s.memory_units, s.cores, s.exclusive)


def _entry(d: _Entry, where: str) -> LedgerEntry:
    mem, core = ResourceKind.MEMORY, ResourceKind.CORE
    return LedgerEntry(
        ref=d.ref(),
        request=ContainerRequest(d.request.memory_units, d.request.cores),
        shares=tuple(_share(s, f"{where}.shares.{i}") for i, s in enumerate(d.shares)),
        source=d.source,
        created_at=d.created_at,
        updated_at=d.updated_at,
        container_kind=d.container_kind,
        order=d.order,
        memory_ids=_ids(d.memory_ids, f"{where}.memoryIds", mem),
        core_ids=_ids(d.core_ids, f"{where}.coreIds", core),
        offered_memory_ids=_ids(d.offered_memory_ids, f"{where}.offeredMemoryIds", mem),
        offered_core_ids=_ids(d.offered_core_ids, f"{where}.offeredCoreIds", core),
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
    doc = read_json(_Snapshot, text, "ledger", lambda m: _malformed(f"malformed {m}"))
    return _doc(doc, "", journal=doc.journal)


def read_record(text: str, where: str) -> LedgerDoc:
    doc = read_json(_Record, text, where, lambda m: _malformed(f"malformed {m}"))
    return _doc(doc, f"{where}.", removed=tuple(r.ref() for r in doc.removed))


def _doc(doc: _Fields, where: str, *, journal: int = 0,
         removed: tuple[ContainerRef, ...] = ()) -> LedgerDoc:
    entries: dict[ContainerRef, LedgerEntry] = {}
    for i, d in enumerate(doc.entries):
        entry = _entry(d, f"{where}entries.{i}")
        if entry.ref in entries:
            raise _malformed(f"ledger entry is malformed: {entry.ref} is listed twice")
        entries[entry.ref] = entry
    absent: dict[PodKey, float] | None = None
    if "absent_since" in doc.model_fields_set or not where:
        absent = {(a.namespace, a.pod_name): a.since for a in doc.absent_since}
    return LedgerDoc(doc.seq, doc.unit_mib, tuple(entries.values()), absent, removed, journal)
