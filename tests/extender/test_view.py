from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.sharing.annotations import (
    AnnotationError,
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
    assignment_key,
    inventory_key,
    verify_assignment,
)
from gpu_share.sharing.decision import (
    ContainerDecision,
    Decision,
    DecisionError,
    decision_key,
    sign,
    verify_binding,
)
from gpu_share.sharing.model import ContainerRequest, DeviceShare
from gpu_share.sharing.placement import Shape, Workload
from gpu_share.sharing.placement.view import node_slots, pod_usage
from testkit.kube_admin import idle_api

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


# ------------------------------------------------- KubeClusterView: annotation trust (L1)
# The view fed with pod objects as the watch delivers them (no API server): pod
# annotations are tenant-writable, so only those signed for the pod (UID) on its node count.

KEY = b"view-test-key-0123456789abcdef"
DOM = "vendor.com"
MEM, CORE = f"{DOM}/vcuda-memory", f"{DOM}/vcuda-core"
EMPTY_INV = InventoryAnnotation(
    "n1",
    1024,
    (
        InventoryDevice("GPU-0", 0, "T4", 16, 0, 100, 0, True, 0),
        InventoryDevice("GPU-1", 1, "T4", 16, 0, 100, 0, True, 0),
    ),
)
FULL = PodAssignment(
    {
        "c": ContainerAssignment(
            (DeviceShare("GPU-0", 16, 100, True), DeviceShare("GPU-1", 16, 100, True)),
            "node-agent",
        )
    }
)
FOUR = PodAssignment({"c": ContainerAssignment((DeviceShare("GPU-0", 4, 30),), "node-agent")})


def _view() -> KubeClusterView:
    v = KubeClusterView(
        idle_api(),
        domain=DOM,
        memory_resource=MEM,
        core_resource=CORE,
        default_workload=Workload([Shape(4, 30, 1.0)]),
        decision_key=KEY,
    )
    node = {"metadata": {"name": "n1", "annotations": {inventory_key(DOM): EMPTY_INV.encode()}}}
    v._apply("nodes", "ADDED", node)
    return v


def _pod(uid: str, ann: dict[str, str], node: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{uid}", "namespace": "t", "uid": uid, "annotations": ann},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {MEM: "4", CORE: "30"}}}],
        },
        "status": {"phase": "Running"},
    }


def _free(v: KubeClusterView) -> list[tuple[int, int]]:
    n = v.node("n1")
    assert n is not None
    return [(d.memory_free, d.cores_free) for d in n.devices]


def _whole_decision(uid: str) -> str:
    d = Decision(
        uid, "n1", {"c": ContainerDecision(("GPU-0", "GPU-1"), ContainerRequest(32, 200))}, 1
    )
    return sign(d, KEY)


@pytest.mark.parametrize(
    "ann",
    [
        # unsigned, as a tenant (or an agent without the key) writes it
        {assignment_key(DOM): FULL.encode()},
        # signed with a key the tenant made up
        {assignment_key(DOM): FULL.encode(b"tenant-key", pod_uid="u1", node="n1")},
        # the right shape, a made-up or non-ASCII signature
        {assignment_key(DOM): json.dumps({**json.loads(FULL.encode()), "podUID": "u1",
                                          "node": "n1", "sig": "0" * 64})},
        {assignment_key(DOM): json.dumps({**json.loads(FULL.encode()), "podUID": "u1",
                                          "node": "n1", "sig": "é" * 64})},
        {decision_key(DOM): sign(Decision(
            "u1", "n1", {"c": ContainerDecision(("GPU-0", "GPU-1"), ContainerRequest(32, 200))},
            1), b"tenant-key")},
        {decision_key(DOM): "[" * 100_000},  # deep nesting: RecursionError in json
        {assignment_key(DOM): "[" * 100_000},
    ],
    ids=["unsigned", "other-key", "zero-sig", "non-ascii-sig", "forged-decision",
         "nested-decision", "nested-assignment"],
)
def test_forged_annotation_does_not_make_the_node_look_full(ann: dict[str, str]) -> None:
    v = _view()
    v._apply("pods", "ADDED", _pod("u1", ann))
    assert _free(v) == [(16, 100), (16, 100)]  # counted as an unannotated pod: inventory
    assert sum(v.untrusted.values()) == 1


