"""Cluster-level placement (pure): which node and which devices a pod should get.

Used by the scheduler extender (``gpu_share.extender``) and the trace replay
(``bench/replay``), so both place exactly alike. See docs/placement.md.

The package loads its modules on first use (PEP 562): a process that needs one reader
(the node agent reads pod requests with ``pod_request``) does not load the placement
policies, about 2 MiB of its RSS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_share.sharing.placement.cluster import ClusterIndex, choose
    from gpu_share.sharing.placement.cluster_policy import (
        ClusterPolicy,
        ClusterPolicyName,
        make_policy,
    )
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

_WHERE = {
    "ANY_MODEL": "gpu_models",
    "MILLI": "slots",
    "ClusterIndex": "cluster",
    "ClusterPolicy": "cluster_policy",
    "ClusterPolicyName": "cluster_policy",
    "ContainerPlacement": "slots",
    "Demand": "slots",
    "DeviceSlot": "slots",
    "ModelPressure": "gpu_models",
    "ModelReq": "gpu_models",
    "ModelTerm": "gpu_models",
    "NoFit": "slots",
    "NoFitCause": "slots",
    "NodeSlots": "slots",
    "Placement": "slots",
    "PodDemand": "slots",
    "PodScores": "pod_scores",
    "Shape": "fragmentation",
    "TieBreak": "slots",
    "Workload": "fragmentation",
    "amount": "fragmentation",
    "apply": "evaluate",
    "choose": "cluster",
    "evaluate_node": "evaluate",
    "host_fits": "evaluate",
    "host_nofit": "evaluate",
    "label_form": "gpu_models",
    "make_policy": "cluster_policy",
    "model_free": "evaluate",
    "node_key": "evaluate",
    "pod_shape": "evaluate",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


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
