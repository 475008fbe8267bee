"""Story 8: security. With the chart's admission policies, the agent's own (pod-bound)
token may write its own node and pods bound to it, but not another node nor pods on
another node; a token without the node claim may write nothing. Nobody else may write
gpu-share annotations (a pod carrying a forged assignment is refused), and a forgery
written with a writer's credentials still gains nothing. (The policies' every refusal is
proven at L3: tests/kube/test_l3_admission_policy.py.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from testkit.e2e import (
    AGENT_NS,
    ASSIGNMENT,
    SERVICE_ACCOUNT,
    Kube,
    assert_consistent,
    assignment,
    container,
    kubelet_devices,
    pod,
)
from testkit.harness import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def fake_node(agent: Kube) -> Iterator[str]:
    """A second Node object (no kubelet behind it), deleted afterwards."""
    name = f"e2e-fake-node-{uuid.uuid4().hex[:6]}"
    agent.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"gpu-share.vendor.com/e2e": "fake"}},
            }
        ]
    )
    yield name
    agent.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def _as(agent: Kube, token: str, *args: str) -> tuple[bool, str]:
    proc = agent.run(
        [
            agent.env["KUBECTL"],
            "--kubeconfig",
            "/dev/null",
            "--server",
            f"https://{agent.env['CLUSTER_APISERVER_HOST']}:{agent.env['CLUSTER_APISERVER_PORT']}",
            "--certificate-authority",
            agent.env["CLUSTER_CA_CERT"],
            "--token",
            token,
            *args,
        ],
        check=False,
    )
    return proc.returncode == 0, proc.stdout + proc.stderr


def _annotate(name: str) -> str:
    return json.dumps({"metadata": {"annotations": {"gpu-share.vendor.com/e2e": name}}})


def _agent_token(agent: Kube) -> str:
    """A token of the agent's ServiceAccount bound to the running agent pod (it carries the
    node-name claim the own-node policy checks)."""
    me = agent.ready_agent()
    assert me is not None
    return agent.kubectl(
        "-n",
        AGENT_NS,
        "create",
        "token",
        SERVICE_ACCOUNT,
        "--duration=10m",
        "--bound-object-kind=Pod",
        f"--bound-object-name={me['metadata']['name']}",
        f"--bound-object-uid={me['metadata']['uid']}",
    ).stdout.strip()


def test_story8_agent_token_writes_only_its_own_node_and_pods(
    agent: Kube, namespace: str, fake_node: str
) -> None:
    """Story 8a: the agent's pod-bound token cannot patch another node or a pod on
    another node (ValidatingAdmissionPolicy on the node-name claim), but can its own."""
    assert agent.get("validatingadmissionpolicies")["items"], "admission policy not installed"
    token = _agent_token(agent)
    # A pod bound to the fake node (it never runs: no kubelet there) and one on ours.
    elsewhere = pod("elsewhere", namespace, [container("main")])
    elsewhere["spec"]["nodeName"] = fake_node
    agent.apply([elsewhere, pod("here", namespace, [container("main")])])
    agent.kubectl(
        "-n", namespace, "wait", "--for=condition=Ready", "pod/here", "--timeout=120s", timeout=150
    )

    ok, out = _as(agent, token, "patch", "node", agent.node, "-p", _annotate("own"))
    assert ok, out
    ok, out = _as(agent, token, "patch", "node", fake_node, "-p", _annotate("other"))
    assert not ok and "may only write its own node" in out, out
    ok, out = _as(agent, token, "-n", namespace, "patch", "pod", "here", "-p", _annotate("own"))
    assert ok, out
    ok, out = _as(
        agent, token, "-n", namespace, "patch", "pod", "elsewhere", "-p", _annotate("other")
    )
    assert not ok and "pods bound to its own node" in out, out
    # RBAC alone would allow these: the policy is what refuses them. A token without the
    # node-name claim (not pod-bound) is refused even on the agent's own node.
    plain = agent.kubectl(
        "-n", AGENT_NS, "create", "token", SERVICE_ACCOUNT, "--duration=10m"
    ).stdout.strip()
    ok, out = _as(agent, plain, "patch", "node", agent.node, "-p", _annotate("plain"))
    assert not ok and "no node-name claim" in out, out
    # Only the agent (and the extender) may remove a gpu-share annotation, the admin too is
    # refused by the annotation policy.
    proc = agent.kubectl("annotate", "node", agent.node, "gpu-share.vendor.com/e2e-", check=False)
    assert proc.returncode != 0 and "is reserved for the gpu-share agent" in proc.stderr
    ok, out = _as(agent, token, "annotate", "node", agent.node, "gpu-share.vendor.com/e2e-")
    assert ok, out
    # No kubelet will ever confirm that pod's deletion.
    agent.kubectl(
        "-n", namespace, "delete", "pod", "elsewhere", "--force", "--grace-period=0", check=False
    )


def test_story8_forged_assignment_annotation_is_refused_and_gains_nothing(
    agent: Kube, namespace: str
) -> None:
    """Story 8b: a pod carrying a forged assignment annotation (claiming a whole device) is
    refused at admission, with or without resources, and so is adding one later; a forgery
    written with a writer's credentials (the agent's token stands in for a stolen one)
    blocks nobody: the inventory counts real slices and other pods get the device."""
    victim = sorted(agent.inventory()["devices"], key=lambda d: d["index"])[0]["id"]
    forged = json.dumps(
        {
            "version": "v1",
            "containers": {
                "main": {
                    "source": "node-agent",
                    "devices": [{"id": victim, "memoryUnits": 16, "cores": 100, "exclusive": True}],
                }
            },
        }
    )
    for bad in (
        pod("greedy", namespace, [container("main", 1, 0)], annotations={ASSIGNMENT: forged}),
        pod("freeloader", namespace, [container("main")], annotations={ASSIGNMENT: forged}),
    ):
        proc = agent.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
        assert proc.returncode != 0, proc.stdout
        assert "is reserved for the gpu-share agent" in proc.stderr, proc.stderr
    agent.apply(
        [
            pod("greedy", namespace, [container("main", 1, 0)]),
            pod("freeloader", namespace, [container("main")]),
        ]
    )
    agent.wait_ready(namespace)
    proc = agent.kubectl(
        "-n", namespace, "annotate", "pod", "freeloader", f"{ASSIGNMENT}={forged}", check=False
    )
    assert proc.returncode != 0 and "is reserved for the gpu-share agent" in proc.stderr
    ok, out = _as(
        agent, _agent_token(agent), "-n", namespace, "annotate", "pod", "freeloader",
        f"{ASSIGNMENT}={forged}",
    )  # fmt: skip
    assert ok, out

    held = kubelet_devices(agent.env["POD_RESOURCES_SOCKET"])
    greedy = held[(namespace, "greedy", "main")]
    assert sum(len(v) for v in greedy.values()) == 1, greedy
    seen = wait_until("env", lambda: agent.seen(namespace, "greedy", "main"), 60)
    assert seen["mem"] == "1024" and seen["cores"] == ""
    assert (namespace, "freeloader", "main") not in held
    seen = wait_until("env", lambda: agent.seen(namespace, "freeloader", "main"), 60)
    assert seen["visible"] == "" and seen["mem"] == "" and seen["nodes"] == ""

    # The forged claims block nobody: the inventory counts real slices only, and four
    # whole-device pods (the freeloader still carrying its forged claim) get every device,
    # the one the forgery named included.
    inv = {d["id"]: d for d in agent.inventory()["devices"]}
    assert inv[victim]["cores"]["used"] == 0
    agent.kubectl("-n", namespace, "delete", "pod", "greedy", "--wait=true", timeout=120)
    agent.apply(pod(f"big-{i}", namespace, [container("main", 15, 100)]) for i in range(4))
    agent.wait_ready(namespace, 180)
    devs = {
        d["id"]
        for i in range(4)
        for d in assignment(agent.get("pod", "-n", namespace, f"big-{i}"))["main"]["devices"]
    }
    assert victim in devs
    assert_consistent(agent)
