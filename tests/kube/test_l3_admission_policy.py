"""L3: the chart's ValidatingAdmissionPolicies, as `helm template` renders them, applied to
a real kube-apiserver + etcd (conftest.py) and tried with real service-account tokens.

A tenant cannot create a pod that requests vendor.com resources and sets
env that carries or lifts its limits (any container kind, ephemeral ones added later
included; envFrom only with a safe prefix; no cores-only container under mps), and can
when the pod requests none of our resources. Item 8: nobody but the agent's and the
extender's service accounts adds, changes or removes a gpu-share.vendor.com/* annotation
of a pod or node (also through a Binding or a status update).

The tenant holds RBAC for every request tried here, so each refusal comes from a policy.
To see a test fail without its policy expression, point GPU_SHARE_L3_CHART at a copy of
charts/gpu-share whose validation was replaced by `true`.

The policies are removed at the end of the module: other L3 modules share the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_fakes import ApiServer, bind_cluster_role
from kubernetes import client as k8s

from gpu_share.kube.extender_rbac import EXTENDER_RULES
from gpu_share.kube.rbac import AGENT_RULES
from gpu_share.kube.rest_config import load_rest_config
from gpu_share.sharing.placement.pod_models import models_key
from testkit.harness.wait import until
from testkit.kube_admin import admin_client, allowed, client_for
from tests.chart.conftest import CHART, NAMESPACE, RELEASE, helm_path

pytestmark = pytest.mark.apiserver

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"
ASSIGNMENT = "gpu-share.vendor.com/assignment"
DECISION = "gpu-share.vendor.com/decision"
INVENTORY = "gpu-share.vendor.com/inventory"
MODELS = models_key("vendor.com")
AGENT_SA = f"{RELEASE}-gpu-share"
EXTENDER_SA = f"{RELEASE}-gpu-share-extender"
NODE = "vap-node"
OTHER_NODE = "vap-other-node"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# The render under test: service mode (the extender has its own ServiceAccount) and mps
# enforcement (the cores-only check is on).
SETS = (
    "scheduler.enabled=true",
    "scheduler.extender.mode=service",
    "agentConfig.runtime.enforcement=mps",
)


def rendered_policies() -> list[dict[str, Any]]:
    chart = os.environ.get("GPU_SHARE_L3_CHART") or str(CHART)
    args = [helm_path(4), "template", RELEASE, chart, "--namespace", NAMESPACE]
    args += ["--kube-version", "1.34.0"]
    for s in SETS:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    objs = [d for d in yaml.safe_load_all(out) if d and d["kind"] in POLICY_KINDS]
    assert len(objs) == 6, [o["metadata"]["name"] for o in objs]
    return objs


@dataclass
class Env:
    admin: k8s.CoreV1Api
    tenant: k8s.CoreV1Api
    agent: k8s.CoreV1Api
    extender: k8s.CoreV1Api
    ns: str
    policies: list[dict[str, Any]]

    def pod(
        self,
        containers: list[dict[str, Any]],
        *,
        annotations: dict[str, str] | None = None,
        node: str | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"p-{uuid.uuid4().hex[:8]}", "namespace": self.ns}
        if annotations:
            meta["annotations"] = annotations
        body: dict[str, Any] = {"metadata": meta, "spec": {"containers": containers, **spec}}
        if node:
            body["spec"]["nodeName"] = node
        return body

    def create_as_tenant(self, body: dict[str, Any]) -> k8s.V1Pod:
        return self.tenant.create_namespaced_pod(self.ns, body)


def container(
    name: str = "main", mem: int = 0, core: int = 0, env: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    limits = {k: str(v) for k, v in ((MEM, mem), (CORE, core)) if v}
    if limits:
        c["resources"] = {"limits": limits}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return c


def refused(call: Callable[[], Any]) -> str:
    """The policy's message of a request that must be refused (403 by a policy)."""
    with pytest.raises(k8s.ApiException) as ei:
        call()
    assert ei.value.status == 403, (ei.value.status, ei.value.body)
    msg = json.loads(ei.value.body)["message"]
    assert "ValidatingAdmissionPolicy" in msg, msg
    return str(msg)


def _token_client(
    admin: k8s.CoreV1Api, apiserver: ApiServer, tmp: Path, ns: str, sa: str, bound_pod: Any = None
) -> k8s.CoreV1Api:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if bound_pod is not None:  # a pod-bound token carries the node-name claim
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": bound_pod.metadata.name,
            "uid": bound_pod.metadata.uid,
        }
    tr = admin.create_namespaced_service_account_token(sa, ns, {"spec": spec})
    token = tmp / f"{ns}-{sa}.token"
    token.write_text(tr.status.token)
    environ = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(apiserver.port),
    }
    cfg = load_rest_config(environ=environ, token_file=str(token), ca_file=apiserver.ca_file)
    return k8s.CoreV1Api(client_for(cfg))


