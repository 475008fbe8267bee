"""Story 2: a pod asking for `vendor.com/vcuda-memory: 4` (and one also asking for
`vendor.com/vcuda-core: 30`) runs and sees exactly one device; the pod annotation, the node
inventory and the kubelet agree with what the container sees."""

from __future__ import annotations

import pytest

from testkit.e2e import (
    CORE,
    MEM,
    Kube,
    assert_consistent,
    assignment,
    container,
    device_of,
    kubelet_devices,
    pod,
)
from testkit.harness import wait_until

pytestmark = pytest.mark.e2e


def test_story2_pod_sees_its_slice_and_annotations_agree(agent: Kube, namespace: str) -> None:
    """Story 2: memory 4 / memory 4 + cores 30: one device, same in env, pod annotation,
    node inventory and the kubelet's PodResources."""
    shapes = {"mem4": (4, 0), "mem4-core30": (4, 30)}
    agent.apply(pod(n, namespace, [container("main", m, c)]) for n, (m, c) in shapes.items())
    for n in shapes:
        agent.kubectl(
            "-n",
            namespace,
            "wait",
            "--for=condition=Ready",
            f"pod/{n}",
            "--timeout=120s",
            timeout=150,
        )
    held = kubelet_devices(agent.env["POD_RESOURCES_SOCKET"])
    index_of = {d["id"]: d["index"] for d in agent.inventory()["devices"]}
    inventory_ids = set(index_of)
    for n, (mem, cores) in shapes.items():
        seen = wait_until(f"{n} printed its env", lambda n=n: agent.seen(namespace, n, "main"), 60)
        visible = seen["visible"]
        assert visible and "," not in visible, f"{n} sees {visible!r}, want one device"
        assert visible in inventory_ids
        assert seen["ids"] == visible
        # passDeviceSpecs (local-cluster.yaml): exactly that device's node.
        assert seen["nodes"] == f"dummy-npu{index_of[visible]}"
        assert seen["mem"] == str(mem * 1024)
        assert seen["cores"] == (str(cores) if cores else "")

        ids = held[(namespace, n, "main")]
        assert len(ids[MEM]) == mem and len(ids.get(CORE, ())) == cores
        assert {device_of(i) for ids_ in ids.values() for i in ids_} == {visible}

        p = wait_until(
            f"{n} annotated",
            lambda n=n: (q := agent.get("pod", "-n", namespace, n)) and assignment(q) and q,
            30,
        )
        ann = assignment(p)["main"]["devices"]
        assert [(d["id"], d["memoryUnits"], d["cores"], d["exclusive"]) for d in ann] == [
            (visible, mem, cores, False)
        ]
    assert_consistent(agent)
