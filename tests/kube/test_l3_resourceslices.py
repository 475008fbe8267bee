"""L3: the node's ResourceSlice (kube.resourceslices) on a real kube-apiserver + etcd
(conftest.py, DRAConsumableCapacity on).

- What the agent publishes from a dummy inventory is kept by the API server as written:
  ``allowMultipleAllocations`` and every capacity's ``requestPolicy`` (the server drops
  both silently when the DRAConsumableCapacity gate is off: that fails loudly here).
- A health change republishes the same slice with a bumped pool generation; an equal
  inventory writes nothing; ``remove_all`` leaves no slice of the node.
- The chart's own-node ValidatingAdmissionPolicy (DRA on), applied as rendered, lets the
  agent's service account (a pod-bound token naming its node) write its own node's slice
  and refuses another node's, with RBAC granting both.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from kube_fakes import ApiServer, bind_cluster_role
from kubernetes import client as k8s

from gpu_share.devices.base import Device
from gpu_share.kube.rbac import AGENT_RULES, DRA_AGENT_RULES
from gpu_share.kube.resourceslices import (
    RESOURCE_SLICES,
    PublishAction,
    ResourceSliceError,
    ResourceSlicePublisher,
)
from gpu_share.kube.rest import RestClient, RestConfig, make_rest_client
from gpu_share.sharing.dra.slices import slice_content
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.quantity import parse_quantity
from testkit.harness.wait import until
from testkit.kube_admin import admin_apis
from tests.chart.conftest import NAMESPACE, RELEASE
from tests.kube.policies import rendered_policy

pytestmark = pytest.mark.apiserver

DRIVER = "gpu-share.vendor.com"
UNIT_MIB = 1024
MIB = 2**20
AGENT_SA = f"{RELEASE}-gpu-share"



def inventory(*unhealthy: int, numa: int | None = 0) -> Inventory:
    devices = [
        Device(uuid=f"GPU-{i:04d}-l3", index=i, minor=i, memory_mib=16384 + 100,
               model="Dummy NPU", numa_node=numa, healthy=i not in unhealthy)
        for i in range(3)
    ]
    return Inventory.from_devices(devices, UNIT_MIB)


def content(node: str, *unhealthy: int) -> Any:
    return slice_content(inventory(*unhealthy), node_name=node, driver=DRIVER,
                         driver_version="550.54.15")


def read_slices(api: RestClient, node: str) -> list[dict[str, Any]]:
    got = api.get("list", RESOURCE_SLICES,
                  {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"})
    return list(got.get("items") or [])


def q(value: Any) -> Fraction:
    return parse_quantity(value)


# ---------------------------------------------------------------- publish as admin


@pytest.fixture
def admin_rest(apiserver: ApiServer) -> Iterator[RestClient]:
    api = make_rest_client(apiserver.kubeconfig)
    yield api
    api.close()


def test_the_api_server_keeps_what_the_agent_publishes(admin_rest: RestClient) -> None:
    node = f"rs-{uuid.uuid4().hex[:6]}"
    pub = ResourceSlicePublisher(admin_rest, node_name=node, driver=DRIVER)
    first = pub.publish(content(node))
    assert first.action is PublishAction.CREATED and first.generation == 1
    (obj,) = read_slices(admin_rest, node)
    assert obj["metadata"]["name"] == first.name
    assert obj["metadata"]["name"].startswith(f"{node}-gpu-share-")
    spec = obj["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, node)
    assert spec["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    for i, dev in enumerate(spec["devices"]):
        if dev.get("allowMultipleAllocations") is not True or any(
            "requestPolicy" not in c for c in dev.get("capacity", {}).values()
        ):
            pytest.fail(
                "the API server dropped allowMultipleAllocations/requestPolicy: the "
                "DRAConsumableCapacity feature gate is OFF on this kube-apiserver (consumable "
                f"capacity cannot work); device as stored: {json.dumps(dev)}"
            )
        attrs = dev["attributes"]
        assert attrs["uuid"] == {"string": f"GPU-{i:04d}-l3"}
        assert attrs["index"] == {"int": i}
        assert attrs["numaNode"] == {"int": 0}
        assert attrs["memoryUnitMiB"] == {"int": UNIT_MIB}
        assert attrs["driverVersion"] == {"string": "550.54.15"}
        assert attrs["model"] == {"string": "Dummy NPU"}
        mem, cores = dev["capacity"]["memory"], dev["capacity"]["cores"]
        # Quantities come back canonical (16Gi for 16384Mi): compare values.
        assert q(mem["value"]) == 16 * UNIT_MIB * MIB  # 16 whole units; the 100 MiB left out
        assert q(mem["requestPolicy"]["default"]) == q(mem["value"])
        assert q(mem["requestPolicy"]["validRange"]["min"]) == UNIT_MIB * MIB
        assert q(mem["requestPolicy"]["validRange"]["step"]) == UNIT_MIB * MIB
        assert q(cores["value"]) == 100
        assert q(cores["requestPolicy"]["default"]) == 0
        assert q(cores["requestPolicy"]["validRange"]["min"]) == 0
        assert q(cores["requestPolicy"]["validRange"]["step"]) == 1

    # Nothing changed: nothing is written (same resourceVersion).
    rv = obj["metadata"]["resourceVersion"]
    assert pub.publish(content(node)).action is PublishAction.UNCHANGED
    assert read_slices(admin_rest, node)[0]["metadata"]["resourceVersion"] == rv

    # A device turns unhealthy: the same slice, without it, one generation up.
    sick = pub.publish(content(node, 1))
    assert (sick.action, sick.name, sick.generation) == (PublishAction.UPDATED, first.name, 2)
    (obj,) = read_slices(admin_rest, node)
    assert obj["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in obj["spec"]["devices"]] == ["gpu-0", "gpu-2"]
    # A new publisher (an agent restart) bumps past what is stored.
    restarted = ResourceSlicePublisher(admin_rest, node_name=node, driver=DRIVER)
    assert restarted.publish(content(node)).generation == 3

    assert restarted.remove_all() == 1
    assert read_slices(admin_rest, node) == []
    assert restarted.remove_all() == 0


def test_extra_slices_of_the_node_are_cleaned_up(admin_rest: RestClient) -> None:
    node = f"rs-{uuid.uuid4().hex[:6]}"
    pub = ResourceSlicePublisher(admin_rest, node_name=node, driver=DRIVER)
    first = pub.publish(content(node))
    # A stray slice of the same node and driver (a crashed older agent, by hand).
    stray = pub.list_own()[0]
    stray_body = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-stray"},
        "spec": {**stray["spec"], "pool": {**stray["spec"]["pool"], "generation": 5}},
    }  # fmt: skip
    admin_rest.create("create stray", RESOURCE_SLICES, stray_body)
    res = pub.publish(content(node, 0))
    assert (res.name, res.generation, res.deleted) == (first.name, 6, 1)
    assert [s["metadata"]["name"] for s in read_slices(admin_rest, node)] == [first.name]
    pub.remove_all()


def test_a_conflicting_write_is_read_again(admin_rest: RestClient) -> None:
    """Someone updates the slice between our list and our update: the 409 is answered by
    reading again, and the publish still lands."""
    node = f"rs-{uuid.uuid4().hex[:6]}"
    pub = ResourceSlicePublisher(admin_rest, node_name=node, driver=DRIVER)
    pub.publish(content(node))
    real_list = pub.list_own
    calls = {"n": 0}

    def racing_list() -> list[dict[str, Any]]:
        items = real_list()
        calls["n"] += 1
        if calls["n"] == 1:  # after our read, another writer updates the slice
            other = json.loads(json.dumps(items[0]))
            other["metadata"].setdefault("labels", {})["touched"] = "yes"
            admin_rest.request("update", "PUT",
                               f"{RESOURCE_SLICES}/{other['metadata']['name']}", body=other)
        return items

    pub.list_own = racing_list  # type: ignore[method-assign]
    res = pub.publish(content(node, 2))
    assert res.action is PublishAction.UPDATED and calls["n"] == 2
    (obj,) = read_slices(admin_rest, node)
    assert [d["name"] for d in obj["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    real_list_pub = ResourceSlicePublisher(admin_rest, node_name=node, driver=DRIVER)
    real_list_pub.remove_all()


# ---------------------------------------------------------------- admission policy


@dataclass
class PolicyEnv:
    agent: RestClient  # the agent's SA, pod-bound token naming ``node``
    admin: RestClient
    node: str
    other: str


def _own_node_policy() -> list[dict[str, Any]]:
    """The chart's own-node policy and its binding (DRA on), renamed for this module."""
    objs = rendered_policy("-own-node", "l3-rs-own-node", "agentConfig.dra.enabled=true",
                           kube_version="1.34.0")
    assert "resourceslices" in json.dumps(objs)
    return objs


