"""Value types shared by the pure logic and the layers above it.

Nothing here performs I/O. The kube/ layer turns API objects into ``PodView``; the
plugin/ layer turns PodResources answers into ``PodResourcesView`` and builds the gRPC
response from ``AllocateSpec``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Generic, TypeVar

from gpu_share.devices.base import DeviceNode

T = TypeVar("T")
U = TypeVar("U")


class ResourceKind(StrEnum):
    """The two dimensions of a slice."""

    MEMORY = "memory"  # memory units of ``memoryUnitMiB`` each
    CORE = "core"  # percent of one device's cores; 100 per device

    @property
    def other(self) -> ResourceKind:
        return ResourceKind.CORE if self is ResourceKind.MEMORY else ResourceKind.MEMORY


@dataclass(frozen=True)
class PerKind(Generic[T]):
    """One value per resource kind: the only place that tells memory from core."""

    memory: T
    core: T

    def __getitem__(self, kind: ResourceKind) -> T:
        return self.memory if kind is ResourceKind.MEMORY else self.core

    def set(self, kind: ResourceKind, value: T) -> PerKind[T]:
        return replace(self, **{_FIELD[kind]: value})

    def values(self) -> tuple[T, T]:
        return (self.memory, self.core)

    def map(self, fn: Callable[[T], U]) -> PerKind[U]:
        return PerKind(fn(self.memory), fn(self.core))

    @staticmethod
    def build(fn: Callable[[ResourceKind], U]) -> PerKind[U]:
        return PerKind(fn(ResourceKind.MEMORY), fn(ResourceKind.CORE))


_FIELD = {ResourceKind.MEMORY: "memory", ResourceKind.CORE: "core"}
# Field names of the per-kind amounts in ContainerRequest and DeviceShare (a dict: read
# several times per entry per call).
AMOUNT_FIELDS = {ResourceKind.MEMORY: "memory_units", ResourceKind.CORE: "cores"}
_AMOUNT = AMOUNT_FIELDS


class ContainerKind(StrEnum):
    INIT = "init"  # classic init container: runs to completion before app containers
    SIDECAR = "sidecar"  # restartable init container (restartPolicy: Always)
    APP = "app"


@dataclass(frozen=True, order=True)
class ContainerRef:
    """Which container of which pod. ``pod_uid`` may be "" when only PodResources knew it."""

    namespace: str
    pod_name: str
    container_name: str
    pod_uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod_name}/{self.container_name}"


@dataclass(frozen=True)
class ContainerRequest:
    """What one container asks of our two resources (limits == requests for extended
    resources). Zero means "not requested"."""

    memory_units: int = 0
    cores: int = 0

    def amount(self, kind: ResourceKind) -> int:
        return int(getattr(self, _AMOUNT[kind]))

    def with_amount(self, kind: ResourceKind, amount: int) -> ContainerRequest:
        return replace(self, **{_AMOUNT[kind]: amount})

    @property
    def empty(self) -> bool:
        return self.memory_units == 0 and self.cores == 0


@dataclass(frozen=True)
class ContainerView:
    name: str
    kind: ContainerKind
    request: ContainerRequest


@dataclass(frozen=True)
class PodView:
    """A pod as the API server describes it (only what allocation needs).

    ``containers`` is in kubelet admission order: init containers (and sidecars) in
    spec order, then app containers in spec order.
    """

    uid: str
    namespace: str
    name: str
    node_name: str
    containers: tuple[ContainerView, ...]
    phase: str = "Pending"
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleted: bool = False  # deletionTimestamp set
    # metadata.creationTimestamp as epoch seconds (0 when unknown); identity tie-break.
    created_at: float = 0.0

    @property
    def terminal(self) -> bool:
        """The pod will never run again (its devices can be released)."""
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class ResourceNames:
    """Kubelet resource names of the two dimensions (e.g. ``vendor.com/vcuda-memory``)."""

    memory: str
    core: str

    def name_of(self, kind: ResourceKind) -> str:
        name: str = getattr(self, _FIELD[kind])
        return name

    @property
    def domain(self) -> str:
        """The resources' domain (``vendor.com``), which also names our annotations."""
        return self.memory.split("/", 1)[0]

    def kind_of(self, resource: str) -> ResourceKind | None:
        if resource == self.memory:
            return ResourceKind.MEMORY
        if resource == self.core:
            return ResourceKind.CORE
        return None


@dataclass(frozen=True)
class PodResourcesContainer:
    """One container in the kubelet's PodResources answer."""

    name: str
    # Kubelet resource name (e.g. "vendor.com/vcuda-memory") -> device IDs it holds.
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PodResourcesPod:
    """One pod in the kubelet's PodResources ``List`` (no UID: the API has none)."""

    namespace: str
    name: str
    containers: tuple[PodResourcesContainer, ...] = ()


@dataclass(frozen=True)
class PodResourcesView:
    """A whole PodResources ``List`` answer: the kubelet's active pods."""

    pods: tuple[PodResourcesPod, ...] = ()


@dataclass(frozen=True)
class DeviceShare:
    """Part of one device held by one container."""

    device: str  # Device.uuid
    memory_units: int
    cores: int
    exclusive: bool = False  # whole device, nobody else may hold any unit of it

    def amount(self, kind: ResourceKind) -> int:
        return int(getattr(self, _AMOUNT[kind]))

    def with_amount(self, kind: ResourceKind, amount: int) -> DeviceShare:
        changes: dict[str, Any] = {_AMOUNT[kind]: amount}
        return replace(self, **changes)


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class Hook:
    """An OCI hook a CDI spec asks the runtime to run (``createRuntime``: in the runtime
    namespace, the container's cgroup made, its process not started)."""

    path: str
    args: tuple[str, ...]
    hook_name: str = "createRuntime"


@dataclass(frozen=True)
class AllocateSpec:
    """Everything one ContainerAllocateResponse carries, independent of gRPC. ``hooks``
    reach a container only through CDI: a device-plugin response names CDI devices that
    carry them (``cdi_devices``), a DRA claim's spec lists them itself."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()  # fully qualified CDI names, "<kind>=<name>"
    hooks: tuple[Hook, ...] = ()


@dataclass(frozen=True)
class AdvertisedDevice:
    """One entry of a ListAndWatch answer (one unit of one resource)."""

    id: str
    healthy: bool
    numa_node: int | None = None


def camel_fields(obj: object, *names: str) -> dict[str, Any]:
    """The named attributes of ``obj`` under their camelCase names, as the JSON
    documents we write (annotations, the ledger, kubectl output) spell them."""
    return {_camel(n): getattr(obj, n) for n in names}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)
