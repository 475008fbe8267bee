"""The agent's side of the device-plugin front-end: one ``ResourceBinding`` per extended
resource satisfies ``plugin.handler.ResourceHandler`` with the agent's own methods."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpu_share.sharing.model import AdvertisedDevice, AllocateSpec, ResourceKind


@dataclass(frozen=True)
class ResourceBinding:
    """``plugin.handler.ResourceHandler`` for one extended resource: the agent's own
    methods with the resource's kind bound (``functools.partial``), so the gRPC servicer
    calls the agent with no layer in between."""

    kind: ResourceKind
    resource_name: str
    list_devices: Callable[[], list[AdvertisedDevice]]
    wait_for_change: Callable[[int, float], int]
    preferred_allocation: Callable[[Sequence[str], Sequence[str], int], list[str]]
    allocate: Callable[[Sequence[str]], AllocateSpec]
    preferred_allocation_available: bool = True
    pre_start_required: bool = False

    @property
    def endpoint(self) -> str:
        return "gpu-share-" + self.resource_name.split("/", 1)[1] + ".sock"

    def pre_start(self, device_ids: Sequence[str]) -> None:
        return None
