"""Story 1: `helm install` with the dummy backend runs the agent under the chart's own
ServiceAccount and RBAC, the node advertises the devices, and `helm test` passes."""

from __future__ import annotations

import pytest

from testkit.e2e import (
    AGENT_NS,
    CORE,
    DEVICES,
    MEM,
    RELEASE,
    SERVICE_ACCOUNT,
    UNITS_PER_DEVICE,
    Kube,
)

pytestmark = pytest.mark.e2e


def _can(kube: Kube, verb: str, resource: str) -> bool:
    proc = kube.kubectl(
        "auth",
        "can-i",
        verb,
        resource,
        f"--as=system:serviceaccount:{AGENT_NS}:{SERVICE_ACCOUNT}",
        check=False,
    )
    return proc.stdout.strip() == "yes"


def test_story1_helm_install_agent_runs_with_chart_rbac_and_node_advertises(agent: Kube) -> None:
    """Story 1: agent pod under the chart's ServiceAccount (not admin), node capacity and
    allocatable show both resources with the expected counts, `helm test` passes."""
    pod = agent.ready_agent()
    assert pod is not None
    assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["containers"][0]["image"] == "localhost/gpu-share:dev"

    # What the agent needs, and nothing of an admin's.
    for verb, res in [
        ("patch", "nodes"),
        ("get", "nodes"),
        ("watch", "pods"),
        ("patch", "pods"),
        ("create", "events"),
    ]:
        assert _can(agent, verb, res), f"agent SA cannot {verb} {res}"
    for verb, res in [
        ("*", "*"),
        ("delete", "pods"),
        ("create", "pods"),
        ("get", "secrets"),
        ("delete", "nodes"),
        ("create", "clusterrolebindings"),
        ("update", "daemonsets.apps"),
    ]:
        assert not _can(agent, verb, res), f"agent SA can {verb} {res}: too much"
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": AGENT_NS}
    for crb in agent.get("clusterrolebindings")["items"]:
        if subject in (crb.get("subjects") or []):
            assert crb["roleRef"]["name"] not in ("cluster-admin", "admin", "edit")

    want = {MEM: DEVICES * UNITS_PER_DEVICE, CORE: DEVICES * 100}
    res = agent.node_resources()
    assert res["capacity"] == want
    assert res["allocatable"] == want

    # The agent wrote the node inventory with its own token (hostNetwork + SA token).
    inv = agent.inventory()
    assert inv["node"] == agent.node and inv["unitMiB"] == 1024
    assert len(inv["devices"]) == DEVICES
    assert all(
        d["healthy"] and d["memoryUnits"]["total"] == UNITS_PER_DEVICE for d in inv["devices"]
    )

    out = agent.helm("test", RELEASE, "-n", AGENT_NS, "--timeout", "120s", timeout=180)
    assert "Phase:          Succeeded" in out.stdout or "Succeeded" in out.stdout, out.stdout