def test_genuine_annotations_count_and_a_copy_on_another_pod_does_not() -> None:
    v = _view()
    genuine = {assignment_key(DOM): FOUR.encode(KEY, pod_uid="u1", node="n1")}
    v._apply("pods", "ADDED", _pod("u1", genuine))
    assert _free(v) == [(12, 70), (16, 100)]  # the inventory lags: the assignment counts
    v._apply("pods", "ADDED", _pod("u2", genuine))  # a tenant copies it onto its pod
    assert _free(v) == [(12, 70), (16, 100)]
    assert v.untrusted == {"UidMismatch": 1}
    # A genuine decision counts the same way, and its copy does not either.
    whole = {decision_key(DOM): _whole_decision("u3")}
    v._apply("pods", "ADDED", _pod("u3", whole))
    assert _free(v) == [(0, 0), (0, 0)]
    v._apply("pods", "DELETED", _pod("u3", whole))
    v._apply("pods", "ADDED", _pod("u4", whole))
    assert _free(v) == [(12, 70), (16, 100)]
    assert v.untrusted == {"UidMismatch": 2}


def test_genuine_annotation_signed_for_another_node_does_not_count() -> None:
    v = _view()
    ann = {assignment_key(DOM): FOUR.encode(KEY, pod_uid="u1", node="n2")}
    v._apply("pods", "ADDED", _pod("u1", ann))
    assert _free(v) == [(16, 100), (16, 100)] and v.untrusted == {"NodeMismatch": 1}


def test_forged_assignment_cannot_hide_a_genuine_decision() -> None:
    # Making the node look EMPTY: an assignment that decodes would win over the decision.
    v = _view()
    ann = {
        assignment_key(DOM): PodAssignment({}).encode(),
        decision_key(DOM): _whole_decision("u1"),
    }
    v._apply("pods", "ADDED", _pod("u1", ann))
    assert _free(v) == [(0, 0), (0, 0)]


def test_forged_annotation_does_not_drop_a_bind_reservation() -> None:
    v = _view()
    pending = _pod("u1", {}, node="")
    pending["spec"].pop("nodeName")
    pending["status"]["phase"] = "Pending"
    v._apply("pods", "ADDED", pending)
    v.reserve("u1", "n1", {"GPU-0": (4, 30)})
    assert _free(v) == [(12, 70), (16, 100)]
    # Bound with a forged (empty) assignment: the reservation still counts ...
    v._apply("pods", "MODIFIED", _pod("u1", {assignment_key(DOM): PodAssignment({}).encode()}))
    assert _free(v) == [(12, 70), (16, 100)]
    v.reserve("u1", "n1", {"GPU-0": (4, 30)})  # ... and a later reserve is kept, too
    assert _free(v) == [(12, 70), (16, 100)]
    # ... until the genuine one arrives and takes over.
    v._apply("pods", "MODIFIED", _pod("u1", {
        assignment_key(DOM): FOUR.encode(KEY, pod_uid="u1", node="n1")}))
    assert _free(v) == [(12, 70), (16, 100)] and "u1" not in v._pending


def test_untrusted_annotations_are_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    seen: list[str] = []
    v = KubeClusterView(
        idle_api(), domain=DOM, memory_resource=MEM, core_resource=CORE,
        default_workload=Workload([Shape(4, 30, 1.0)]), decision_key=KEY,
        clock=lambda: now[0], on_untrusted=seen.append,
    )
    caplog.set_level("WARNING", logger="gpu_share.kube.view_trust")
    for i in range(50):
        v._apply("pods", "ADDED", _pod(f"u{i}", {assignment_key(DOM): FULL.encode()}))
    now[0] = 61.0
    v._apply("pods", "ADDED", _pod("late", {assignment_key(DOM): FULL.encode()}))
    lines = [r for r in caplog.records if "do not verify" in r.getMessage()]
    assert len(lines) == 2 and "50 ignored" in lines[1].getMessage()
    assert seen == ["BadSignature"] * 51


