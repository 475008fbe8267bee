"""A ResourceClaim allocated from our ResourceSlice, read as device shares (DRA mode).

Pure: the agent (``agent/dra_claims.py``) reads the claim from the API server and writes
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
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

from gpu_share.config.model import EnforcementMode
from gpu_share.errors import GpuShareError
from gpu_share.sharing.inventory import CORES_PER_DEVICE, DeviceCapacity, Inventory
from gpu_share.sharing.model import ContainerRequest, DeviceShare
from gpu_share.sharing.quantity import MIB, QuantityError, parse_quantity

SLICE_CONFIG_KIND = "SliceConfig"
SLICE_CONFIG_VERSION = "v1alpha1"
SLICE_CONFIG_FIELDS = frozenset({"apiVersion", "kind", "enforcement"})
MEMORY_CAPACITY = "memory"
CORES_CAPACITY = "cores"
# The API server allows 32 results and 32 configs per claim; more is not a real claim.
MAX_RESULTS = 64
MAX_CONFIGS = 64
MAX_CONFIG_REQUESTS = 64
MAX_SHOWN_CHARS = 60
_MODES = tuple(m.value for m in EnforcementMode)  # a tuple: compared, never hashed
DEVICE_NAME = re.compile(r"gpu-(0|[1-9][0-9]{0,5})\Z", re.ASCII)
# A claim UID becomes part of file and CDI device names: a CDI name, bounded.
CLAIM_UID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9])?\Z", re.ASCII)


class ClaimReason(StrEnum):
    """Why a claim cannot be prepared (``ClaimError.reason``)."""

    MALFORMED = "ClaimMalformed"
    UID_MISMATCH = "ClaimUIDMismatch"
    NOT_ALLOCATED = "ClaimNotAllocated"
    WRONG_POOL = "ClaimWrongPool"
    UNKNOWN_DEVICE = "UnknownDevice"
    DEVICE_UNHEALTHY = "DeviceUnhealthy"
    DEVICE_CORDONED = "DeviceCordoned"
    # The node cannot enforce its pool's mode now (agent/enforcement.py).
    ENFORCEMENT_UNAVAILABLE = "EnforcementUnavailable"
    # The claim's own config names a weaker mode than its class or pool.
    ENFORCEMENT_LOWERED = "ClaimEnforcementLowered"
    BAD_CAPACITY = "ClaimBadCapacity"
    BAD_CONFIG = "ClaimBadConfig"
    # With the claims already prepared on this node, a device would be over-committed
    # (an allocation the scheduler should never make: a forged or stale claim status).
    OVER_CAPACITY = "ClaimOverCapacity"


class ClaimError(GpuShareError):
    """A claim this node cannot prepare (reasons: ``ClaimReason``)."""

    reason = ClaimReason.MALFORMED.value
    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, reason: ClaimReason) -> None:
        super().__init__(message, reason=reason.value)


def shown(value: object) -> str:
    """``repr(value)``, cut: messages never echo unbounded input."""
    text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} characters)"


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
    enforcement: EnforcementMode | None  # None: the pool's
    # The mode the admin's configs (the DeviceClass's, source FromClass) alone name: the
    # floor a tenant's own config may not go below (``enforcement_for``).
    class_enforcement: EnforcementMode | None = None

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


# ---- JSON shape helpers -------------------------------------------------------------------


def _malformed(what: str, value: object) -> ClaimError:
    return ClaimError(f"{what} is malformed: {shown(value)}", ClaimReason.MALFORMED)


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _malformed(what, value)
    return value


def _items(value: object, what: str, limit: int) -> Sequence[Any]:
    """A list (absent: empty) of at most ``limit`` items."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _malformed(what, value)
    if len(value) > limit:
        raise ClaimError(f"{what} has {len(value)} entries, at most {limit}",
                         ClaimReason.MALFORMED)
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise _malformed(what, value)
    return value


# ---- capacities ---------------------------------------------------------------------------


def _quantity(value: object, what: str) -> Fraction:
    # The API server serialises every quantity as a string.
    if not isinstance(value, str):
        raise ClaimError(f"{what} is not a quantity: {shown(value)}", ClaimReason.BAD_CAPACITY)
    try:
        return parse_quantity(value)
    except QuantityError as e:
        raise ClaimError(f"{what}: {e}", ClaimReason.BAD_CAPACITY) from None


def memory_units(value: object, unit_mib: int, total: int, what: str) -> int:
    """Bytes -> whole memory units, 1..total; a part of a unit is refused."""
    units = _quantity(value, what) / (unit_mib * MIB)
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
    q = _quantity(value, what)
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
    consumed = _mapping(consumed, f"{where}.consumedCapacity")
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
    r = _mapping(raw, where)
    request = _text(r.get("request"), f"{where}.request")
    if r.get("pool") != pool:
        raise ClaimError(f"{where}: pool {shown(r.get('pool'))} is not this node's "
                         f"({shown(pool)})", ClaimReason.WRONG_POOL)
    name = _text(r.get("device"), f"{where}.device")
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


# ---- opaque config ------------------------------------------------------------------------


