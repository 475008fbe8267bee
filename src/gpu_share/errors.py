"""One error hierarchy for the whole agent.

Every error carries a short machine-readable ``reason`` and a message a person
understands. ``REASONS`` is the one table that maps an allocation reason to its metric
label, gRPC status code and Kubernetes Event reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class AllocationReason(StrEnum):
    """Why an allocation was refused (``AllocationError.reason``)."""

    INVALID_REQUEST = "InvalidRequest"
    UNKNOWN_DEVICE = "UnknownDevice"
    SPLIT_ACROSS_DEVICES = "SplitAcrossDevices"
    NO_FIT = "NoFit"
    DECISION_MISMATCH = "DecisionMismatch"
    DEVICE_UNHEALTHY = "DeviceUnhealthy"
    EXCLUSIVE_CONFLICT = "ExclusiveConflict"
    # Cores without memory under an enforcing mode (sharing.node.limits).
    MEMORY_REQUIRED = "MemoryRequired"
    # The enforcement's per-container host dir could not be made (hami-core): a slice
    # whose limits cannot reach its container is not handed out.
    HOST_DIR_UNAVAILABLE = "HostDirUnavailable"
    # The pool's ``auto`` enforcement has no mode in force yet (checked at start).
    ENFORCEMENT_UNRESOLVED = "EnforcementUnresolved"


@dataclass(frozen=True)
class ReasonInfo:
    metric_label: str  # label value of the failure counter
    grpc_code: str  # grpc.StatusCode member name (grpc is imported by plugin/ only)
    event_reason: str  # reason of the Kubernetes Event


def _same(reason: AllocationReason, grpc_code: str = "INVALID_ARGUMENT") -> ReasonInfo:
    return ReasonInfo(reason.value, grpc_code, reason.value)


# Not the request's fault: the node cannot serve it now.
_GRPC_CODES = {
    AllocationReason.NO_FIT: "RESOURCE_EXHAUSTED",
    AllocationReason.HOST_DIR_UNAVAILABLE: "UNAVAILABLE",
    AllocationReason.ENFORCEMENT_UNRESOLVED: "UNAVAILABLE",
}

REASONS: dict[AllocationReason, ReasonInfo] = {
    r: _same(r, _GRPC_CODES.get(r, "INVALID_ARGUMENT")) for r in AllocationReason
}


class GpuShareError(Exception):
    """Base of every error raised on purpose by gpu-share."""

    reason: str = "Error"
    # grpc.StatusCode member name the kubelet sees for this error class.
    grpc_code: str = "FAILED_PRECONDITION"

    def __init__(
        self, message: str, *, reason: str | None = None, ref: object | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        # The container the failed call was for, when known (a ContainerRef); lets the
        # agent put an Event on the right pod.
        self.ref: object | None = ref

    def __str__(self) -> str:
        return self.message


def _info(exc: GpuShareError) -> ReasonInfo | None:
    try:
        return REASONS[AllocationReason(exc.reason)]
    except ValueError:
        return None


def grpc_code_of(exc: GpuShareError) -> str:
    """The grpc.StatusCode member name for ``exc``: its reason's row, else its class's."""
    info = _info(exc) if isinstance(exc, AllocationError) else None
    return info.grpc_code if info is not None else exc.grpc_code


def metric_label_of(exc: GpuShareError) -> str:
    info = _info(exc)
    return info.metric_label if info is not None else exc.reason


def event_reason_of(exc: GpuShareError) -> str:
    info = _info(exc)
    return info.event_reason if info is not None else exc.reason


class InputError(GpuShareError, ValueError):
    """Untrusted input that cannot be read as what it claims to be (a quantity, a pod's
    request, a review, a checkpoint, a watch line). Still a ValueError, as the readers
    of values expect."""

    reason = "InvalidInput"
    grpc_code = "INVALID_ARGUMENT"


class UsageError(GpuShareError):
    """Command-line flags a program refuses to start with (exit 2)."""

    reason = "InvalidUsage"


class ConfigError(GpuShareError):
    """Configuration is malformed, of an unknown version, or cannot work."""

    reason = "InvalidConfig"


class DeviceBackendError(GpuShareError):
    """A device backend could not start or answer (e.g. NVML init failed)."""

    reason = "DeviceBackendError"


class AllocationError(GpuShareError):
    """A request cannot be satisfied or is malformed (reasons: ``AllocationReason``)."""

    reason = "AllocationFailed"
    grpc_code = "INVALID_ARGUMENT"


class IdentityError(GpuShareError):
    """The pod/container a kubelet call belongs to could not be determined."""

    reason = "IdentityUnknown"
    grpc_code = "UNAVAILABLE"


class LedgerError(GpuShareError):
    """The persisted ledger is unreadable or inconsistent."""

    reason = "LedgerError"


class KubeAccessError(GpuShareError):
    """The API server or the kubelet's PodResources API could not be reached."""

    reason = "KubeUnreachable"
    grpc_code = "UNAVAILABLE"


class BindRefused(KubeAccessError):
    """The API server answered a bind (or its annotation patch) with a client error
    (4xx): the pod is certainly not bound by this call."""

    reason = "BindRefused"
