"""Story on the real node: with the extender, a pod that no single device can
hold stays Pending with a clear reason instead of failing admission at the kubelet; pods
that fit run on the device the extender chose (signed decision followed by the agent).

Real kubelet, real agent (host process, dummy backend: 2 devices x 8 units), real second
kube-scheduler calling the extender. Needs the local cluster (hack/local-up-cluster.sh).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_share.sharing.placement import Shape, Workload
from testkit.harness import wait_until
from testkit.host_agent import HostAgent
from testkit.scheduler import CORE, MEM, extender_and_scheduler, live_space

pytestmark = pytest.mark.cluster

KEY = b"pending-story-key-0123456789abcdef"
ASSIGNMENT = "gpu-share.vendor.com/assignment"


def _pod(name: str, sched: str, mem: int) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": sched,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/busybox:local",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo $DUMMY_VISIBLE_DEVICES; sleep 600"],
                    "resources": {"limits": {MEM: str(mem), CORE: "10"}},
                }
            ],
        },
    }


def test_pod_that_fits_no_single_device_stays_pending_with_a_reason(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    space = live_space(request, "pending story", "pending")
    env, kubeconfig, core = space.env, space.kubeconfig, space.core
    ns, sched_name = space.ns, space.sched_name
    (tmp_path / "key").write_bytes(KEY)
    agent = HostAgent(
        env,
        tmp_path,
        devices=2,
        units=8,
        metrics_port=19481,
        extra_env={"GPU_SHARE_PLACEMENT__DECISION_KEY_FILE": str(tmp_path / "key")},
    )
    workload = Workload([Shape(5, 10, 1.0), Shape(6, 10, 1.0)])
    try:
        agent.start()
        # The extender sees the node through the agent's inventory annotation.
        key = "gpu-share.vendor.com/inventory"
        wait_until(
            "the inventory annotation on the node",
            lambda: key in (core.read_node(env["NODE_NAME"]).metadata.annotations or {}),
            60,
            0.5,
        )
        core.create_namespace({"metadata": {"name": ns}})
        with extender_and_scheduler(
            kubeconfig,
            space.sched_bin,
            tmp_path,
            sched_name,
            workload,
            KEY,
        ):
            for name in ("fill-a", "fill-b"):  # 5 + 5 units: 3 + 3 left on two devices
                core.create_namespaced_pod(ns, _pod(name, sched_name, 5))
            devices = set()
            for name in ("fill-a", "fill-b"):
                pod = _wait(core, ns, name, lambda p: p.status.phase == "Running", 120)
                doc = json.loads(pod.metadata.annotations[ASSIGNMENT])
                main = doc["containers"]["main"]
                assert main["source"] == "extender", doc  # the agent followed the decision
                devices.add(main["devices"][0]["id"])
            assert len(devices) == 2
            # 6 free units on the node in total, but no device has 6: the node-total view
            # of the default scheduler would send it to the kubelet to fail admission.
            core.create_namespaced_pod(ns, _pod("too-big", sched_name, 6))
            pod = _wait(core, ns, "too-big", _unschedulable, 60)
            assert pod.spec.node_name is None and pod.status.phase == "Pending"
            msgs = _event_messages(core, ns, "too-big")
            assert any("6" in m and "memory" in m for m in msgs), msgs
            time.sleep(3)  # and it stays that way
            pod = core.read_namespaced_pod("too-big", ns)
            assert pod.spec.node_name is None and pod.status.phase == "Pending"
    finally:
        subprocess.run(
            [
                env["KUBECTL"],
                "--kubeconfig",
                kubeconfig,
                "delete",
                "namespace",
                ns,
                "--wait=true",
                "--timeout=90s",
            ],
            capture_output=True,
            timeout=120,
        )
        agent.stop()


def _unschedulable(pod: object) -> bool:
    conds = pod.status.conditions or []  # type: ignore[attr-defined]
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)


def _wait(core: Any, ns: str, name: str, pred: Callable[[Any], bool], timeout: float) -> Any:
    """The pod once ``pred`` holds; fails at once if it Failed."""

    def check() -> Any:
        pod = core.read_namespaced_pod(name, ns)
        if pred(pod):
            return pod
        assert pod.status.phase != "Failed", f"{ns}/{name} failed: {pod.status.message}"
        return None

    return wait_until(f"{ns}/{name}", check, timeout, 0.5)


def _event_messages(core: object, ns: str, name: str) -> list[str]:
    evs = core.list_namespaced_event(  # type: ignore[attr-defined]
        ns, field_selector=f"involvedObject.name={name}"
    )
    return [e.message or "" for e in evs.items]