def _slice_config(params: object, driver: str, where: str) -> EnforcementMode | None:
    """The enforcement a SliceConfig names (None: none named)."""
    p = _mapping(params, f"{where}.opaque.parameters")
    unknown = sorted(str(k) for k in set(p) - SLICE_CONFIG_FIELDS)
    version = f"{driver}/{SLICE_CONFIG_VERSION}"
    problem = ""
    if unknown:
        problem = f"unknown fields {shown(unknown)}"
    elif p.get("apiVersion", version) != version:
        problem = f"apiVersion {shown(p.get('apiVersion'))} is not {version}"
    elif p.get("kind", SLICE_CONFIG_KIND) != SLICE_CONFIG_KIND:
        problem = f"kind {shown(p.get('kind'))} is not {SLICE_CONFIG_KIND}"
    elif "enforcement" in p and p["enforcement"] not in _MODES:
        problem = (f"enforcement {shown(p['enforcement'])} is not one of "
                   + ", ".join(m.value for m in EnforcementMode))
    if problem:
        raise ClaimError(f"{where}: {problem}", ClaimReason.BAD_CONFIG)
    value = p.get("enforcement")
    return EnforcementMode(value) if isinstance(value, str) else None


def _config_entry(
    raw: object, n: int, driver: str
) -> tuple[tuple[str, ...], EnforcementMode | None, bool] | None:
    """(request names, enforcement, from the class) of one config entry of our driver;
    None otherwise. Only ``source: FromClass`` is the admin's; anything else is the
    tenant's."""
    where = f"status.allocation.devices.config[{n}]"
    c = _mapping(raw, where)
    opaque = c.get("opaque")
    if opaque is None:
        return None
    opaque = _mapping(opaque, f"{where}.opaque")
    if opaque.get("driver") != driver:
        return None
    names = _items(c.get("requests"), f"{where}.requests", MAX_CONFIG_REQUESTS)
    requests = tuple(_text(r, f"{where}.requests[]") for r in names)
    return (requests, _slice_config(opaque.get("parameters"), driver, where),
            c.get("source") == "FromClass")


def _applies(requests: tuple[str, ...], request: str) -> bool:
    # A config naming "r" applies to r's subrequests ("r/<sub>") too; none named: all.
    main = request.partition("/")[0]
    return not requests or request in requests or main in requests


def _enforcement(configs: Sequence[Any], driver: str,
                 requests: Iterable[str]) -> tuple[EnforcementMode | None, EnforcementMode | None]:
    """The claim's one enforcement mode (per request, the last config of ours that names
    one wins: class configs come first, then the claim's), and the one its class's
    configs alone name."""
    entries = [e for n, raw in enumerate(configs) if (e := _config_entry(raw, n, driver))]
    requests = list(requests)
    admin = [(names, mode) for names, mode, by_class in entries if by_class]
    return (_one_mode([(n, m) for n, m, _ in entries], requests),
            _one_mode(admin, requests))


def _one_mode(entries: Sequence[tuple[tuple[str, ...], EnforcementMode | None]],
              requests: Sequence[str]) -> EnforcementMode | None:
    chosen: dict[str, EnforcementMode | None] = {}
    for request in requests:
        chosen[request] = None
        for names, mode in entries:
            if mode is not None and _applies(names, request):
                chosen[request] = mode
    modes = set(chosen.values())
    if len(modes) > 1:
        shown_modes = sorted(m.value if m else "(the pool's)" for m in modes)
        raise ClaimError("the claim's requests name different enforcement modes "
                         f"({', '.join(shown_modes)}); one claim has one",
                         ClaimReason.BAD_CONFIG)
    return next(iter(modes), None)


# ---- the claim ----------------------------------------------------------------------------


def _metadata(obj: Mapping[str, Any], uid: str) -> tuple[str, str]:
    meta = _mapping(obj.get("metadata"), "metadata")
    if meta.get("uid") != uid:
        raise ClaimError(f"the claim's uid {shown(meta.get('uid'))} is not the kubelet's "
                         f"{shown(uid)} (deleted and created again?)",
                         ClaimReason.UID_MISMATCH)
    return (_text(meta.get("namespace"), "metadata.namespace"),
            _text(meta.get("name"), "metadata.name"))


def _allocation(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if allocation is None:
        raise ClaimError("the claim is not allocated (no status.allocation)",
                         ClaimReason.NOT_ALLOCATED)
    alloc = _mapping(allocation, "status.allocation")
    return _mapping(alloc.get("devices", {}), "status.allocation.devices")


def parse_claim(
    obj: object, *, uid: str, driver: str, pool: str, inventory: Inventory
) -> ParsedClaim:
    """``obj`` (a ResourceClaim as JSON) -> our devices in it. Raises ClaimError."""
    if not CLAIM_UID.match(uid):
        raise ClaimError(f"claim uid {shown(uid)} is not a valid name", ClaimReason.MALFORMED)
    claim = _mapping(obj, "the claim")
    namespace, name = _metadata(claim, uid)
    devices = _allocation(claim)
    results = _items(devices.get("results"), "status.allocation.devices.results", MAX_RESULTS)
    ours = [
        _result(r, n, pool, inventory)
        for n, r in enumerate(results)
        if isinstance(r, Mapping) and r.get("driver") == driver
    ]
    if not ours:
        raise ClaimError(f"no device of driver {driver} is allocated to the claim",
                         ClaimReason.NOT_ALLOCATED)
    configs = _items(devices.get("config"), "status.allocation.devices.config", MAX_CONFIGS)
    mode, by_class = _enforcement(configs, driver, sorted({r.request for r in ours}))
    return ParsedClaim(uid, namespace, name, _merge(ours), mode, by_class)


# Strength of each mode against a tenant (docs/enforcement.md): a tenant's config may
# raise the mode in force, never lower it.
# The driver's own limit is out of the tenant's process and talks to no daemon of its.
STRENGTH = {EnforcementMode.NONE: 0, EnforcementMode.HAMI_CORE: 1, EnforcementMode.MPS: 2,
            EnforcementMode.NVIDIA_MEMORY_LIMITS: 3}


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
