"""What a container's slice amounts to, independent of how the runtime is told (that is
``agent/response.py``): its memory limit per device, its core percentage, whether its
enforcement mode can enforce it, and the name of its private host dir.

The rule of ``check_enforceable`` is the admission policy's (charts/gpu-share
admission-policy-workloads.yaml, ``coresOnly``), whole devices included; this is the
check for pods it did not see.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from gpu_share.config.model import EnforcementMode
from gpu_share.devices.base import Device
from gpu_share.errors import AllocationError, AllocationReason
from gpu_share.sharing.model import DeviceShare
from gpu_share.sharing.node.ledger import LedgerEntry

# AllocationError reason: a container with cores but no memory units under an enforcing
# mode, where it would get unlimited device memory (over-committing others' units).
MEMORY_REQUIRED = AllocationReason.MEMORY_REQUIRED
ENFORCING_MODES = frozenset(
    {EnforcementMode.MPS, EnforcementMode.HAMI_CORE, EnforcementMode.NVIDIA_MEMORY_LIMITS}
)
# Strength of each mode in force against a tenant (docs/enforcement.md): a tenant's claim
# config may raise the mode, never lower it, and ``auto`` takes the strongest the node has.
# The driver's own limit is out of the tenant's process and talks to no daemon of its.
STRENGTH = {EnforcementMode.NONE: 0, EnforcementMode.HAMI_CORE: 1, EnforcementMode.MPS: 2,
            EnforcementMode.NVIDIA_MEMORY_LIMITS: 3}
# The modes in force, strongest first (AUTO is configured, never in force).
BY_STRENGTH = tuple(sorted(STRENGTH, key=STRENGTH.__getitem__, reverse=True))

# One path component: what the API server allows in UIDs and container names, bounded.
_KEY_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
BLIND_KEY_PREFIX = "alloc-"  # a key no pod UID names; "<uid>_<container>" always has a "_"


def host_dir_key(entry: LedgerEntry) -> str:
    """Name of the container's private host dir(s): ``<podUID>_<container>``, so a later
    pod of the same name never gets it. Without a UID (a blind, degraded allocation) a
    digest of the entry's ref and creation time: unique per allocation, never reused."""
    r = entry.ref
    if _KEY_PART.fullmatch(r.pod_uid) and _KEY_PART.fullmatch(r.container_name):
        return f"{r.pod_uid}_{r.container_name}"
    ident = json.dumps(
        [r.namespace, r.pod_name, r.container_name, r.pod_uid, repr(entry.created_at)]
    )
    return BLIND_KEY_PREFIX + hashlib.sha256(ident.encode()).hexdigest()[:32]


def passes_on(key: str) -> bool:
    """Whether the dir ``key`` may go on to another key while its container runs: only a
    key without the pod's UID (a blind entry, named later). A ``<podUID>_<container>``
    key is its container's for life, so its leaving the ledger is always a release."""
    return key.startswith(BLIND_KEY_PREFIX)


def check_enforceable(
    entry: LedgerEntry, enforcement: EnforcementMode, memory_resource: str = "memory units"
) -> None:
    """Refuse (``MEMORY_REQUIRED``) a container with cores but no memory under an
    enforcing mode. Blind (degraded) entries are not judged: their first call cannot tell
    a cores-only container from the first half of a memory+cores one."""
    req = entry.request
    if (
        enforcement in ENFORCING_MODES
        and req.cores > 0
        and req.memory_units == 0
        and not entry.degraded
    ):
        raise AllocationError(
            f"requests {req.cores} cores but no {memory_resource}: under enforcement "
            f"{enforcement.value!r} a container requesting cores must also request "
            f"{memory_resource} (its device-memory limit; a whole device: all its units)",
            reason=MEMORY_REQUIRED,
            ref=entry.ref,
        )


def memory_mib(share: DeviceShare, device: Device, unit_mib: int) -> int:
    """The container's memory limit on ``device``. Exclusive devices are the
    container's whole: no limit below the device's own memory."""
    return device.memory_mib if share.exclusive else share.memory_units * unit_mib


def core_percent(shares: Iterable[DeviceShare]) -> int:
    """One percentage for all the container's devices (the runtimes take one)."""
    return min(max((s.cores for s in shares), default=0), 100)