# Everything the tests try, so that RBAC is never what refuses a tenant's request.
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["create", "get", "list", "patch", "update", "delete"]},
    {"apiGroups": [""], "resources": ["pods/ephemeralcontainers", "pods/status"],
     "verbs": ["patch", "update"]},
    {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"]},
]  # fmt: skip


def _rules(rules: tuple[tuple[str, str, tuple[str, ...]], ...]) -> list[dict[str, Any]]:
    return [{"apiGroups": [g], "resources": [r], "verbs": list(v)} for g, r, v in rules]


def _refuses(env: Env, body: dict[str, Any]) -> bool:
    try:
        env.create_as_tenant(body)
    except k8s.ApiException as e:
        return e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body)
    env.admin.delete_namespaced_pod(body["metadata"]["name"], env.ns, grace_period_seconds=0)
    return False


def _policies_active(env: Env) -> tuple[bool, bool]:
    """(env policy refuses, annotation policy refuses) a probe pod each."""
    env_probe = env.pod([container(mem=1, env={"LD_PRELOAD": "/x.so"})])
    ann_probe = env.pod([container()], annotations={ASSIGNMENT: "probe"})
    return _refuses(env, env_probe), _refuses(env, ann_probe)


def _wait_active(env: Env) -> None:
    # Both bindings reach the apiserver's informer within moments of each other; a policy
    # under a mutation check (module docstring) never refuses, hence "any", then a grace.
    until(lambda: any(_policies_active(env)), what="the policies in force")
    with contextlib.suppress(AssertionError):
        until(lambda: all(_policies_active(env)), timeout=5)


@pytest.fixture(scope="module")
def env(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    policies = rendered_policies()
    admin_api = admin_client(apiserver.kubeconfig)
    admin = k8s.CoreV1Api(admin_api)
    rbac = k8s.RbacAuthorizationV1Api(admin_api)
    adm = k8s.AdmissionregistrationV1Api(admin_api)
    tmp = tmp_path_factory.mktemp("vap")
    tag = uuid.uuid4().hex[:6]
    ns = f"tenant-{tag}"
    for n in (NAMESPACE, ns):
        admin.create_namespace({"metadata": {"name": n}})
    admin.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    for sa in ("default", AGENT_SA, EXTENDER_SA):
        admin.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": sa}})
    admin.create_namespaced_service_account(ns, {"metadata": {"name": "tenant"}})
    for n in (NODE, OTHER_NODE):
        admin.create_node({"metadata": {"name": n}})
    bind_cluster_role(rbac, f"l3-vap-tenant-{tag}", TENANT_RULES, ns, "tenant")
    bind_cluster_role(rbac, f"l3-vap-agent-{tag}", _rules(AGENT_RULES), NAMESPACE, AGENT_SA)
    bind_cluster_role(
        rbac, f"l3-vap-extender-{tag}", _rules(EXTENDER_RULES), NAMESPACE, EXTENDER_SA
    )
    # The agent's pod on NODE: its pod-bound token names the node (the own-node policy).
    agent_pod = admin.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": "agent"},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": AGENT_SA,
                "containers": [container("agent")],
            },
        },
    )
    e = Env(
        admin=admin,
        tenant=_token_client(admin, apiserver, tmp, ns, "tenant"),
        agent=_token_client(admin, apiserver, tmp, NAMESPACE, AGENT_SA, agent_pod),
        extender=_token_client(admin, apiserver, tmp, NAMESPACE, EXTENDER_SA),
        ns=ns,
        policies=policies,
    )
    # RBAC reaches the authorizer through an informer: wait for the tenant's grant.
    probe = e.pod([container()])
    until(lambda: allowed(lambda: e.create_as_tenant(probe)), what="tenant RBAC")
    created: list[dict[str, Any]] = []
    try:
        for kind in POLICY_KINDS:  # policies before their bindings
            for obj in policies:
                if obj["kind"] == kind:
                    if kind == "ValidatingAdmissionPolicy":
                        adm.create_validating_admission_policy(obj)
                    else:
                        adm.create_validating_admission_policy_binding(obj)
                    created.append(obj)
        _wait_active(e)
        yield e
    finally:
        for obj in reversed(created):
            name = obj["metadata"]["name"]
            if obj["kind"] == "ValidatingAdmissionPolicyBinding":
                adm.delete_validating_admission_policy_binding(name)
            else:
                adm.delete_validating_admission_policy(name)
        # Other L3 modules write gpu-share annotations as admin: wait until nobody refuses.
        gone = {"metadata": {"name": "vap-gone", "annotations": {ASSIGNMENT: "x"}}}
        until(lambda: allowed(lambda: admin.create_node(gone)), what="the policies removed")
        admin.delete_node("vap-gone")
        for n in (NODE, OTHER_NODE):
            admin.delete_node(n)


