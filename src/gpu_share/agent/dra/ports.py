"""The seam between the DRA gRPC front-end (``gpu_share.dra``) and the agent's claim
handling: what the kubelet names in NodePrepareResources / NodeUnprepareResources and
what the agent answers. No grpc here (front-ends convert)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# The checkpoint's file name in the DRA plugin dir (agent/dra/checkpoint.py reads it):
# here, so that a device-plugin pool can see there is none without loading its reader.
CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it (unprepare may know only uid and name)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a claim and the CDI device ids the runtime injects."""

    requests: tuple[str, ...]  # the claim's request names this device serves
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PrepareResult:
    """Per claim: its devices, or an error the kubelet reports on the pod (never both)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparer(Protocol):
    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Idempotent: a claim prepared before answers the same devices. Keyed by uid."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Idempotent: an unknown claim is done. uid -> error text ("" when done)."""
        ...