def test_signed_assignment_round_trip_and_binding() -> None:
    text = FOUR.encode(KEY, pod_uid="u1", node="n1")
    assert verify_assignment(text, KEY, "u1", "n1") == FOUR
    assert PodAssignment.decode(text) == FOUR  # readers that ignore the signature still work
    for args, reason in [
        ((KEY, "u2", "n1"), "UidMismatch"),
        ((KEY, "", "n1"), "UidMismatch"),
        ((KEY, "u1", "n2"), "NodeMismatch"),
        ((b"other", "u1", "n1"), "BadSignature"),
        ((b"", "u1", "n1"), "BadSignature"),
    ]:
        with pytest.raises(AnnotationError) as e:
            verify_assignment(text, *args)
        assert e.value.reason == reason
    raw = json.loads(text)
    raw["containers"]["c"]["devices"][0]["memoryUnits"] = 16  # tampered content
    with pytest.raises(AnnotationError) as e:
        verify_assignment(json.dumps(raw), KEY, "u1", "n1")
    assert e.value.reason == "BadSignature"
    # A decision's signature never passes as an assignment's (separate MAC context).
    with pytest.raises(AnnotationError):
        verify_assignment(_whole_decision("u1"), KEY, "u1", "n1")
    with pytest.raises(DecisionError) as de:
        verify_binding(_whole_decision("u1"), KEY, "u1", "n2")
    assert de.value.reason == "NodeMismatch"


def test_a_second_bind_elsewhere_keeps_the_first_reservation() -> None:
    """A bind of unknown outcome keeps its reservation; the scheduler retrying the pod on
    another node must not drop it (the first may still land)."""
    v = _view()
    other = {"metadata": {"name": "n2", "annotations": {
        inventory_key(DOM): EMPTY_INV.encode().replace('"n1"', '"n2"')}}}
    v._apply("nodes", "ADDED", other)
    pending = _pod("u1", {}, node="")
    pending["spec"].pop("nodeName")
    pending["status"]["phase"] = "Pending"
    v._apply("pods", "ADDED", pending)
    v.reserve("u1", "n1", {"GPU-0": (4, 30)})
    v.reserve("u1", "n2", {"GPU-1": (8, 50)})
    assert _free(v) == [(12, 70), (16, 100)]
    n2 = v.node("n2")
    assert n2 is not None and [(d.memory_free, d.cores_free) for d in n2.devices] == [
        (16, 100), (8, 50)]
    v.unreserve("u1", "n2")  # the second was refused: only its own reservation goes
    assert _free(v) == [(12, 70), (16, 100)]
    # Bound (with its genuine assignment) on n1: nothing is pending any more.
    v._apply("pods", "MODIFIED", _pod("u1", {
        assignment_key(DOM): FOUR.encode(KEY, pod_uid="u1", node="n1")}))
    assert "u1" not in v._pending


def test_an_assignment_signed_with_the_previous_key_counts_during_a_rotation() -> None:
    v = KubeClusterView(
        idle_api(), domain=DOM, memory_resource=MEM, core_resource=CORE,
        default_workload=Workload([Shape(4, 30, 1.0)]), decision_key=b"the-new-key-0123456",
        previous_keys=(KEY,),
    )
    v._apply("nodes", "ADDED", {"metadata": {"name": "n1", "annotations": {
        inventory_key(DOM): EMPTY_INV.encode()}}})
    v._apply("pods", "ADDED", _pod("u1", {
        assignment_key(DOM): FOUR.encode(KEY, pod_uid="u1", node="n1")}))
    assert _free(v) == [(12, 70), (16, 100)] and not v.untrusted
    v._apply("pods", "ADDED", _pod("u2", {
        assignment_key(DOM): FOUR.encode(b"some-other-key-99999", pod_uid="u2", node="n1")}))
    assert v.untrusted == {"BadSignature": 1}
