"""Device choice for one container's decision: shared (one device) or exclusive
(whole devices), and extending a single-device decision by the other kind.

Inputs are the container's full request, the ids the caller forces (``must_include``,
reuse pools), and optionally the extender's ``pinned`` devices. See docs/allocation.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpu_share.errors import AllocationError
from gpu_share.errors import AllocationReason as R
from gpu_share.sharing.ids import parse_unit_ids
from gpu_share.sharing.inventory import CORES_PER_DEVICE, DeviceCapacity, Inventory
from gpu_share.sharing.model import DeviceShare, ResourceKind
from gpu_share.sharing.node.device_policy import DeviceState, PlacementPolicy, choose_whole_devices
from gpu_share.sharing.node.freeview import FreeView
from gpu_share.sharing.node.ledger import Ledger, LedgerEntry


def _err(e: LedgerEntry, reason: R, msg: str) -> AllocationError:
    return AllocationError(f"{e.ref}: {msg}", reason=reason, ref=e.known_ref)


def _dedup(devices: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(devices))


def decide(
    e: LedgerEntry,
    kind: ResourceKind,
    available: Sequence[str],
    must_include: Sequence[str],
    inventory: Inventory,
    ledger: Ledger,
    policy: PlacementPolicy,
    pinned: Sequence[str] | None = None,
) -> tuple[DeviceShare, ...]:
    """The container's device(s). ``pinned``: only these devices (the extender's
    decision); NoFit when they cannot hold it."""
    forced = _dedup([u.device for u in parse_unit_ids(must_include)])
    if pinned:
        _check_pinned(e, pinned, forced, inventory)
    view = FreeView.of(inventory, ledger, e, kind, available)
    forced = _with_pool_devices(e, view, forced)
    healthy = inventory.offered()  # healthy and not cordoned
    if e.request.cores >= CORES_PER_DEVICE:
        return decide_exclusive(e, view, _whole_forced(e, forced, pinned), healthy)
    return decide_shared(e, view, _one_forced(e, forced, pinned), healthy, policy)


def _check_pinned(
    e: LedgerEntry, pinned: Sequence[str], forced: Sequence[str], inventory: Inventory
) -> None:
    unknown = [p for p in pinned if inventory.get(p) is None]
    if unknown:
        raise _err(e, R.UNKNOWN_DEVICE, f"decision names unknown devices {unknown}")
    if e.request.cores < CORES_PER_DEVICE and len(pinned) != 1:
        raise _err(e, R.SPLIT_ACROSS_DEVICES, f"decision names {len(pinned)} devices")
    if any(f not in pinned for f in forced):
        raise _err(e, R.DECISION_MISMATCH, f"reused ids are not on {list(pinned)}")


def _with_pool_devices(e: LedgerEntry, view: FreeView, forced: list[str]) -> list[str]:
    """The kubelet will hand the container pooled ids of every kind it requests (later
    calls, without asking us): their device must be part of the decision."""
    for k in ResourceKind:
        pool_devs = view.pool_devices(k)
        if e.request.amount(k) > 0 and len(pool_devs) == 1:
            forced = _dedup([*forced, *pool_devs])
    return forced


def _whole_forced(e: LedgerEntry, forced: list[str], pinned: Sequence[str] | None) -> list[str]:
    if not pinned:
        return forced
    if len(pinned) != e.request.cores // CORES_PER_DEVICE:
        raise _err(
            e,
            R.DECISION_MISMATCH,
            f"decision names {len(pinned)} devices for {e.request.cores} cores",
        )
    return _dedup([*forced, *pinned])


def _one_forced(e: LedgerEntry, forced: list[str], pinned: Sequence[str] | None) -> str | None:
    if pinned:
        forced = [pinned[0]]
    if len(forced) > 1:
        raise _err(
            e,
            R.SPLIT_ACROSS_DEVICES,
            f"reused ids span devices {forced}; one container needs one device",
        )
    return forced[0] if forced else None


def decide_shared(
    e: LedgerEntry,
    view: FreeView,
    forced: str | None,
    healthy: Sequence[DeviceCapacity],
    policy: PlacementPolicy,
) -> tuple[DeviceShare, ...]:
    """One device with room for the whole request (``forced``: that device only)."""
    req = e.request
    states, best_mem, best_core = _fitting(e, view, forced, healthy)
    # Prefer devices the pod's reuse pool is on: the kubelet may hand any pooled ids.
    pool_devs = view.pool_devices()
    chosen = policy.choose(
        [s for s in states if s.uuid in pool_devs] or states, req.memory_units, req.cores
    )
    if chosen is None:
        where = f"device {forced} (holding reused ids)" if forced else "no single device"
        raise _err(
            e,
            R.NO_FIT,
            f"{where} has {req.memory_units} free memory units and {req.cores} free cores; "
            f"largest free block is {best_mem} memory units / {best_core} cores",
        )
    return (DeviceShare(chosen.uuid, req.memory_units, req.cores, False),)


def _fitting(
    e: LedgerEntry, view: FreeView, forced: str | None, healthy: Sequence[DeviceCapacity]
) -> tuple[list[DeviceState], int, int]:
    """Devices that fit, and the largest free memory and cores seen (for the error)."""
    req = e.request
    states: list[DeviceState] = []
    best_mem, best_core = 0, 0
    for d in healthy:
        if view.blocked(d.uuid):
            continue
        st = view.state(d)
        best_mem = max(best_mem, st.memory_free)
        best_core = max(best_core, st.cores_free)
        if forced is not None and d.uuid != forced:
            continue
        if st.memory_free >= req.memory_units and st.cores_free >= req.cores:
            states.append(st)
    return states, best_mem, best_core


def decide_exclusive(
    e: LedgerEntry, view: FreeView, forced: list[str], healthy: Sequence[DeviceCapacity]
) -> tuple[DeviceShare, ...]:
    """``cores // 100`` wholly free devices, ``forced`` among them, one NUMA node if
    possible; memory units fill the first device before the next."""
    req = e.request
    n = req.cores // CORES_PER_DEVICE
    free = [
        DeviceState(d.uuid, d.index, d.numa_node, d.memory_units, d.memory_units, d.cores,
                    d.cores)
        for d in healthy
        if view.wholly_free(d.uuid)
    ]
    free_ids = {s.uuid for s in free}
    bad = [f for f in forced if f not in free_ids]
    if bad or len(forced) > n:
        raise _err(
            e,
            R.EXCLUSIVE_CONFLICT if bad else R.SPLIT_ACROSS_DEVICES,
            f"reused ids on {forced} cannot all be part of {n} whole device(s)",
        )
    extra = _extra_devices(free, forced, n)
    if extra is None:
        raise _err(
            e, R.NO_FIT, f"{req.cores} cores need {n} wholly free healthy devices; "
            f"{len(free)} are free",
        )
    chosen = [view.inventory.require(u) for u in [*forced, *(s.uuid for s in extra)]]
    chosen.sort(key=lambda d: d.index)
    total_mem = sum(d.memory_units for d in chosen)
    if req.memory_units > total_mem:
        raise _err(
            e, R.NO_FIT, f"{req.memory_units} memory units exceed the {total_mem} of "
            f"{n} whole device(s)",
        )
    # Memory ids fill the first device before the next: if an app container later
    # reuses some of them, the kubelet's pick then stays on one device.
    shares = []
    left = req.memory_units
    for d in chosen:
        take = min(d.memory_units, left)
        shares.append(DeviceShare(d.uuid, take, CORES_PER_DEVICE, True))
        left -= take
    return tuple(shares)


def _extra_devices(
    free: list[DeviceState], forced: list[str], n: int
) -> list[DeviceState] | None:
    """Devices to add to ``forced``, on the forced devices' NUMA node when it has room."""
    rest = [s for s in free if s.uuid not in forced]
    numa = {s.numa_node for s in free if s.uuid in forced}
    if len(numa) == 1:
        same = [s for s in rest if s.numa_node in numa]
        if len(same) >= n - len(forced):
            rest = same
    return choose_whole_devices(rest, n - len(forced)) if n > len(forced) else []


def extend(
    e: LedgerEntry,
    kind: ResourceKind,
    amount: int,
    available: Sequence[str],
    inventory: Inventory,
    ledger: Ledger,
    now: float,
) -> LedgerEntry:
    """Add ``amount`` of ``kind`` to a single-device decision (pairing/adoption)."""
    if (
        len(e.shares) != 1
        or e.exclusive
        or (kind is ResourceKind.CORE and amount >= CORES_PER_DEVICE)
    ):
        raise _err(e, R.NO_FIT, f"cannot add {amount} {kind.value} units to its decision")
    s = e.shares[0]
    free = FreeView.of(inventory, ledger, e, kind, available).free_for_extend(s.device, kind)
    if free < amount:
        raise _err(
            e, R.NO_FIT, f"device {s.device} has only {free} free {kind.value} units, "
            f"{amount} needed",
        )
    return replace(
        e,
        shares=(s.with_amount(kind, amount),),
        request=e.request.with_amount(kind, amount),
        updated_at=now,
    )
