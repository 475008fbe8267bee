from __future__ import annotations

from gpu_share.sharing.annotations import (
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
    assignment_key,
)
from gpu_share.sharing.decision import ContainerDecision, Decision, decision_key, sign
from gpu_share.sharing.model import ContainerRequest, DeviceShare
from gpu_share.sharing.placement.view import node_slots, pod_usage

INV = InventoryAnnotation(
    "n1",
    1024,
    (
        InventoryDevice("GPU-0", 0, "T4", 16, 2, 100, 10, True, 0),
        InventoryDevice("GPU-1", 1, "T4", 16, 0, 100, 0, True, 0),
    ),
)
TOTALS = {"GPU-0": (16, 100), "GPU-1": (16, 100)}


def test_assignment_wins_over_decision_and_max_with_inventory() -> None:
    ann = {
        assignment_key("d"): PodAssignment(
            {"c": ContainerAssignment((DeviceShare("GPU-0", 4, 30),), "node-agent")}
        ).encode(),
        decision_key("d"): sign(
            Decision("u", "n1", {"c": ContainerDecision(("GPU-1",), ContainerRequest(4, 30))}, 1),
            b"k",
        ),
    }
    u = pod_usage(ann, "d", TOTALS)
    assert u == {"GPU-0": (4, 30)}
    slots = node_slots(INV, [u])
    # GPU-0: pods hold 4/30, inventory says 2/10 used: the larger side counts.
    assert [(d.memory_free, d.cores_free) for d in slots.devices] == [(12, 70), (16, 100)]


def test_decision_of_whole_device_takes_it_all() -> None:
    ann = {
        decision_key("d"): sign(
            Decision("u", "n1", {"c": ContainerDecision(("GPU-1",), ContainerRequest(16, 100))}, 1),
            b"k",
        )
    }
    slots = node_slots(INV, [pod_usage(ann, "d", TOTALS)])
    assert slots.devices[1].memory_free == 0 and slots.devices[1].cores_free == 0
