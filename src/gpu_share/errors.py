"""One error hierarchy for the whole agent.

Every error carries a short machine-readable ``reason`` (used as metric label and
Kubernetes Event reason) and a message a person understands.
"""

from __future__ import annotations


class GpuShareError(Exception):
    """Base of every error raised on purpose by gpu-share."""

    reason: str = "Error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        # The container the failed call was for, when known (a ContainerRef); lets the
        # agent put an Event on the right pod.
        self.ref: object | None = None

    def __str__(self) -> str:
        return self.message


class ConfigError(GpuShareError):
    """Configuration is malformed, of an unknown version, or cannot work."""

    reason = "InvalidConfig"


class DeviceBackendError(GpuShareError):
    """A device backend could not start or answer (e.g. NVML init failed)."""

    reason = "DeviceBackendError"


class AllocationError(GpuShareError):
    """A request cannot be satisfied or is malformed.

    Reasons used: InvalidRequest, UnknownDevice, SplitAcrossDevices, NoFit,
    DecisionMismatch, DeviceUnhealthy, ExclusiveConflict.
    """

    reason = "AllocationFailed"


class IdentityError(GpuShareError):
    """The pod/container a kubelet call belongs to could not be determined."""

    reason = "IdentityUnknown"


class LedgerError(GpuShareError):
    """The persisted ledger is unreadable or inconsistent."""

    reason = "LedgerError"


class KubeAccessError(GpuShareError):
    """The API server or the kubelet's PodResources API could not be reached."""

    reason = "KubeUnreachable"
