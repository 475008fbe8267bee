"""GPU-model requirements with the real kube-scheduler and the extender.

Four Node objects (no kubelet: pods are bound, never run), two per GPU model, each with
the GPU-product label and the agent's inventory annotation; the in-process extender and
a second kube-scheduler (the local cluster's cached binary). Pods restricted by a
nodeSelector on the product label (kube-scheduler filters) or by the gpu-share models
annotation (the extender filters) are bound only to nodes of an allowed model; a pod
asking for a model no node has stays Pending with the extender's reason.

Needs the local cluster (hack/local-up-cluster.sh up); cleans up its nodes and pods.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpu_share.sharing.annotations import InventoryAnnotation, InventoryDevice, inventory_key
from gpu_share.sharing.placement import ModelReq, Shape, Workload
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL, models_key
from testkit.harness import wait_until
from testkit.scheduler import CORE, MEM, extender_and_scheduler, live_space
from tests.extender.test_real_scheduler import _wait_placed

pytestmark = pytest.mark.cluster

KEY = b"model-scheduler-test-key-0123456789"
T4, A100 = "Tesla-T4", "NVIDIA-A100-SXM4-80GB"
UNITS = 100


def _node(core: Any, name: str, tag: str, model: str) -> None:
    inv = InventoryAnnotation(
        name,
        1024,
        tuple(
            # The inventory carries NVML's spelling; the label is what requirements name.
            InventoryDevice(
                f"{name}-gpu{i}", i, model.replace("-", " "), UNITS, 0, UNITS, 0, True, 0
            )
            for i in range(2)
        ),
    )
    core.create_node(
        {
            "metadata": {
                "name": name,
                "labels": {"gs-models": tag, DEFAULT_MODEL_LABEL: model},
                "annotations": {inventory_key("vendor.com"): inv.encode()},
            }
        }
    )
    cap = {"cpu": "32", "memory": "128Gi", "pods": "110", MEM: "200", CORE: "200"}
    core.patch_node_status(name, {"status": {"capacity": cap, "allocatable": cap}})


def _pod(name: str, sched: str, tag: str, units: int, **extra: Any) -> dict[str, Any]:
    selector = {"gs-models": tag, **extra.pop("selector", {})}
    return {
        "metadata": {"name": name, "annotations": extra.pop("annotations", {})},
        "spec": {
            "schedulerName": sched,
            "nodeSelector": selector,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {MEM: str(units), CORE: str(units)}},
                }
            ],
        },
    }


def test_model_restricted_pods_land_on_allowed_models_or_stay_pending(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    space = live_space(request, "real-scheduler test", "models")
    core, tag, ns, sched_name = space.core, space.tag, space.ns, space.sched_name
    models = {f"gsm{tag}-t4-{i}": T4 for i in range(2)} | {
        f"gsm{tag}-a100-{i}": A100 for i in range(2)
    }
    workload = Workload([Shape(50, 50, 1.0), Shape(UNITS, UNITS, 1.0, models=ModelReq.parse(A100))])
    created: list[str] = []
    try:
        core.create_namespace({"metadata": {"name": ns}})
        for name, model in models.items():
            _node(core, name, tag, model)
            created.append(name)
        with extender_and_scheduler(
            space.kubeconfig,
            space.sched_bin,
            tmp_path,
            sched_name,
            workload,
            KEY,
        ) as sched:
            placed: dict[str, str | None] = {}
            wanted = {
                # kube-scheduler's NodeAffinity filters these on the product label
                **{f"sel-{i}": (A100, {"selector": {DEFAULT_MODEL_LABEL: A100}}) for i in range(3)},
                # only the extender knows this annotation (and the A100 nodes sort first:
                # an extender ignoring it would pick them)
                **{
                    f"ann-{i}": (T4, {"annotations": {models_key("vendor.com"): T4}})
                    for i in range(3)
                },
            }
            for name, (_, extra) in wanted.items():
                core.create_namespaced_pod(ns, _pod(name, sched_name, tag, 50, **extra))
                placed[name] = _wait_placed(core, ns, name, timeout=30.0)
                assert sched.poll() is None, (tmp_path / "sched.log").read_text()[-3000:]
            for name, (model, _) in wanted.items():
                assert placed[name] is not None, f"{name} was not placed"
                assert models[placed[name]] == model, (name, placed[name])

            # No node has an H100: Pending, and the event says why.
            ann = {"annotations": {models_key("vendor.com"): "NVIDIA-H100-80GB-HBM3"}}
            core.create_namespaced_pod(ns, _pod("h100", sched_name, tag, 50, **ann))
            assert _wait_placed(core, ns, "h100", timeout=30.0) is None
            msgs = _event_messages(core, ns, "h100")
            assert any("is not one the pod accepts" in m for m in msgs), msgs
            time.sleep(2)  # and it stays that way
            assert core.read_namespaced_pod("h100", ns).spec.node_name is None
    finally:
        space.remove_unrun(created)


def _event_messages(core: Any, ns: str, name: str) -> list[str]:
    def messages() -> list[str]:
        evs = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        return [e.message or "" for e in evs.items]

    return wait_until(f"events of {ns}/{name}", messages, 15, 0.5, fail=False)
