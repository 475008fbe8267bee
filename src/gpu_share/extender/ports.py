"""What the extender needs from the cluster (implemented in gpu_share.kube, faked in tests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpu_share.errors import GpuShareError
from gpu_share.sharing.placement import NodeSlots, Workload


class ClusterView(Protocol):
    def node(self, name: str) -> NodeSlots | None:
        """The node's devices with free = total - used (inventory + assignments + pending
        decisions), or None when the node has no inventory annotation."""
        ...

    def nodes(self, names: Sequence[str]) -> dict[str, NodeSlots | None]:
        """``node`` of each name, read at one moment (filter and prioritize ask for every
        candidate: one call, not one per node)."""
        ...

    def workload(self) -> Workload:
        """The target workload mix for fragmentation."""
        ...

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        """Count ``shares`` (device uuid -> (memory units, cores)) as used on ``node`` until
        the pod's own annotations show up in the view."""
        ...

    def unreserve(self, pod_uid: str, node: str) -> None:
        """Drop the pod's reservation on ``node`` (its bind was refused)."""
        ...

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod object (JSON-shaped), for a bind whose filter this process missed."""
        ...


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim as JSON; raises a ``GpuShareError`` when it cannot be read
        (``kube.resourceclaims.KubeClaimReader``)."""
        ...


class Binder(Protocol):
    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Write ``annotations`` on the pod (uid-checked), THEN create its Binding.
        Raises ``BindRefused`` when the API server answered no (nothing bound), any other
        error when the outcome is unknown."""
        ...


class ReadOnlyView:
    """The half of a ``ClusterView`` that a view nobody binds through shares: it knows
    no pod and refuses reservations (``read_only`` names the view in the error)."""

    read_only = "this view is read-only"

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        raise GpuShareError(self.read_only)

    def unreserve(self, pod_uid: str, node: str) -> None:
        raise GpuShareError(self.read_only)

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None
