"""An in-memory ``ResourceHandler`` for tests and benchmarks of the gRPC layer."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpu_share.sharing.model import AdvertisedDevice, AllocateSpec


@dataclass
class FakeHandler:
    """Answers from fields the test sets; records every call.

    ``error``: raised by GPA/Allocate/PreStartContainer while set.
    ``preferred``: GPA answer; default: must_include, then the first available, to size.
    ``spec``: Allocate answer; default: one env naming the devices.
    """

    resource_name: str = "vendor.com/vcuda-memory"
    endpoint: str = "gpu-share-vcuda-memory.sock"
    preferred_allocation_available: bool = True
    pre_start_required: bool = False
    devices: list[AdvertisedDevice] = field(
        default_factory=lambda: [AdvertisedDevice(id=f"dev-{i}", healthy=True) for i in range(4)]
    )
    error: Exception | None = None
    preferred: list[str] | None = None
    spec: AllocateSpec | None = None
    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._cv = threading.Condition()
        self._version = 1

    def set_devices(self, devices: list[AdvertisedDevice]) -> None:
        with self._cv:
            self.devices = list(devices)
            self._version += 1
            self._cv.notify_all()

    def list_devices(self) -> list[AdvertisedDevice]:
        with self._cv:
            return list(self.devices)

    def wait_for_change(self, seen_version: int, timeout_s: float) -> int:
        with self._cv:
            self._cv.wait_for(lambda: self._version != seen_version, timeout=timeout_s)
            return self._version

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        self.calls.append(("preferred_allocation", (tuple(available), tuple(must_include), size)))
        if self.error is not None:
            raise self.error
        if self.preferred is not None:
            return list(self.preferred)
        chosen = list(must_include)
        chosen += [d for d in available if d not in chosen][: max(0, size - len(chosen))]
        return chosen

    def allocate(self, device_ids: Sequence[str]) -> AllocateSpec:
        self.calls.append(("allocate", (tuple(device_ids),)))
        if self.error is not None:
            raise self.error
        if self.spec is not None:
            return self.spec
        return AllocateSpec(envs={"FAKE_DEVICES": ",".join(device_ids)})

    def pre_start(self, device_ids: Sequence[str]) -> None:
        self.calls.append(("pre_start", (tuple(device_ids),)))
        if self.error is not None:
            raise self.error
