"""Value types of cluster-level placement (pure; no I/O): a node as device slots, a pod
as demand, and the answer (a placement, or why nothing fits).

A node is seen as its devices' free/total memory units and cores (what the node agent's
inventory annotation reports), plus optional host CPU/memory (the trace replay checks
them; the extender leaves that to kube-scheduler's own filters).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from gpu_share.sharing.placement.gpu_models import ANY_MODEL, ModelReq

# One device as the GPU-state key sees it: (memory_free, cores_free, memory_total,
# cores_total). A node's GPU state is the sorted tuple of its healthy devices' keys;
# placement scores depend on nothing else, so nodes in the same state share them.
DevKey = tuple[int, int, int, int]
StateKey = tuple[DevKey, ...]

MILLI = 1000  # fragmentation and allocation are counted in GPU-milli equivalents


class TieBreak(StrEnum):
    DETERMINISTIC = "deterministic"  # lexicographically smallest node, lowest device index
    RANDOM = "random"  # uniform among equal best (seeded)


@dataclass(frozen=True)
class DeviceSlot:
    uuid: str
    index: int
    memory_total: int
    memory_free: int
    cores_total: int
    cores_free: int
    healthy: bool = True

    @property
    def key(self) -> DevKey:
        return (self.memory_free, self.cores_free, self.memory_total, self.cores_total)

    @property
    def whole_free(self) -> bool:
        return self.memory_free == self.memory_total and self.cores_free == self.cores_total


@dataclass(frozen=True)
class NodeSlots:
    """A node as placement sees it. ``cpu_free``/``host_memory_free`` None = unchecked.
    ``model``: its device model in label form (``models.label_form``); ``*_total`` and
    ``held`` (GPU requests of the pods placed there) only matter to the dotprod and
    clustering baselines."""

    name: str
    devices: tuple[DeviceSlot, ...]
    cpu_free: int | None = None
    host_memory_free: int | None = None
    model: str = ""
    cpu_total: int | None = None
    host_memory_total: int | None = None
    held: frozenset[tuple[tuple[int, int], ...]] = frozenset()
    # Why no new slice lands on the node at all (its agent cannot enforce); "" = none.
    unavailable: str = ""

    @cached_property  # the object is frozen: built once, read per key and per evaluation
    def state(self) -> StateKey:
        return tuple(sorted(d.key for d in self.devices if d.healthy))


@dataclass(frozen=True)
class Demand:
    """One container's request: ``cores`` >= the device's cores means ``cores //
    cores_total`` whole devices (exclusive); otherwise one device shared."""

    container: str
    memory_units: int
    cores: int

    @property
    def empty(self) -> bool:
        return self.memory_units == 0 and self.cores == 0


@dataclass(frozen=True)
class PodDemand:
    """What a pod asks: containers that use our resources (in admission order), plus
    host CPU (milli) and memory (MiB) for the replay's host check."""

    containers: tuple[Demand, ...]
    cpu: int = 0
    host_memory: int = 0
    models: ModelReq = ANY_MODEL  # device models it accepts

    @property
    def gpu_free(self) -> bool:
        return all(c.empty for c in self.containers)


@dataclass(frozen=True)
class ContainerPlacement:
    container: str
    devices: tuple[DeviceSlot, ...]  # the devices as they were BEFORE placement
    memory_units: int  # per device
    cores: int  # per device


@dataclass(frozen=True)
class Placement:
    node: str
    containers: tuple[ContainerPlacement, ...]
    score: tuple[float, ...]  # lower is better; policy-specific


class NoFitCause(StrEnum):
    DEVICES = "Devices"  # no device set of the node fits the request
    MODEL = "Model"  # the node's device model is not one the pod accepts
    CPU = "Cpu"
    MEMORY = "Memory"
    NO_INVENTORY = "NoInventory"
    ENFORCEMENT = "Enforcement"  # the node's agent cannot enforce its pool's mode


@dataclass(frozen=True)
class NoFit:
    """Why a node cannot take a pod (a filter failure reason)."""

    node: str
    reason: str
    cause: NoFitCause = NoFitCause.DEVICES
