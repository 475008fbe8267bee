"""Checks of what the kubelet and pod specs send, before and after a decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpu_share.errors import AllocationError
from gpu_share.errors import AllocationReason as R
from gpu_share.sharing.ids import Listed, UnitId, count_by_device, device_of, parse_unit_ids
from gpu_share.sharing.inventory import CORES_PER_DEVICE, Inventory
from gpu_share.sharing.model import ContainerRef, ContainerRequest, ResourceKind
from gpu_share.sharing.node.ledger import Ledger, LedgerEntry


def check_request(req: ContainerRequest, ref: ContainerRef | None, who: str) -> None:
    def bad(msg: str) -> AllocationError:
        return AllocationError(f"{who}: {msg}", reason=R.INVALID_REQUEST, ref=ref)

    if req.memory_units < 0 or req.cores < 0:
        raise bad(f"negative request {req}")
    if req.empty:
        raise bad("requests none of our resources")
    if req.cores > CORES_PER_DEVICE and req.cores % CORES_PER_DEVICE:
        raise bad(
            f"{req.cores} cores is more than one device but not a multiple of "
            f"{CORES_PER_DEVICE}"
        )


def _invalid(msg: str) -> AllocationError:
    return AllocationError(msg, reason=R.INVALID_REQUEST)


def check_id_count(inventory: Inventory, kind: ResourceKind, ids: Sequence[str], what: str) -> None:
    """More ids than we advertise units of ``kind`` cannot be a kubelet call: refuse
    before parsing them."""
    limit = sum(d.total(kind) for d in inventory.devices)
    if len(ids) > limit:
        raise _invalid(f"{what} names {len(ids)} {kind.value} ids; this node advertises {limit}")


def check_units(inventory: Inventory, kind: ResourceKind, ids: Sequence[str]) -> None:
    """Every id is a unit of ``kind`` this node has (unhealthy devices included)."""
    for u in parse_unit_ids(ids, kind):
        _check_unit(inventory, u)


def _check_unit(inventory: Inventory, u: UnitId) -> None:
    if not inventory.contains_unit(u.device, u.kind, u.index):
        inventory.require(u.device)  # UnknownDevice naming the device, when it is that
        raise AllocationError(
            f"device {u.device} has no {u.kind.value} unit {u.index}", reason=R.UNKNOWN_DEVICE
        )


def check_preferred(
    inventory: Inventory,
    kind: ResourceKind,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> Listed:
    """The GetPreferredAllocation arguments, checked; returns ``available`` without
    duplicates."""
    if size <= 0:
        raise _invalid(f"allocation size must be positive, got {size}")
    check_id_count(inventory, kind, available, "available")
    check_id_count(inventory, kind, must_include, "must_include")
    parse_unit_ids(must_include, kind)
    avail = listed(inventory, kind, available)
    if len(must_include) > size:
        raise _invalid(f"must_include names {len(must_include)} ids but only {size} are requested")
    if size > len(avail):
        raise _invalid(f"{size} {kind.value} units requested but only {len(avail)} are available")
    missing = sorted(set(must_include) - avail.members)
    if missing:
        raise _invalid(f"must_include ids not in available: {missing[:3]}")
    return avail


def listed(inventory: Inventory, kind: ResourceKind, available: Sequence[str]) -> Listed:
    """``available`` checked like ``check_units`` (same error for the first bad id), by
    set membership in the inventory's ids instead of parsing each one."""
    table = inventory.units(kind)
    try:
        unique = dict.fromkeys(available)
    except TypeError:  # an unhashable element: the parser names it
        check_units(inventory, kind, available)
        raise
    bad = unique.keys() - table.every
    if bad:
        check_units(inventory, kind, [s for s in available if s in bad])
    return Listed(unique, table)


def check_allocate(inventory: Inventory, kind: ResourceKind, ids: Sequence[str]) -> None:
    if not ids:
        raise _invalid("Allocate named no device ids")
    check_id_count(inventory, kind, ids, "Allocate")
    if len(set(ids)) != len(ids):
        raise _invalid("Allocate named a device id twice")
    for u in parse_unit_ids(ids, kind):
        _check_unit(inventory, u)
        if not inventory.require(u.device).healthy:
            raise AllocationError(f"device {u.device} is unhealthy", reason=R.DEVICE_UNHEALTHY)


def check_allocated(
    e: LedgerEntry, kind: ResourceKind, ids: Sequence[str], inventory: Inventory, ledger: Ledger
) -> LedgerEntry:
    """What the kubelet allocated must match the decision and conflict with no one; an
    exclusive decision's memory shares become what was allocated on each device."""
    by_dev = count_by_device(ids)
    _check_devices(e, kind, ids, by_dev)
    usage = ledger.usage(inventory)
    for d in by_dev:
        others = usage[d].exclusive_pods - {e.pod_key}
        if others:
            raise _err(
                e, R.EXCLUSIVE_CONFLICT, f"device {d} is held exclusively by {sorted(others)[0]}"
            )
        if e.exclusive:
            _check_sole_holder(e, d, ledger)
    if e.exclusive and kind is ResourceKind.MEMORY:
        return replace(
            e, shares=tuple(replace(s, memory_units=by_dev.get(s.device, 0)) for s in e.shares)
        )
    return e


def _err(e: LedgerEntry, reason: R, msg: str) -> AllocationError:
    return AllocationError(f"{e.ref}: {msg}", reason=reason, ref=e.known_ref)


def _check_devices(
    e: LedgerEntry, kind: ResourceKind, ids: Sequence[str], by_dev: dict[str, int]
) -> None:
    devices = set(e.devices)
    if not e.exclusive and len(by_dev) > 1:
        raise _err(
            e,
            R.SPLIT_ACROSS_DEVICES,
            f"{kind.value} ids span devices {sorted(by_dev)}; one container needs one device",
        )
    if not set(by_dev) <= devices:
        raise _err(
            e,
            R.DECISION_MISMATCH,
            f"decided device(s) {sorted(devices)}, kubelet allocated {kind.value} units on "
            f"{sorted(set(by_dev) - devices)}",
        )
    want = e.request.amount(kind)
    if len(ids) != want:
        raise _err(
            e,
            R.DECISION_MISMATCH,
            f"decision has {want} {kind.value} units, kubelet allocated {len(ids)}",
        )


def _check_sole_holder(e: LedgerEntry, device: str, ledger: Ledger) -> None:
    other_holders = {
        h.pod_key
        for h in ledger.entries
        for k in ResourceKind
        if h.pod_key != e.pod_key and any(device_of(x) == device for x in h.ids(k))
    }
    if other_holders:
        raise _err(
            e,
            R.EXCLUSIVE_CONFLICT,
            f"device {device} must be exclusive but {sorted(other_holders)[0]} holds part of it",
        )