def _ensure(call: Callable[[], Any]) -> None:
    try:
        call()
    except k8s.ApiException as e:
        if e.status != 409:  # left by another L3 module sharing the server
            raise


@pytest.fixture(scope="module")
def policy_env(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[PolicyEnv]:
    apis = admin_apis(apiserver.kubeconfig)
    core, rbac, adm = apis.core, apis.rbac, apis.admission
    tag = uuid.uuid4().hex[:6]
    node, other = f"rs-node-{tag}", f"rs-other-{tag}"
    _ensure(lambda: core.create_namespace({"metadata": {"name": NAMESPACE}}))
    _ensure(lambda: core.create_namespaced_service_account(
        NAMESPACE, {"metadata": {"name": AGENT_SA}}))
    for n in (node, other):
        core.create_node({"metadata": {"name": n}})
    role = f"l3-rs-agent-{tag}"
    rules = [{"apiGroups": [g], "resources": [r], "verbs": list(v)}
             for g, r, v in AGENT_RULES + DRA_AGENT_RULES]
    bind_cluster_role(rbac, role, rules, NAMESPACE, AGENT_SA)
    pod = core.create_namespaced_pod(NAMESPACE, {
        "metadata": {"name": f"rs-agent-{tag}"},
        "spec": {"nodeName": node, "serviceAccountName": AGENT_SA,
                 "containers": [{"name": "agent", "image": "busybox"}]},
    })  # fmt: skip
    tr = core.create_namespaced_service_account_token(AGENT_SA, NAMESPACE, {"spec": {
        "expirationSeconds": 3600,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                           "uid": pod.metadata.uid},
    }})  # fmt: skip
    token = tmp_path_factory.mktemp("rs") / "token"
    token.write_text(tr.status.token)
    agent = RestClient(RestConfig(server=apiserver.url, ca_file=apiserver.ca_file,
                                  token_file=str(token)))
    admin = make_rest_client(apiserver.kubeconfig)
    env = PolicyEnv(agent=agent, admin=admin, node=node, other=other)
    # RBAC first (so a 403 later can only be the policy's).
    until(lambda: _can_list(agent, other), what="the agent's RBAC")
    policy, binding = sorted(_own_node_policy(), key=lambda o: o["kind"])
    adm.create_validating_admission_policy(policy)
    adm.create_validating_admission_policy_binding(binding)
    try:
        until(lambda: _probe(env), what="the own-node policy in force")
        yield env
    finally:
        adm.delete_validating_admission_policy_binding("l3-rs-own-node")
        adm.delete_validating_admission_policy("l3-rs-own-node")
        for n in (node, other):
            with contextlib.suppress(ResourceSliceError):
                _publisher(admin, n).remove_all()
            core.delete_node(n)
        core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
        agent.close()
        admin.close()


