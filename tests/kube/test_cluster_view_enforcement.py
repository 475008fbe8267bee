"""The extender's cluster view reads the agent's enforcement annotation: a node that
cannot enforce gets the reason in its slots (the filter's NoFit says it), and loses it
once the agent says it can again."""

from __future__ import annotations

import json
from typing import Any

from gpu_share.sharing.annotations import (
    InventoryAnnotation,
    InventoryDevice,
    enforcement_key,
    inventory_key,
)
from gpu_share.sharing.placement.evaluate import host_nofit
from gpu_share.sharing.placement.slots import Demand, NoFitCause, PodDemand
from tests.kube.test_cluster_view_cache import Clock, new_view


def _node(ready: bool) -> dict[str, Any]:
    inv = InventoryAnnotation("n", 1024, (InventoryDevice("g0", 0, "Tesla T4", 16, 0, 100,
                                                           0, True, 0),)).encode()
    status = {"mode": "hami-core", "ready": ready,
              "problems": [] if ready else ["library /x/libvgpu.so missing"]}
    return {"metadata": {"name": "n", "annotations": {
        inventory_key("vendor.com"): inv, enforcement_key("vendor.com"): json.dumps(status)}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}


def test_the_view_carries_why_a_node_takes_no_slice() -> None:
    view = new_view(Clock())
    view._apply("nodes", "ADDED", _node(ready=False))
    slots = view.node("n")
    assert slots is not None
    assert slots.unavailable == "enforcement 'hami-core' unavailable: library /x/libvgpu.so missing"
    view._apply("nodes", "MODIFIED", _node(ready=True))
    again = view.node("n")
    assert again is not None and again.unavailable == ""


def test_the_filter_reason_names_it() -> None:
    view = new_view(Clock())
    view._apply("nodes", "ADDED", _node(ready=False))
    slots = view.node("n")
    assert slots is not None
    why = host_nofit(slots, PodDemand((Demand("main", 4, 30),)))
    assert why is not None and why.cause is NoFitCause.ENFORCEMENT
    assert "no new slice on this node: enforcement 'hami-core' unavailable" in why.reason
