"""What every device backend offers: one Protocol, small value types.

Backends only describe hardware. They know nothing of Kubernetes, units or slices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class DeviceNode:
    """A device node to hand to the container (host path -> container path)."""

    host_path: str
    container_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Device:
    """One physical (or dummy) device."""

    uuid: str  # stable id, e.g. "GPU-8c5b..." or "NPU-0000-..."; never contains "::"
    index: int  # backend enumeration index (NVML index)
    minor: int  # /dev/nvidia<minor>
    memory_mib: int
    model: str
    numa_node: int | None = None  # None when unknown / not NUMA
    pci_bus_id: str = ""
    healthy: bool = True
    # Device nodes the container needs for this device alone (not the shared ctl nodes).
    nodes: tuple[DeviceNode, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class HealthEvent:
    """A change in one device's health, as seen by the backend."""

    uuid: str
    healthy: bool
    reason: str  # e.g. "xid-79", "fault-file", "recovered", "device-lost"
    transient: bool = False  # may recover after the quiet period


@dataclass(frozen=True)
class RuntimeNaming:
    """How this backend's devices are named towards the container runtime."""

    visible_devices_env: str  # NVIDIA_VISIBLE_DEVICES / DUMMY_VISIBLE_DEVICES
    # Nodes every container of this backend needs (e.g. /dev/nvidiactl).
    shared_nodes: tuple[DeviceNode, ...] = ()
    # Directory the volume-mounts strategy mounts into, one entry per visible device.
    volume_mount_root: str = "/var/run/nvidia-container-devices"
    annotation_prefix: str = "gpu-share.vendor.com"


HealthCallback = Callable[[HealthEvent], None]


@runtime_checkable
class DeviceBackend(Protocol):
    """One small scanner interface, implemented by ``nvml`` and ``dummy``."""

    name: str

    def start(self) -> None:
        """Initialise (e.g. nvmlInit). Raises DeviceBackendError with a clear message."""

    def devices(self) -> list[Device]:
        """Current devices with their current health, sorted by index."""

    def naming(self) -> RuntimeNaming:
        """Env var names, shared device nodes and mount roots of this backend."""

    def driver_version(self) -> str:
        """The device driver's version ("unknown" when it cannot be read)."""

    def poll_health(self, timeout_s: float) -> list[HealthEvent]:
        """Block at most ``timeout_s`` for health changes; return those seen (maybe none).

        Recovery after the quiet period is reported here too (healthy=True).
        """

    def stop(self) -> None:
        """Release the backend (e.g. nvmlShutdown). Idempotent."""