def _publisher(api: RestClient, node: str) -> ResourceSlicePublisher:
    return ResourceSlicePublisher(api, node_name=node, driver=DRIVER)


def _can_list(api: RestClient, node: str) -> bool:
    try:
        _publisher(api, node).list_own()
    except ResourceSliceError as e:
        if e.status == 403:
            return False
        raise
    return True


def _probe(env: PolicyEnv) -> bool:
    """True when the policy refuses the agent a fresh slice of the other node (one that
    got through is deleted again)."""
    if _refused(lambda: _publisher(env.agent, env.other).publish(content(env.other))):
        return True
    _publisher(env.admin, env.other).remove_all()
    return False


def _refused(call: Callable[[], Any]) -> str:
    """The policy's message when ``call`` is refused by it, else ""."""
    try:
        call()
    except ResourceSliceError as e:
        if e.status == 403 and "ValidatingAdmissionPolicy" in str(e):
            return str(e)
        raise
    return ""


def test_agent_writes_its_own_nodes_slice(policy_env: PolicyEnv) -> None:
    pub = _publisher(policy_env.agent, policy_env.node)
    assert pub.publish(content(policy_env.node)).action is PublishAction.CREATED
    assert pub.publish(content(policy_env.node, 0)).action is PublishAction.UPDATED
    assert pub.remove_all() == 1


def test_agent_cannot_write_another_nodes_slice(policy_env: PolicyEnv) -> None:
    env = policy_env
    msg = _refused(lambda: _publisher(env.agent, env.other).publish(content(env.other)))
    assert f"the gpu-share agent on node {env.node} may only write ResourceSlices" in msg, msg
    # Nor update or delete one the admin made, nor move its own slice to another node.
    theirs = _publisher(env.admin, env.other).publish(content(env.other))
    assert _refused(lambda: _publisher(env.agent, env.other).publish(content(env.other, 0)))
    assert _refused(lambda: _publisher(env.agent, env.other).remove_all())
    assert [s["metadata"]["name"] for s in read_slices(env.admin, env.other)] == [theirs.name]
    mine = _publisher(env.agent, env.node).publish(content(env.node))
    (obj,) = read_slices(env.admin, env.node)
    moved = {**obj, "spec": {**obj["spec"], "nodeName": env.other}}
    with pytest.raises(Exception) as ei:  # refused by the policy or by immutability
        env.agent.request("move", "PUT", f"{RESOURCE_SLICES}/{mine.name}", body=moved)
    assert getattr(ei.value, "status", None) in (403, 422), ei.value
    _publisher(env.agent, env.node).remove_all()


def _refused_slice(env: PolicyEnv, driver: str, pool: str) -> str:
    """The policy's refusal of an empty slice of the agent's node, driver and pool."""
    body = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"generateName": f"{env.node}-x-"},
        "spec": {"driver": driver, "nodeName": env.node,
                 "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "devices": []},
    }  # fmt: skip
    with pytest.raises(Exception) as ei:
        env.agent.create("create", RESOURCE_SLICES, body)
    assert getattr(ei.value, "status", None) == 403
    assert "ValidatingAdmissionPolicy" in str(ei.value)
    return str(ei.value)


def test_another_driver_is_refused_too(policy_env: PolicyEnv) -> None:
    _refused_slice(policy_env, "other.example.com", policy_env.node)


def test_a_slice_of_its_node_naming_another_nodes_pool_is_refused(
    policy_env: PolicyEnv,
) -> None:
    """A compromised agent may not publish, on its own node, the pool (devices) of
    another: the pool's name is the node's."""
    msg = _refused_slice(policy_env, DRIVER, policy_env.other)
    assert "may only write ResourceSlices of its own node and pool" in msg