# ---------------------------------------------------------------- item 9: reserved env

RESERVED = [
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
    "LD_PRELOAD",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "DUMMY_VISIBLE_DEVICES",
    "GPU_SHARE_MEMORY_LIMIT_MIB",
    "GPU_SHARE_CORE_PERCENT",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_REDIRECT",
    "LD_AUDIT",
    # What NVIDIA's apply-cuda-memory-limits hook reads (the nvidia-memory-limits mode).
    "NVIDIA_GPU_MEMORY_REQUEST",
    "NVIDIA_GPU_MEMORY_LIMIT",
]


@pytest.mark.parametrize("name", RESERVED)
def test_tenant_cannot_set_reserved_env_on_a_gpu_pod(env: Env, name: str) -> None:
    body = env.pod([container(mem=2, core=30, env={"APP": "1", name: "0"})])
    msg = refused(lambda: env.create_as_tenant(body))
    assert f"container main sets env {name}," in msg, msg
    assert "gpu-share reserves on pods requesting its resources" in msg


@pytest.mark.parametrize(
    "where", ["init-container", "container-without-resources", "sidecar-init-container"]
)
def test_reserved_env_refused_in_every_container_of_a_gpu_pod(env: Env, where: str) -> None:
    bad = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=99999M"}
    gpu = container(mem=1)
    if where == "init-container":
        body = env.pod([gpu], initContainers=[container("setup", env=bad)])
    elif where == "sidecar-init-container":
        body = env.pod([gpu], initContainers=[container("side", env=bad, restartPolicy="Always")])
    else:
        body = env.pod([gpu, container("helper", env=bad)])
    msg = refused(lambda: env.create_as_tenant(body))
    assert "sets env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in msg


def test_pods_matched_by_either_resource_and_by_requests(env: Env) -> None:
    cores = container(core=30, env={"LD_PRELOAD": "/x.so"})  # matched by the core resource
    assert "sets env LD_PRELOAD" in refused(lambda: env.create_as_tenant(env.pod([cores])))
    by_requests = container(env={"LD_PRELOAD": "/x.so"})
    by_requests["resources"] = {"requests": {MEM: "1"}, "limits": {MEM: "1"}}
    refused(lambda: env.create_as_tenant(env.pod([by_requests])))


def test_a_dra_pod_the_webhook_rewrote_is_judged_too(env: Env) -> None:
    """In DRA pools the webhook replaces our resources by claims of its templates before
    this policy runs: such a pod is still refused the reserved env; a claim of another
    template is not ours to judge."""
    def claimed(template: str) -> dict[str, Any]:
        c = container(env={"CUDA_REDIRECT": "/usr/lib/libcuda.so.1"})
        c["resources"] = {"claims": [{"name": "gpu-share-main"}]}
        return env.pod([c], resourceClaims=[
            {"name": "gpu-share-main", "resourceClaimTemplateName": template}])

    msg = refused(lambda: env.create_as_tenant(claimed("gpu-share-m4-c30")))
    assert "sets env CUDA_REDIRECT" in msg
    other = claimed("someone-elses-gpu")
    env.create_as_tenant(other)
    env.admin.delete_namespaced_pod(other["metadata"]["name"], env.ns, grace_period_seconds=0)


def test_same_env_is_fine_on_pods_without_our_resources(env: Env) -> None:
    everything = {n: "1" for n in RESERVED}
    body = env.pod(
        [container(env=everything, resources={"limits": {"cpu": "1"}})],
        initContainers=[container("init", env=everything)],
    )
    pod = env.create_as_tenant(body)
    assert {e.name for e in pod.spec.containers[0].env} == set(RESERVED)


