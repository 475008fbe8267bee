"""A ResourceClaim allocated from our ResourceSlice, read as device shares (DRA mode).

Pure: the agent (``agent/dra/claims.py``) reads the claim from the API server and writes
the CDI spec built here. What the claim says is the scheduler's allocation
(``status.allocation.devices``): one result per allocated device share of any driver;
ours are named ``gpu-<index>`` in the pool of this node and carry the capacity they
consume (``consumedCapacity``: ``memory`` in bytes, ``cores`` in percent, KEP-5075).
The opaque ``SliceConfig`` of our driver may pick the enforcement mode of the claim.

Every refusal is a ``ClaimError`` whose message is bounded (values are cut) and names
what to fix. The contract (devices, capacities, config) is docs/dra.md's and the
ResourceSlice publisher's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_share.config.model import EnforcementMode
from gpu_share.sharing.dra.config import ClaimConfig, claim_config
from gpu_share.sharing.dra.reading import (
    ClaimError,
    ClaimReason,
    read_items,
    read_mapping,
    read_quantity,
    read_text,
    shown,
)
from gpu_share.sharing.inventory import CORES_PER_DEVICE, DeviceCapacity, Inventory
from gpu_share.sharing.model import ContainerRequest, DeviceShare
from gpu_share.sharing.node.limits import STRENGTH
from gpu_share.sharing.quantity import MIB

MEMORY_CAPACITY = "memory"
CORES_CAPACITY = "cores"
# The API server allows 32 results and 32 configs per claim; more is not a real claim.
MAX_RESULTS = 64
MAX_CONFIGS = 64
DEVICE_NAME = re.compile(r"gpu-(0|[1-9][0-9]{0,5})\Z", re.ASCII)
# A claim UID becomes part of file and CDI device names: a CDI name, bounded.
CLAIM_UID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9])?\Z", re.ASCII)


@dataclass(frozen=True)
class ClaimDevice:
    """One of our devices in the claim: its slice name, the requests it serves and the
    share they consume together."""

    name: str  # gpu-<index>
    requests: tuple[str, ...]
    share: DeviceShare
    index: int


@dataclass(frozen=True)
class ParsedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[ClaimDevice, ...]  # index order
    config: ClaimConfig = field(default_factory=ClaimConfig)  # its configs of our driver

    @property
    def enforcement(self) -> EnforcementMode | None:
        """The mode its configs name (None: the pool's)."""
        return self.config.enforcement

    @property
    def class_enforcement(self) -> EnforcementMode | None:
        """The mode the admin's configs (source FromClass) alone name: the floor a
        tenant's own config may not go below (``enforcement_for``)."""
        return self.config.class_enforcement

    @property
    def request(self) -> ContainerRequest:
        """The claim as one container's request (the response builder's input)."""
        shares = [d.share for d in self.devices]
        return ContainerRequest(
            memory_units=sum(s.memory_units for s in shares), cores=sum(s.cores for s in shares)
        )

    @property
    def shares(self) -> tuple[DeviceShare, ...]:
        return tuple(d.share for d in self.devices)


def over_capacity(
    held: Iterable[DeviceShare], new: Sequence[DeviceShare], inventory: Inventory
) -> str | None:
    """Why ``new`` on top of the shares ``held`` on this node would over-commit one of
    its devices (or hold an exclusive device twice), or None."""
    held = list(held)
    for share in new:
        mine = [h for h in held if h.device == share.device]
        why = _device_over(share, mine, inventory.get(share.device))
        if why is not None:
            return why
    return None


def _device_over(
    share: DeviceShare, mine: Sequence[DeviceShare], dev: DeviceCapacity | None
) -> str | None:
    if dev is None:
        return f"device {share.device} is not on this node"
    name = f"gpu-{dev.index}"
    if mine and (share.exclusive or any(h.exclusive for h in mine)):
        return f"{name} is held whole by another prepared claim, or this claim wants it whole"
    memory = share.memory_units + sum(h.memory_units for h in mine)
    cores = share.cores + sum(h.cores for h in mine)
    if memory > dev.memory_units or cores > dev.cores:
        return (
            f"{name} would hold {memory}/{dev.memory_units} memory units and "
            f"{cores}/{dev.cores} cores with the claims prepared on it"
        )
    return None


# ---- capacities ---------------------------------------------------------------------------


def memory_units(value: object, unit_mib: int, total: int, what: str) -> int:
    """Bytes -> whole memory units, 1..total; a part of a unit is refused."""
    units = read_quantity(value, what) / (unit_mib * MIB)
    if units.denominator != 1:
        raise ClaimError(
            f"{what} {shown(value)} is not a whole number of {unit_mib} MiB memory units",
            ClaimReason.BAD_CAPACITY,
        )
    if not 1 <= units <= total:
        raise ClaimError(
            f"{what} {shown(value)} is {units} memory units; the device has 1..{total}",
            ClaimReason.BAD_CAPACITY,
        )
    return int(units)


def cores(value: object, what: str) -> int:
    """Percent of one device's cores, a whole number 0..100."""
    q = read_quantity(value, what)
    if q.denominator != 1 or not 0 <= q <= CORES_PER_DEVICE:
        raise ClaimError(
            f"{what} {shown(value)} is not a whole number of cores 0..{CORES_PER_DEVICE}",
            ClaimReason.BAD_CAPACITY,
        )
    return int(q)


def _consumed(result: Mapping[str, Any], dev: DeviceCapacity, unit_mib: int,
              where: str) -> tuple[int, int]:
    """(memory units, cores) a result consumes. Without ``consumedCapacity`` the device
    was allocated whole (no consumable capacity): all of it."""
    consumed = result.get("consumedCapacity")
    if consumed is None:
        return dev.memory_units, CORES_PER_DEVICE
    consumed = read_mapping(consumed, f"{where}.consumedCapacity")
    unknown = sorted(set(consumed) - {MEMORY_CAPACITY, CORES_CAPACITY})
    if unknown:
        raise ClaimError(f"{where}.consumedCapacity names unknown capacities "
                         f"{shown(unknown)}", ClaimReason.BAD_CAPACITY)
    units = dev.memory_units  # the slice's request policy: no memory asked = all of it
    if MEMORY_CAPACITY in consumed:
        units = memory_units(consumed[MEMORY_CAPACITY], unit_mib, dev.memory_units,
                             f"{where}.consumedCapacity.memory")
    c = 0
    if CORES_CAPACITY in consumed:
        c = cores(consumed[CORES_CAPACITY], f"{where}.consumedCapacity.cores")
    return units, c


# ---- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Result:
    request: str
    device: DeviceCapacity
    name: str
    memory_units: int
    cores: int


def _device(name: str, inventory: Inventory, where: str) -> DeviceCapacity:
    m = DEVICE_NAME.match(name)
    index = int(m.group(1)) if m else -1
    dev = next((d for d in inventory.devices if d.index == index), None)
    if dev is None:
        raise ClaimError(f"{where}: device {shown(name)} is not on this node",
                         ClaimReason.UNKNOWN_DEVICE)
    if not dev.healthy:
        raise ClaimError(f"{where}: device {name} ({dev.uuid}) is unhealthy",
                         ClaimReason.DEVICE_UNHEALTHY)
    if inventory.is_cordoned(dev.uuid):  # whatever the DRADeviceTaints gate did
        raise ClaimError(f"{where}: device {name} ({dev.uuid}) is cordoned: no new slice "
                         "lands on it", ClaimReason.DEVICE_CORDONED)
    return dev


def _result(raw: object, n: int, pool: str, inventory: Inventory) -> _Result:
    where = f"status.allocation.devices.results[{n}]"
    r = read_mapping(raw, where)
    request = read_text(r.get("request"), f"{where}.request")
    if r.get("pool") != pool:
        raise ClaimError(f"{where}: pool {shown(r.get('pool'))} is not this node's "
                         f"({shown(pool)})", ClaimReason.WRONG_POOL)
    name = read_text(r.get("device"), f"{where}.device")
    dev = _device(name, inventory, where)
    units, c = _consumed(r, dev, inventory.unit_mib, where)
    return _Result(request, dev, name, units, c)


def _merge(results: Iterable[_Result]) -> tuple[ClaimDevice, ...]:
    """One ClaimDevice per device (a claim may hold several shares of one device)."""
    by_name: dict[str, list[_Result]] = {}
    for r in results:
        by_name.setdefault(r.name, []).append(r)
    out = []
    for name, rs in by_name.items():
        dev = rs[0].device
        units, c = sum(r.memory_units for r in rs), sum(r.cores for r in rs)
        if units > dev.memory_units or c > CORES_PER_DEVICE:
            raise ClaimError(f"the claim's shares of {name} add up to {units} memory units "
                             f"and {c} cores, over the device's {dev.memory_units} and "
                             f"{CORES_PER_DEVICE}", ClaimReason.BAD_CAPACITY)
        exclusive = c == CORES_PER_DEVICE and units == dev.memory_units
        share = DeviceShare(dev.uuid, units, c, exclusive=exclusive)
        requests = tuple(sorted({r.request for r in rs}))
        out.append(ClaimDevice(name, requests, share, dev.index))
    return tuple(sorted(out, key=lambda d: d.index))


# ---- the claim ----------------------------------------------------------------------------


def _metadata(obj: Mapping[str, Any], uid: str) -> tuple[str, str]:
    meta = read_mapping(obj.get("metadata"), "metadata")
    if meta.get("uid") != uid:
        raise ClaimError(f"the claim's uid {shown(meta.get('uid'))} is not the kubelet's "
                         f"{shown(uid)} (deleted and created again?)",
                         ClaimReason.UID_MISMATCH)
    return (read_text(meta.get("namespace"), "metadata.namespace"),
            read_text(meta.get("name"), "metadata.name"))


def _allocation(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if allocation is None:
        raise ClaimError("the claim is not allocated (no status.allocation)",
                         ClaimReason.NOT_ALLOCATED)
    alloc = read_mapping(allocation, "status.allocation")
    return read_mapping(alloc.get("devices", {}), "status.allocation.devices")


def parse_claim(
    obj: object, *, uid: str, driver: str, pool: str, inventory: Inventory
) -> ParsedClaim:
    """``obj`` (a ResourceClaim as JSON) -> our devices in it. Raises ClaimError."""
    if not CLAIM_UID.match(uid):
        raise ClaimError(f"claim uid {shown(uid)} is not a valid name", ClaimReason.MALFORMED)
    claim = read_mapping(obj, "the claim")
    namespace, name = _metadata(claim, uid)
    devices = _allocation(claim)
    results = read_items(devices.get("results"), "status.allocation.devices.results", MAX_RESULTS)
    ours = [
        _result(r, n, pool, inventory)
        for n, r in enumerate(results)
        if isinstance(r, Mapping) and r.get("driver") == driver
    ]
    if not ours:
        raise ClaimError(f"no device of driver {driver} is allocated to the claim",
                         ClaimReason.NOT_ALLOCATED)
    configs = read_items(devices.get("config"), "status.allocation.devices.config", MAX_CONFIGS)
    config = claim_config(configs, driver, sorted({r.request for r in ours}))
    return ParsedClaim(uid, namespace, name, _merge(ours), config)



def enforcement_for(claim: ParsedClaim, pool: EnforcementMode) -> EnforcementMode:
    """The mode the claim is prepared with: its class's (else the pool's), or a stronger
    one its own config names. A weaker one is refused (``ENFORCEMENT_LOWERED``); that
    the node can enforce a raised mode is the caller's check."""
    floor = claim.class_enforcement or pool
    mode = claim.enforcement or floor
    if STRENGTH[mode] < STRENGTH[floor]:
        raise ClaimError(f"the claim's config asks enforcement {mode.value!r}, below the "
                         f"{floor.value!r} in force: a claim may raise it, never lower it",
                         ClaimReason.ENFORCEMENT_LOWERED)
    return mode


def memory_cap_mib(claim: ParsedClaim, mode: EnforcementMode, unit_mib: int,
                   inventory: Inventory) -> int | None:
    """The hard memory limit (MiB) of a claim whose config names a ``memoryLimit`` above
    the memory it claims (the guaranteed part, which placement counted); None: what it
    claims is its limit. Only driver-enforced limits can let a slice burst (the hook's
    one env names one size: a claim of one device)."""
    limit = claim.config.memory_limit
    if limit is None:
        return None
    if len(claim.devices) != 1:
        raise ClaimError("memoryLimit applies to a claim of one device, not "
                         f"{len(claim.devices)}", ClaimReason.BAD_CONFIG)
    share = claim.devices[0].share
    dev = inventory.get(share.device)
    claimed, cap = share.memory_units * unit_mib, int(limit // MIB)
    total = dev.memory_units * unit_mib if dev is not None else claimed
    if not claimed <= cap <= total:
        raise ClaimError(f"memoryLimit {cap} MiB is outside the {claimed} MiB claimed .. "
                         f"the device's {total} MiB", ClaimReason.BAD_CONFIG)
    if cap == claimed:
        return None
    if mode is not EnforcementMode.NVIDIA_MEMORY_LIMITS:
        raise ClaimError(f"a memoryLimit above the memory claimed needs enforcement "
                         f"'nvidia-memory-limits'; in force here: {mode.value!r}",
                         ClaimReason.ENFORCEMENT_UNAVAILABLE)
    return cap
