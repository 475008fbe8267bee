"""Story 7: `helm upgrade` with a changed per-pool value rolls the agent and keeps
existing allocations consistent; a unit-size change on a pool without pods takes effect;
`helm uninstall` removes the agent and its sockets and the node withdraws the resources."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.e2e import (
    CORE,
    DEVICES,
    MEM,
    Kube,
    assert_consistent,
    container,
    kubelet_devices,
    pod,
    pool_values,
)
from testkit.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SOCKETS = ("gpu-share-vcuda-memory.sock", "gpu-share-vcuda-core.sock")


def test_story7_upgrade_rolls_agent_keeps_allocations_uninstall_withdraws(
    agent: Kube, namespace: str, tmp_path: Path
) -> None:
    """Story 7: upgrade (placement policy of the pool) rolls the pod, allocations stay;
    upgrade (memory unit 2048 MiB, no pods) changes the advertised units; uninstall removes
    the agent, its sockets and the node's allocatable."""
    agent.apply(pod(f"w{i}", namespace, [container("main", 4, 25)]) for i in range(3))
    agent.wait_ready(namespace)
    before = agent.namespace_devices(namespace)
    old = agent.ready_agent()
    assert old is not None

    agent.install(
        "-f", pool_values(tmp_path, {"placement": {"policy": "spread"}}), action="upgrade"
    )
    wait_until(
        "the agent pod rolled",
        lambda: (p := agent.ready_agent()) and p["metadata"]["uid"] != old["metadata"]["uid"],
        180,
    )
    agent.wait_agent_serving()
    cfg = agent.agent_exec("cat", "/etc/gpu-share/config.yaml").stdout
    assert "spread" in cfg, cfg
    after = kubelet_devices(agent.env["POD_RESOURCES_SOCKET"])
    for k, v in before.items():
        assert after[k] == v
    assert_consistent(agent)
    agent.apply([pod("after-upgrade", namespace, [container("main", 4, 25)])])
    agent.kubectl(
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready",
        "pod/after-upgrade",
        "--timeout=120s",
        timeout=150,
    )
    assert_consistent(agent)

    # Unit size: only on a pool whose node runs no slices.
    agent.kubectl("-n", namespace, "delete", "pod", "--all", "--wait=true", timeout=180)
    wait_until(
        "no slice left",
        lambda: (
            not any(k[0] == namespace for k in kubelet_devices(agent.env["POD_RESOURCES_SOCKET"]))
        ),
        60,
    )
    old = agent.ready_agent()
    assert old is not None
    agent.install("-f", pool_values(tmp_path, {"memoryUnitMiB": 2048}), action="upgrade")
    wait_until(
        "allocatable in 2 GiB units",
        lambda: agent.node_resources()["allocatable"] == {MEM: DEVICES * 8, CORE: DEVICES * 100},
        180,
    )
    agent.apply([pod("big-units", namespace, [container("main", 2, 0)])])
    agent.kubectl(
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready",
        "pod/big-units",
        "--timeout=120s",
        timeout=150,
    )
    seen = wait_until("env", lambda: agent.seen(namespace, "big-units", "main"), 60)
    assert seen["mem"] == "4096"
    agent.kubectl("-n", namespace, "delete", "pod", "--all", "--wait=true", timeout=180)

    plugin_dir = Path(agent.env["DEVICE_PLUGIN_DIR"])
    agent.uninstall()
    assert not agent.agent_pods()
    for s in SOCKETS:
        wait_until(f"{s} removed", lambda s=s: not (plugin_dir / s).exists(), 60)
    wait_until(
        "allocatable withdrawn",
        lambda: agent.node_resources()["allocatable"] == {MEM: 0, CORE: 0},
        120,
    )