def test_harmless_env_is_fine_on_gpu_pods(env: Env) -> None:
    c = container(mem=2, core=30, env={"APP_MODE": "x", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    c["envFrom"] = [
        {"prefix": "APP_", "configMapRef": {"name": "cfg"}},
        {"prefix": "MY_CUDA_", "secretRef": {"name": "s"}},
    ]
    assert env.create_as_tenant(env.pod([c])).metadata.uid


@pytest.mark.parametrize("prefix", [None, "", "CUDA_", "CUDA_MPS_X", "LD_", "G"])
def test_env_from_needs_a_safe_prefix_on_gpu_pods(env: Env, prefix: str | None) -> None:
    """The policy cannot read the ConfigMap: a key CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in it
    would lift the limit. Only a prefix no key can complete to a reserved name passes."""
    source: dict[str, Any] = {"configMapRef": {"name": "cfg"}}
    if prefix is not None:
        source["prefix"] = prefix
    c = container(mem=1, envFrom=[source])
    msg = refused(lambda: env.create_as_tenant(env.pod([c])))
    assert "uses envFrom without a safe prefix" in msg


def test_ephemeral_container_cannot_bring_reserved_env(env: Env) -> None:
    pod = env.create_as_tenant(env.pod([container(mem=1)]))
    name = pod.metadata.name
    debug = {"name": "debug", "image": "busybox", "env": [{"name": "LD_PRELOAD", "value": "x"}]}

    def add(c: dict[str, Any]) -> Any:
        return env.tenant.patch_namespaced_pod_ephemeralcontainers(
            name, env.ns, {"spec": {"ephemeralContainers": [c]}}
        )

    msg = refused(lambda: add(debug))
    assert "container debug sets env LD_PRELOAD" in msg
    with_from = {"name": "debug", "image": "busybox", "envFrom": [{"configMapRef": {"name": "c"}}]}
    assert "uses envFrom without a safe prefix" in refused(lambda: add(with_from))
    fine = {"name": "debug", "image": "busybox", "env": [{"name": "APP", "value": "1"}]}
    assert add(fine).spec.ephemeral_containers[0].name == "debug"


def test_cores_only_container_refused_under_mps(env: Env) -> None:
    msg = refused(lambda: env.create_as_tenant(env.pod([container(core=50)])))
    assert f"container main requests {CORE} without {MEM}" in msg, msg
    init = env.pod([container(mem=1, core=10)], initContainers=[container("i", core=20)])
    assert "container i requests" in refused(lambda: env.create_as_tenant(init))
    whole = env.pod([container(core=100)])  # whole devices too: no memory limit either
    assert "container main requests" in refused(lambda: env.create_as_tenant(whole))
    assert env.create_as_tenant(env.pod([container(core=50, mem=1)])).metadata.uid
    assert env.create_as_tenant(env.pod([container(core=100, mem=16)])).metadata.uid
    assert env.create_as_tenant(env.pod([container(mem=3)])).metadata.uid


# ---------------------------------------------------------------- item 8: annotations


@pytest.mark.parametrize("key", [ASSIGNMENT, DECISION, "gpu-share.vendor.com/anything"])
def test_tenant_cannot_create_a_pod_with_a_gpu_share_annotation(env: Env, key: str) -> None:
    body = env.pod([container(mem=1)], annotations={key: '{"version":"v1"}'})
    msg = refused(lambda: env.create_as_tenant(body))
    assert f"annotation {key} is reserved for the gpu-share agent" in msg, msg
    assert f"system:serviceaccount:{env.ns}:tenant may not add, change or remove" in msg
    # Not a gpu-share key: fine, even with the domain in it.
    other = env.pod([container(mem=1)], annotations={"vendor.com/assignment": "x"})
    assert env.create_as_tenant(other).metadata.uid


def test_tenant_writes_the_models_its_pod_accepts(env: Env) -> None:
    """gpu-share.<domain>/models is the pod author's (sharing/placement/pod_models.py), not
    reserved."""
    body = env.pod([container(mem=1)], annotations={MODELS: "Tesla-T4"})
    name = env.create_as_tenant(body).metadata.name
    patch = {"metadata": {"annotations": {MODELS: "Tesla-T4,NVIDIA-A10"}}}
    env.tenant.patch_namespaced_pod(name, env.ns, patch)
    env.tenant.patch_namespaced_pod(name, env.ns, {"metadata": {"annotations": {MODELS: None}}})
    assert MODELS not in _pod_annotations(env, name)


def _pod_annotations(env: Env, name: str) -> dict[str, str]:
    return dict(env.admin.read_namespaced_pod(name, env.ns).metadata.annotations or {})


def test_only_the_agent_writes_pod_annotations(env: Env) -> None:
    pod = env.create_as_tenant(env.pod([container(mem=1)], node=NODE))
    name = pod.metadata.name

    def patch(api: k8s.CoreV1Api, ann: dict[str, Any]) -> Any:
        return api.patch_namespaced_pod(name, env.ns, {"metadata": {"annotations": ann}})

    patch(env.agent, {ASSIGNMENT: "by-agent"})  # the agent on the pod's node: allowed
    for change in ({ASSIGNMENT: "forged"}, {ASSIGNMENT: None}, {DECISION: "forged"}):
        refused(lambda c=change: patch(env.tenant, c))  # type: ignore[misc]
    # The admin too: the policy names its writers, nobody else.
    refused(lambda: patch(env.admin, {ASSIGNMENT: "admin"}))
    # A full update (PUT) that drops the annotation is refused as well.
    current = env.tenant.read_namespaced_pod(name, env.ns)
    current.metadata.annotations = {"keep": "me"}
    refused(lambda: env.tenant.replace_namespaced_pod(name, env.ns, current))
    # Other annotations stay the tenant's to change; ours survive untouched.
    patch(env.tenant, {"example.com/note": "hi"})
    assert _pod_annotations(env, name) == {ASSIGNMENT: "by-agent", "example.com/note": "hi"}
    patch(env.agent, {ASSIGNMENT: "by-agent-2"})
    patch(env.agent, {ASSIGNMENT: None})
    assert ASSIGNMENT not in _pod_annotations(env, name)


def test_status_update_cannot_carry_annotations(env: Env) -> None:
    pod = env.create_as_tenant(env.pod([container(mem=1)], node=NODE))
    body = {"metadata": {"annotations": {ASSIGNMENT: "via-status"}}}
    refused(lambda: env.tenant.patch_namespaced_pod_status(pod.metadata.name, env.ns, body))
    refused(lambda: env.tenant.patch_node_status(NODE, body))


def test_only_the_agent_writes_node_annotations(env: Env) -> None:
    def patch(api: k8s.CoreV1Api, node: str, ann: dict[str, Any]) -> Any:
        return api.patch_node(node, {"metadata": {"annotations": ann}})

    patch(env.agent, NODE, {INVENTORY: '{"v":1}'})
    for change in ({INVENTORY: '{"v":"forged"}'}, {INVENTORY: None}, {ASSIGNMENT: "x"}):
        msg = refused(lambda c=change: patch(env.tenant, NODE, c))  # type: ignore[misc]
        assert "is reserved for the gpu-share agent" in msg
    patch(env.tenant, NODE, {"example.com/rack": "r1"})
    ann = env.admin.read_node(NODE).metadata.annotations
    assert ann[INVENTORY] == '{"v":1}' and ann["example.com/rack"] == "r1"
    # The agent itself stays confined to its own node (the existing own-node policy).
    msg = refused(lambda: patch(env.agent, OTHER_NODE, {INVENTORY: "{}"}))
    assert "may only write its own node" in msg


def test_only_the_extender_binds_with_a_decision(env: Env) -> None:
    """A Binding's annotations are copied onto the pod: a tenant allowed to bind cannot
    smuggle a decision that way; the extender (its own ServiceAccount) can."""

    def binding(pod: str, ann: dict[str, str] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": pod}
        if ann:
            meta["annotations"] = ann
        return {"metadata": meta, "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}

    p1 = env.create_as_tenant(env.pod([container(mem=1)])).metadata.name
    for bind in (
        # POST .../bindings (what kube-scheduler and our extender call) and pods/binding.
        lambda b: env.tenant.create_namespaced_binding(env.ns, b, _preload_content=False),
        lambda b: env.tenant.create_namespaced_pod_binding(p1, env.ns, b, _preload_content=False),
    ):
        refused(lambda bind=bind: bind(binding(p1, {DECISION: "x"})))  # type: ignore[misc]
    env.tenant.create_namespaced_binding(env.ns, binding(p1, None), _preload_content=False)

    # The extender's own calls (kube/binder.py): patch, then bind.
    p2 = env.create_as_tenant(env.pod([container(mem=1)])).metadata.name
    env.extender.patch_namespaced_pod(p2, env.ns, {"metadata": {"annotations": {DECISION: "d"}}})
    env.extender.create_namespaced_binding(
        env.ns, binding(p2, {DECISION: "d2"}), _preload_content=False
    )
    got = env.admin.read_namespaced_pod(p2, env.ns)
    assert got.spec.node_name == NODE and got.metadata.annotations[DECISION] == "d2"
