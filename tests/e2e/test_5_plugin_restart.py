"""Story 5: the agent (plugin) restarts: its DaemonSet pod is deleted and replaced.
Running pods keep their slices; new pods never get a slice that is in use."""

from __future__ import annotations

import pytest

from testkit.e2e import (
    Kube,
    assert_consistent,
    container,
    kubelet_devices,
    pod,
    run_shapes,
)

pytestmark = pytest.mark.e2e


def test_story5_agent_pod_deleted_slices_kept_no_reuse(agent: Kube, namespace: str) -> None:
    """Story 5: delete the agent pod; old slices kept (ledger + reconciliation), new pods'
    slices disjoint from those in use."""
    shapes = [(4, 30), (6, 50), (2, 0), (0, 40), (8, 20)]
    before = run_shapes(agent, namespace, shapes)

    old_agent = agent.ready_agent()
    assert old_agent is not None
    agent.replace_agent_pod(old_agent, 120)
    agent.wait_agent_serving()

    # Enough new pods to need the units the old ones hold, if they were forgotten.
    agent.apply(pod(f"new-{i}", namespace, [container("main", 4, 20)]) for i in range(6))
    settled = agent.wait_pods_settled(namespace, timeout=180)
    after = kubelet_devices(agent.env["POD_RESOURCES_SOCKET"])
    for k, v in before.items():
        assert after[k] == v, f"{k} changed its slice across the agent restart"
    old_ids = {i for res in before.values() for ids in res.values() for i in ids}
    for p in settled:
        name = p["metadata"]["name"]
        if name.startswith("new-") and p["status"]["phase"] == "Running":
            ids = {i for ids in after[(namespace, name, "main")].values() for i in ids}
            assert not ids & old_ids, f"{name} got ids in use: {sorted(ids & old_ids)}"
    assert_consistent(agent)
