"""gpu_share.devices: device backends behind one Protocol (``base.DeviceBackend``)."""

from gpu_share.devices.base import (
    Device,
    DeviceBackend,
    DeviceNode,
    HealthCallback,
    HealthEvent,
    RuntimeNaming,
)
from gpu_share.devices.dummy import DummyBackend, dummy_uuid, read_faults, write_faults
from gpu_share.devices.factory import NoDevicesBackend, create_backend, start_backend

__all__ = [
    "Device",
    "DeviceBackend",
    "DeviceNode",
    "DummyBackend",
    "HealthCallback",
    "HealthEvent",
    "NoDevicesBackend",
    "RuntimeNaming",
    "create_backend",
    "dummy_uuid",
    "read_faults",
    "start_backend",
    "write_faults",
]
