"""Cluster-level placement (pure): which node and which devices a pod should get.

Used by the scheduler extender (``gpu_share.extender``) and the trace replay
(``bench/replay``), so both place exactly alike. See docs/placement.md.
"""

from gpu_share.sharing.placement.cluster import (
    ClusterIndex,
    apply,
    choose,
    evaluate_node,
    host_fits,
    pod_shape,
)
from gpu_share.sharing.placement.fragmentation import Shape, Workload, amount
from gpu_share.sharing.placement.model import (
    MILLI,
    ContainerPlacement,
    Demand,
    DeviceSlot,
    NodeSlots,
    NoFit,
    Placement,
    PodDemand,
    TieBreak,
)
from gpu_share.sharing.placement.policy import ClusterPolicy, ClusterPolicyName, make_policy

__all__ = [
    "MILLI",
    "ClusterIndex",
    "ClusterPolicy",
    "ClusterPolicyName",
    "ContainerPlacement",
    "Demand",
    "DeviceSlot",
    "NoFit",
    "NodeSlots",
    "Placement",
    "PodDemand",
    "Shape",
    "TieBreak",
    "Workload",
    "amount",
    "apply",
    "choose",
    "evaluate_node",
    "host_fits",
    "make_policy",
    "pod_shape",
]
