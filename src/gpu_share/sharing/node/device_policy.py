"""The node's device policies (the agent's ``placement.policy``): which device(s) get a
new decision. Cluster policies, which pick the node, are ``placement/cluster_policy.py``.

A policy only ranks devices that already fit; fitting (health, free units, exclusivity)
is decided by the engine. Ties always go to the lowest device index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpu_share.config.model import PlacementPolicyName


@dataclass(frozen=True)
class DeviceState:
    """A candidate device as the policy sees it (free counts before placement)."""

    uuid: str
    index: int
    numa_node: int | None
    memory_total: int
    memory_free: int
    cores_total: int
    cores_free: int

    def _frac(self, part: int, total: int) -> float:
        return part / total if total > 0 else 0.0

    def leftover(self, memory_units: int, cores: int) -> float:
        """Normalised free space left after placing (memory_units, cores)."""
        return self._frac(self.memory_free - memory_units, self.memory_total) + self._frac(
            self.cores_free - cores, self.cores_total
        )

    def free_fraction(self) -> float:
        return self._frac(self.memory_free, self.memory_total) + self._frac(
            self.cores_free, self.cores_total
        )


class PlacementPolicy(Protocol):
    name: PlacementPolicyName

    def choose(
        self, candidates: Sequence[DeviceState], memory_units: int, cores: int
    ) -> DeviceState | None:
        """One device from ``candidates`` (all of which fit), or None when empty."""
        ...


class _ScoredPolicy:
    def __init__(
        self, name: PlacementPolicyName, score: Callable[[DeviceState, int, int], float]
    ) -> None:
        self.name = name
        self._score = score

    def choose(
        self, candidates: Sequence[DeviceState], memory_units: int, cores: int
    ) -> DeviceState | None:
        if not candidates:
            return None
        return min(candidates, key=lambda d: (self._score(d, memory_units, cores), d.index))


def _best_fit(d: DeviceState, m: int, c: int) -> float:
    # Smallest normalised leftover: the tightest device, keeping large blocks elsewhere.
    return d.leftover(m, c)


def _binpack(d: DeviceState, m: int, c: int) -> float:
    # Most used device first (least free before placement).
    return d.free_fraction()


def _spread(d: DeviceState, m: int, c: int) -> float:
    # Least used device first.
    return -d.free_fraction()


_REGISTRY: dict[PlacementPolicyName, PlacementPolicy] = {
    PlacementPolicyName.BEST_FIT: _ScoredPolicy(PlacementPolicyName.BEST_FIT, _best_fit),
    PlacementPolicyName.BINPACK: _ScoredPolicy(PlacementPolicyName.BINPACK, _binpack),
    PlacementPolicyName.SPREAD: _ScoredPolicy(PlacementPolicyName.SPREAD, _spread),
}


def get_policy(name: PlacementPolicyName | str) -> PlacementPolicy:
    return _REGISTRY[PlacementPolicyName(name)]


make_policy = get_policy  # the agent's name for it


def choose_whole_devices(free: Sequence[DeviceState], count: int) -> list[DeviceState] | None:
    """``count`` wholly free devices for an exclusive request, preferring one NUMA node.

    Among NUMA nodes with enough free devices, the one with the fewest free devices
    (best fit) wins, then the lowest device index; without such a node, the lowest
    indices overall.
    """
    if count < 1 or len(free) < count:
        return None
    by_numa: dict[int | None, list[DeviceState]] = {}
    for d in sorted(free, key=lambda d: d.index):
        by_numa.setdefault(d.numa_node, []).append(d)
    groups = [g for numa, g in by_numa.items() if numa is not None and len(g) >= count]
    if groups:
        best = min(groups, key=lambda g: (len(g), g[0].index))
        return best[:count]
    return sorted(free, key=lambda d: d.index)[:count]
