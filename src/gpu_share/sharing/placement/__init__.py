"""Cluster-level placement (pure): which node and which devices a pod should get.

Used by the scheduler extender (``gpu_share.extender``) and the trace replay
(``bench/replay``), so both place exactly alike. See docs/placement.md.
"""

from gpu_share.sharing.placement.cluster import ClusterIndex, choose
from gpu_share.sharing.placement.cluster_policy import ClusterPolicy, ClusterPolicyName, make_policy
from gpu_share.sharing.placement.evaluate import (
    apply,
    evaluate_node,
    host_fits,
    host_nofit,
    model_free,
    node_key,
    pod_shape,
)
from gpu_share.sharing.placement.fragmentation import Shape, Workload, amount
from gpu_share.sharing.placement.gpu_models import (
    ANY_MODEL,
    ModelPressure,
    ModelReq,
    ModelTerm,
    label_form,
)
from gpu_share.sharing.placement.pod_scores import PodScores
from gpu_share.sharing.placement.slots import (
    MILLI,
    ContainerPlacement,
    Demand,
    DeviceSlot,
    NodeSlots,
    NoFit,
    NoFitCause,
    Placement,
    PodDemand,
    TieBreak,
)

__all__ = [
    "ANY_MODEL",
    "MILLI",
    "ClusterIndex",
    "ClusterPolicy",
    "ClusterPolicyName",
    "ContainerPlacement",
    "Demand",
    "DeviceSlot",
    "ModelPressure",
    "ModelReq",
    "ModelTerm",
    "NoFit",
    "NoFitCause",
    "NodeSlots",
    "Placement",
    "PodDemand",
    "PodScores",
    "Shape",
    "TieBreak",
    "Workload",
    "amount",
    "apply",
    "choose",
    "evaluate_node",
    "host_fits",
    "host_nofit",
    "label_form",
    "make_policy",
    "model_free",
    "node_key",
    "pod_shape",
]
