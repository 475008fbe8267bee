"""Story 4: the kubelet restarts. The agent re-registers within seconds, running pods
keep their slices, and a new pod gets a slice that does not overlap theirs."""

from __future__ import annotations

import sys
import time

import pytest

from testkit.e2e import (
    DEVICES,
    MEM,
    UNITS_PER_DEVICE,
    Kube,
    assert_consistent,
    assert_pods_kept,
    container,
    kubelet_devices,
    pod,
    pod_uids,
)
from testkit.harness import cluster_cmd, wait_until

pytestmark = pytest.mark.e2e


def _advertised(agent: Kube) -> bool:
    from gpu_share.plugin.podresources import PodResourcesClient

    client = PodResourcesClient(
        agent.env["POD_RESOURCES_SOCKET"], timeout_s=2, resource_names=(MEM,)
    )
    try:
        return len(client.allocatable().get(MEM, ())) == DEVICES * UNITS_PER_DEVICE
    except Exception:
        return False
    finally:
        client.close()


def test_story4_kubelet_restart_plugin_reregisters_slices_kept(agent: Kube, namespace: str) -> None:
    """Story 4: restart the kubelet; re-registration within seconds, old slices kept,
    new slice disjoint from them."""
    agent.apply(pod(f"before-{i}", namespace, [container("main", 4, 30)]) for i in range(3))
    agent.wait_ready(namespace)
    before = agent.namespace_devices(namespace)
    assert len(before) == 3
    uids = pod_uids(agent, namespace)

    cluster_cmd("restart-kubelet", timeout=240)
    t0 = time.monotonic()
    wait_until(
        "the new kubelet lists our devices as allocatable",
        lambda: _advertised(agent),
        60,
        interval=0.5,
    )
    took = time.monotonic() - t0
    sys.stderr.write(f"\nstory 4: re-registered {took:.1f}s after the kubelet came back\n")
    assert took < 30

    assert_pods_kept(agent, namespace, before, uids, "the kubelet restart")

    agent.apply([pod("after", namespace, [container("main", 4, 30)])])
    agent.kubectl(
        "-n", namespace, "wait", "--for=condition=Ready", "pod/after", "--timeout=120s", timeout=150
    )
    held = kubelet_devices(agent.env["POD_RESOURCES_SOCKET"])
    new = {i for ids in held[(namespace, "after", "main")].values() for i in ids}
    old = {i for res in before.values() for ids in res.values() for i in ids}
    assert new and not new & old
    assert_consistent(agent)
