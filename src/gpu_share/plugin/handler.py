"""The contract between the gRPC servers and the node agent.

The servers in this package speak protobuf; everything they need from the agent goes
through ``ResourceHandler`` (one per extended resource). The agent's
``ResourceBinding`` satisfies it structurally with the agent's own methods, the
resource's kind bound, so the servicer calls the agent directly and the agent never
imports grpc.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpu_share.sharing.model import AdvertisedDevice, AllocateSpec


class ResourceHandler(Protocol):
    """Serves one extended resource (e.g. ``vendor.com/vcuda-memory``).

    Errors: raise ``gpu_share.errors.AllocationError`` (bad or unsatisfiable request),
    ``IdentityError`` / ``KubeAccessError`` (cannot decide now); the server maps them to
    gRPC status codes with the message intact.
    """

    @property
    def resource_name(self) -> str: ...

    @property
    def endpoint(self) -> str:
        """Socket file name inside the device-plugin dir, e.g. ``gpu-share-vcuda-memory.sock``."""
        ...

    @property
    def preferred_allocation_available(self) -> bool: ...

    @property
    def pre_start_required(self) -> bool: ...

    def list_devices(self) -> list[AdvertisedDevice]: ...

    def wait_for_change(self, seen_version: int, timeout_s: float) -> int:
        """Block until the device list version differs from ``seen_version`` or the
        timeout passes; return the current version. Versions start at 1."""
        ...

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...

    def allocate(self, device_ids: Sequence[str]) -> AllocateSpec: ...

    def pre_start(self, device_ids: Sequence[str]) -> None: ...
