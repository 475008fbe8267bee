"""Fake device IDs that encode the physical device.

The kubelet only sees opaque IDs, one per unit: ``<uuid>::mem::<i>`` for a memory unit
and ``<uuid>::core::<i>`` for one percent of a device's cores (``i`` from 0). Any ID
names its device, so placement can be checked from the IDs alone.

Only the exact ASCII form the agent advertises is accepted: ``uuid`` from
``[A-Za-z0-9._/-]`` (at most ``MAX_UUID_LEN`` characters), ``i`` in
ASCII ``[0-9]`` without leading zeros and at most ``MAX_INDEX_DIGITS`` digits. Anything
else (other scripts' or full-width digits, superscripts, a 5,000-digit index, a 1 MB
id) is refused with a message that never echoes more than ``SHOWN_CHARS`` characters of
the input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from gpu_share.errors import AllocationError, AllocationReason
from gpu_share.sharing.model import ResourceKind

SEPARATOR = "::"
_TAG = {ResourceKind.MEMORY: "mem", ResourceKind.CORE: "core"}
_KIND_OF_TAG = {tag: kind for kind, tag in _TAG.items()}

MAX_UUID_LEN = 128
MAX_INDEX_DIGITS = 9  # far above any real unit count; keeps int() trivially cheap
MAX_ID_LEN = MAX_UUID_LEN + len("::core::") + MAX_INDEX_DIGITS
SHOWN_CHARS = 80  # of tenant-/kubelet-supplied text in an error message

# Explicit ASCII classes: ``\d`` and str.isdigit() accept other scripts' digits.
_UUID_RE = re.compile(r"[A-Za-z0-9._/-]+")
_ID_RE = re.compile(r"([A-Za-z0-9._/-]+)::(mem|core)::(0|[1-9][0-9]*)")

REASON_BAD_ID = AllocationReason.UNKNOWN_DEVICE


def show(s: object, limit: int = SHOWN_CHARS) -> str:
    """``repr`` of at most ``limit`` characters of ``s`` (never unbounded input)."""
    if not isinstance(s, str):
        return f"<{type(s).__name__}>"
    text = repr(s[:limit])
    if len(text) <= limit + 2 and len(s) <= limit:
        return text
    # Escapes can make the repr ten times longer than the characters it shows.
    return f"{text[:limit + 2]}... ({len(s)} chars)"


@dataclass(frozen=True, order=True)
class UnitId:
    device: str
    kind: ResourceKind
    index: int

    def __str__(self) -> str:
        return unit_id(self.device, self.kind, self.index)


def valid_uuid(uuid: object) -> bool:
    return (
        isinstance(uuid, str)
        and len(uuid) <= MAX_UUID_LEN
        and _UUID_RE.fullmatch(uuid) is not None
    )


def unit_id(uuid: str, kind: ResourceKind, i: int) -> str:
    if not valid_uuid(uuid):
        raise AllocationError(f"device uuid {show(uuid)} cannot be encoded", reason=REASON_BAD_ID)
    if i < 0 or len(str(i)) > MAX_INDEX_DIGITS:
        raise AllocationError(f"unit index {i} is out of range", reason=REASON_BAD_ID)
    return f"{uuid}{SEPARATOR}{_TAG[kind]}{SEPARATOR}{i}"


def parse_unit_id(s: str) -> UnitId:
    """Raises AllocationError(reason="UnknownDevice") naming (a bounded part of) ``s``
    unless it is exactly the canonical form ``unit_id`` produces."""
    if not isinstance(s, str) or len(s) > MAX_ID_LEN:
        raise AllocationError(f"device id {show(s)} is not one of ours", reason=REASON_BAD_ID)
    m = _ID_RE.fullmatch(s)
    if m is None:
        raise AllocationError(f"device id {show(s)} is not one of ours", reason=REASON_BAD_ID)
    uuid, tag, raw = m.groups()
    if len(uuid) > MAX_UUID_LEN or len(raw) > MAX_INDEX_DIGITS:
        raise AllocationError(f"device id {show(s)} is not one of ours", reason=REASON_BAD_ID)
    return UnitId(uuid, _KIND_OF_TAG[tag], int(raw))


def parse_unit_ids(ids: Iterable[str], kind: ResourceKind | None = None) -> list[UnitId]:
    """Parse all ``ids``; with ``kind``, each must be a unit of that kind."""
    out: list[UnitId] = []
    for s in ids:
        u = parse_unit_id(s)
        if kind is not None and u.kind is not kind:
            raise AllocationError(
                f"device id {show(s)} is a {u.kind.value} unit, expected {kind.value}",
                reason=REASON_BAD_ID,
            )
        out.append(u)
    return out


def group_by_device(ids: Iterable[str]) -> dict[str, list[UnitId]]:
    """Parsed ids per device uuid; units sorted by index, devices in first-seen order."""
    out: dict[str, list[UnitId]] = {}
    for u in parse_unit_ids(ids):
        out.setdefault(u.device, []).append(u)
    for units in out.values():
        units.sort()
    return out


def devices_of(ids: Iterable[str]) -> set[str]:
    return {u.device for u in parse_unit_ids(ids)}


def count_by_device(ids: Iterable[str]) -> dict[str, int]:
    return {d: len(us) for d, us in group_by_device(ids).items()}


def device_of(unit: str) -> str:
    """The device uuid of an id already known to be canonical (held, offered, or listed
    after ``parse_unit_ids``): a split, no validation (the per-call hot path)."""
    return unit.partition(SEPARATOR)[0]


def tally_devices(ids: Iterable[str]) -> dict[str, int]:
    """How many of the (canonical) ``ids`` are on each device, in first-seen order."""
    if isinstance(ids, Listed):
        return ids.tally()
    out: dict[str, int] = {}
    for unit in ids:
        d = device_of(unit)
        out[d] = out.get(d, 0) + 1
    return out


@dataclass(frozen=True)
class UnitTable:
    """Every id of one kind on a node's devices, built once per inventory: checking and
    grouping the kubelet's 2,560-id lists becomes set operations instead of parsing."""

    kind: ResourceKind
    order: Mapping[str, tuple[str, ...]]  # device -> its ids by index
    members: Mapping[str, frozenset[str]]  # device -> its ids
    every: frozenset[str]

    @staticmethod
    def build(kind: ResourceKind, totals: Mapping[str, int]) -> UnitTable:
        order = {d: tuple(unit_id(d, kind, i) for i in range(n)) for d, n in totals.items()}
        members = {d: frozenset(ids) for d, ids in order.items()}
        return UnitTable(kind, order, members, frozenset().union(*members.values()))


class Listed(tuple[str, ...]):
    """The kubelet's ``available`` ids, already checked against a ``UnitTable`` (no
    duplicates): per-device counts and ids come from the table, not from parsing."""

    table: UnitTable
    members: frozenset[str]

    def __new__(cls, ids: Iterable[str], table: UnitTable) -> Listed:
        self = super().__new__(cls, ids)
        self.table = table
        self.members = frozenset(self)
        return self

    def tally(self) -> dict[str, int]:
        out = {d: len(m.intersection(self.members)) for d, m in self.table.members.items()}
        return {d: n for d, n in out.items() if n}

    def on(self, device: str) -> Iterator[str]:
        """The listed ids of ``device``, lowest index first."""
        members = self.members
        return (u for u in self.table.order.get(device, ()) if u in members)
