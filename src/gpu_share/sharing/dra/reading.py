"""Reading a ResourceClaim's untrusted JSON (DRA mode): the typed refusal every reader
raises (``ClaimError``, ``ClaimReason``) and the shape checks it is read with. Messages
are bounded: values are cut (``shown``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from fractions import Fraction
from typing import Any

from gpu_share.errors import GpuShareError
from gpu_share.sharing.quantity import QuantityError, parse_quantity

MAX_SHOWN_CHARS = 60


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


def malformed(what: str, value: object) -> ClaimError:
    return ClaimError(f"{what} is malformed: {shown(value)}", ClaimReason.MALFORMED)


def read_mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise malformed(what, value)
    return value


def read_items(value: object, what: str, limit: int) -> Sequence[Any]:
    """A list (absent: empty) of at most ``limit`` items."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise malformed(what, value)
    if len(value) > limit:
        raise ClaimError(f"{what} has {len(value)} entries, at most {limit}",
                         ClaimReason.MALFORMED)
    return value


def read_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise malformed(what, value)
    return value


def read_quantity(value: object, what: str) -> Fraction:
    # The API server serialises every quantity as a string.
    if not isinstance(value, str):
        raise ClaimError(f"{what} is not a quantity: {shown(value)}", ClaimReason.BAD_CAPACITY)
    try:
        return parse_quantity(value)
    except QuantityError as e:
        raise ClaimError(f"{what}: {e}", ClaimReason.BAD_CAPACITY) from None
