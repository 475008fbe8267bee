"""GPU-model requirements through the extender over real HTTP on 127.0.0.1 (fake view)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from gpu_share.sharing.placement import (
    DeviceSlot,
    ModelReq,
    NodeSlots,
    Shape,
    Workload,
)
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL, models_key
from tests.extender.test_http import fgd_extender, post, serving

KEY = b"secret-key-for-tests"
MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"


def slots(name: str, model: str, free: int = 16) -> NodeSlots:
    devs = tuple(DeviceSlot(f"{name}-{i}", i, 16, free, 100, 100 if free else 0) for i in (0, 1))
    return NodeSlots(name, devs, model=model)


class View:
    def __init__(self) -> None:
        self.slots = {
            "a100-1": slots("a100-1", "NVIDIA-A100-SXM4-80GB"),
            "t4-1": slots("t4-1", "Tesla-T4"),
            "t4-2": slots("t4-2", "Tesla-T4"),
        }

    def nodes(self, names: Sequence[str]) -> dict[str, NodeSlots | None]:
        return {n: self.node(n) for n in names}

    def node(self, name: str) -> NodeSlots | None:
        return self.slots.get(name)

    def workload(self) -> Workload:
        # Half the demand may run anywhere, half needs the A100.
        return Workload(
            [
                Shape(8, 50, 1.0),
                Shape(16, 100, 1.0, models=ModelReq.parse("NVIDIA-A100-SXM4-80GB")),
            ]
        )

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        pass

    def unreserve(self, pod_uid: str, node: str) -> None:
        pass

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None


class Binder:
    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    from gpu_share.extender.http import make_server

    ext = fgd_extender(View(), Binder())  # test_http's key and resources: the same as here
    with serving(make_server(ext, "127.0.0.1", 0)) as base:
        yield base


def kpod(mem: int, cores: int, ann: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": ann or {}},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {MEM: str(mem), CORE: str(cores)}}}
            ],
            **spec,
        },
    }


NAMES = ["a100-1", "t4-1", "t4-2"]


def test_annotation_filters_to_allowed_models_with_a_reason(url: str) -> None:
    pod = kpod(8, 50, {models_key("vendor.com"): "Tesla T4"})  # NVML spelling is fine
    got = post(url + "/filter", {"Pod": pod, "NodeNames": NAMES})
    assert got["NodeNames"] == ["t4-1", "t4-2"]
    reason = got["FailedNodes"]["a100-1"]
    assert reason.startswith("gpu-share: device model 'NVIDIA-A100-SXM4-80GB' is not one")
    assert "Tesla-T4" in reason


def test_no_allowed_model_fails_every_node(url: str) -> None:
    pod = kpod(8, 50, {models_key("vendor.com"): "H100-80GB-HBM3"})
    got = post(url + "/filter", {"Pod": pod, "NodeNames": NAMES})
    assert got["NodeNames"] == [] and set(got["FailedNodes"]) == set(NAMES)


def test_node_selector_on_the_product_label_is_honoured(url: str) -> None:
    pod = kpod(8, 50, nodeSelector={DEFAULT_MODEL_LABEL: "NVIDIA-A100-SXM4-80GB"})
    got = post(url + "/filter", {"Pod": pod, "NodeNames": NAMES})
    assert got["NodeNames"] == ["a100-1"]


def test_flexible_pod_is_scored_off_the_scarce_model(url: str) -> None:
    # Any model will do: the A100 is kept for the pods that can only use it.
    scores = post(url + "/prioritize", {"Pod": kpod(8, 50), "NodeNames": NAMES})
    best = max(scores, key=lambda s: s["Score"])
    assert best["Host"] == "t4-1"
    assert {s["Host"]: s["Score"] for s in scores}["a100-1"] < best["Score"]


def test_malformed_models_annotation_is_an_error_not_a_crash(url: str) -> None:
    pod = kpod(8, 50, {models_key("vendor.com"): "x" * 10_000})
    got = post(url + "/filter", {"Pod": pod, "NodeNames": NAMES})
    assert got["Error"] and len(got["Error"]) < 200


def test_cluster_view_names_models_by_label_and_counts_requirements() -> None:
    from gpu_share.sharing.annotations import InventoryAnnotation, InventoryDevice, inventory_key
    from tests.kube.test_cluster_view_cache import new_view  # the same KEY, MEM and CORE

    view = new_view()

    def knode(name: str, labels: dict[str, str]) -> dict[str, Any]:
        dev = InventoryDevice(f"{name}-0", 0, "Tesla T4", 16, 0, 100, 0, True, 0)
        inv = InventoryAnnotation(name, 1024, (dev,)).encode()
        return {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {inventory_key("vendor.com"): inv},
            }
        }

    view._apply("nodes", "ADDED", knode("gfd", {DEFAULT_MODEL_LABEL: "NVIDIA-T4-SHARED"}))
    view._apply("nodes", "ADDED", knode("plain", {}))
    assert view.node("gfd").model == "NVIDIA-T4-SHARED"  # type: ignore[union-attr]
    assert view.node("plain").model == "Tesla-T4"  # type: ignore[union-attr]

    bound = kpod(8, 50, {models_key("vendor.com"): "Tesla-T4"})
    free = kpod(8, 50)
    free["metadata"]["uid"] = "u2"
    for p in (bound, free):
        view._apply("pods", "ADDED", p)
    w = view.workload()
    assert {str(s.models) for s in w.shapes} == {"any", "Tesla-T4"}
    assert w.pressure  # bound demand: the policy prices the T4's capacity
