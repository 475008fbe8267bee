"""Story 6: a device turns unhealthy (dummy backend fault file, set with the admin CLI in
the agent pod): allocatable drops by its units and no new pod lands on it; clearing the
fault brings it back."""

from __future__ import annotations

import pytest

from testkit.e2e import (
    CORE,
    DEVICES,
    MEM,
    UNITS_PER_DEVICE,
    Kube,
    assert_consistent,
    assignment,
    container,
    pod,
)
from testkit.harness import wait_until

pytestmark = pytest.mark.e2e

FAULT_FILE = "/var/lib/gpu-share-cluster/gpu-share-state/dummy-faults.json"


def test_story6_device_fault_withdraws_units_then_recovers(agent: Kube, namespace: str) -> None:
    """Story 6: fault one device: allocatable -16 units / -100 cores, new pods avoid it;
    clear: allocatable back to full."""
    full = {MEM: DEVICES * UNITS_PER_DEVICE, CORE: DEVICES * 100}
    devices = sorted(agent.inventory()["devices"], key=lambda d: d["index"])
    victim = devices[-1]["id"]
    try:
        agent.agent_exec("gpu-share", "fault", "set", FAULT_FILE, victim)
        wait_until(
            "allocatable without the faulty device",
            lambda: (
                agent.node_resources()["allocatable"]
                == {MEM: full[MEM] - UNITS_PER_DEVICE, CORE: full[CORE] - 100}
            ),
            60,
        )
        assert agent.node_resources()["capacity"] == full
        wait_until(
            "inventory marks it unhealthy",
            lambda: (
                [d["healthy"] for d in agent.inventory()["devices"] if d["id"] == victim] == [False]
            ),
            30,
        )
        # Three devices of 16 units are left: 6 pods x 8 units fill them exactly.
        agent.apply(pod(f"p{i}", namespace, [container("main", 8, 10)]) for i in range(6))
        agent.wait_ready(namespace, 180)
        for p in agent.pods(namespace):
            ann = wait_until(
                "annotation",
                lambda p=p: assignment(agent.get("pod", "-n", namespace, p["metadata"]["name"])),
                30,
            )
            assert victim not in {d["id"] for d in ann["main"]["devices"]}
        assert_consistent(agent)
    finally:
        agent.agent_exec("gpu-share", "fault", "clear", FAULT_FILE, check=False)
    wait_until(
        "allocatable back to full", lambda: agent.node_resources()["allocatable"] == full, 60
    )
    # The recovered device takes new work again.
    agent.apply([pod("after-clear", namespace, [container("main", 8, 10)])])
    agent.kubectl(
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready",
        "pod/after-clear",
        "--timeout=120s",
        timeout=150,
    )
    ann = wait_until(
        "annotation", lambda: assignment(agent.get("pod", "-n", namespace, "after-clear")), 30
    )
    assert [d["id"] for d in ann["main"]["devices"]] == [victim]
