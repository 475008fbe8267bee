"""What the node agent needs from the outside world, as Protocols.

plugin/ implements ``PodResourcesSource`` over gRPC; kube/ implements ``PodSource`` and
``Publisher`` over the API server. Tests pass in-memory fakes of these ports only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpu_share.sharing.model import PodResourcesView, PodView


class PodResourcesSource(Protocol):
    def list(self) -> PodResourcesView:
        """The kubelet's active pods with the devices each container holds.
        Raises KubeAccessError when the kubelet does not answer."""
        ...


class PodSource(Protocol):
    def get_pod(self, namespace: str, name: str) -> PodView | None:
        """Raises KubeAccessError when the API server does not answer."""
        ...

    def list_node_pods(self, node_name: str) -> list[PodView]:
        """Pods bound to the node (any phase). Raises KubeAccessError."""
        ...


class Publisher(Protocol):
    # True: written or nothing to write; False: not written now (retried later).
    # ``labels``: node labels written in the same patch (a None value removes one).
    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None],
                      labels: Mapping[str, str | None] | None = None) -> bool: ...

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> bool: ...

    def pod_event(
        self, namespace: str, name: str, *, reason: str, message: str, warning: bool
    ) -> None: ...

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None: ...


@dataclass(frozen=True)
class DeviceRow:
    """One device's figures for metrics: (resource, used, total) per resource."""

    device: str
    healthy: bool
    units: tuple[tuple[str, int, int], ...]
    cordoned: bool = False


class AgentMetrics:
    """What the agent reports; the cli binds it to Prometheus. No-ops by default."""

    def observe_call(self, call: str, resource: str, seconds: float) -> None: ...
    def allocation(self, resource: str, source: str) -> None: ...
    def failure(self, resource: str, reason: str) -> None: ...
    def degraded(self, reason: str) -> None: ...
    def ambiguous(self) -> None: ...
    def kube_error(self, op: str) -> None: ...
    def event_dropped(self, why: str) -> None: ...
    def ledger_write(self) -> None: ...
    def ledger_write_failed(self) -> None: ...
    def ledger_quarantined(self, reason: str) -> None: ...
    def ledger_anomaly(self, reason: str) -> None: ...
    def devices(self, rows: Sequence[DeviceRow]) -> None: ...
    def memory_unit(self, configured_mib: int, in_use_mib: int) -> None: ...
    def loop_error(self, loop: str) -> None: ...
    def cordon_ignored(self, reason: str) -> None: ...
    def enforcement(self, mode: str, ready: bool) -> None: ...
