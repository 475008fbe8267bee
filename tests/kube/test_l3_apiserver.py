"""L3: gpu_share.kube against a real kube-apiserver + etcd (see conftest.py)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import ApiServer, bind_cluster_role, rbac_allows
from kubernetes import client as k8s

from gpu_share.config.model import ResourcesConfig
from gpu_share.kube.pods import KubePodSource, NodePodCache
from gpu_share.kube.publish import KubePublisher
from gpu_share.kube.rbac import AGENT_RULES
from gpu_share.kube.rest import ApiError, RestClient, make_rest_client
from gpu_share.sharing.model import ContainerKind, ContainerRequest
from testkit.harness.wait import until
from testkit.kube_admin import admin_client

pytestmark = pytest.mark.apiserver

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"
NODE = "node-l3"



def container(name: str, mem: int = 0, core: int = 0, **extra: Any) -> dict[str, Any]:
    limits = {k: str(v) for k, v in ((MEM, mem), (CORE, core)) if v}
    c: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    if limits:
        c["resources"] = {"limits": limits}
    return c


def make_pod(
    core: Any, ns: str, name: str, node: str = NODE, **spec: Any
) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": node, "containers": [container("main")], **spec},
    }
    pod = core.create_namespaced_pod(ns, body)
    return {"uid": pod.metadata.uid}


@pytest.fixture(scope="module")
def admin(apiserver: ApiServer) -> k8s.ApiClient:
    """The generated client, for the tests' own setup and checks."""
    return admin_client(apiserver.kubeconfig)


@pytest.fixture(scope="module")
def rest(apiserver: ApiServer) -> RestClient:
    """The agent's client (kube.rest) with the same admin kubeconfig (client cert)."""
    return make_rest_client(apiserver.kubeconfig)


@pytest.fixture(scope="module")
def ns(admin: k8s.ApiClient) -> str:
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    name = f"l3-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    # No controller-manager here: create the SA the ServiceAccount admission wants.
    core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    for n in (NODE, "other-node"):
        core.create_node({"metadata": {"name": n}})
    return name


def test_get_and_list_convert_real_pods(admin: k8s.ApiClient, rest: RestClient, ns: str) -> None:
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    made = make_pod(
        core,
        ns,
        "mixed",
        initContainers=[
            container("setup", mem=2, core=10),
            container("proxy", mem=1, restartPolicy="Always"),
        ],
        containers=[container("b", mem=4, core=30), container("a")],
    )
    make_pod(core, ns, "elsewhere", node="other-node")
    src = KubePodSource.from_config(rest, ResourcesConfig())
    view = src.get_pod(ns, "mixed")
    assert view is not None
    assert view.uid == made["uid"] and view.node_name == NODE and view.namespace == ns
    assert [(c.name, c.kind, c.request) for c in view.containers] == [
        ("setup", ContainerKind.INIT, ContainerRequest(2, 10)),
        ("proxy", ContainerKind.SIDECAR, ContainerRequest(1, 0)),
        ("b", ContainerKind.APP, ContainerRequest(4, 30)),
        ("a", ContainerKind.APP, ContainerRequest(0, 0)),
    ]
    assert abs(view.created_at - time.time()) < 600
    assert view.phase == "Pending" and not view.deleted
    assert src.get_pod(ns, "no-such-pod") is None
    names = {(p.namespace, p.name) for p in src.list_node_pods(NODE)}
    assert (ns, "mixed") in names and (ns, "elsewhere") not in names
    assert (ns, "elsewhere") in {(p.namespace, p.name) for p in src.list_node_pods("other-node")}


def test_annotations_set_and_delete(admin: k8s.ApiClient, rest: RestClient, ns: str) -> None:
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    make_pod(core, ns, "annotated")
    pub = KubePublisher(rest, host_node=NODE)
    pub.annotate_node(NODE, {"vendor.com/inventory": '{"d":1}', "vendor.com/x": "1"})
    pub.annotate_node(NODE, {"vendor.com/x": None})
    assert pub.node_annotations(NODE) == {"vendor.com/inventory": '{"d":1}'}
    pub.annotate_pod(ns, "annotated", {"vendor.com/assigned": "GPU-1", "keep": "me"})
    pub.annotate_pod(ns, "annotated", {"vendor.com/assigned": None})
    pod = core.read_namespaced_pod("annotated", ns)
    assert pod.metadata.annotations == {"keep": "me"}
    assert pub.node_annotations("no-such-node") is None
    # 404: the pod is gone, nothing left to annotate: done (no retry), not a failure.
    assert pub.annotate_pod(ns, "no-such-pod", {"a": "b"}) is True
    assert not pub.failures


def test_events_are_created_and_aggregated(
    admin: k8s.ApiClient, rest: RestClient, ns: str
) -> None:
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    made = make_pod(core, ns, "evented")
    pub = KubePublisher(rest, host_node=NODE)
    pub.pod_event(ns, "evented", reason="NoFit", message="no device fits 3 units", warning=True)
    pub.pod_event(ns, "evented", reason="NoFit", message="no device fits 3 units", warning=True)
    pub.node_event(NODE, reason="BackendDegraded", message="NVML gone", warning=False)
    assert pub.failures == {}
    evs = core.list_namespaced_event(ns, field_selector="involvedObject.name=evented").items
    assert len(evs) == 1
    ev = evs[0]
    assert (ev.reason, ev.type, ev.count) == ("NoFit", "Warning", 2)
    assert ev.involved_object.uid == made["uid"] and ev.involved_object.kind == "Pod"
    assert ev.source.component == "gpu-share-plugin" and ev.source.host == NODE
    node_evs = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={NODE},involvedObject.kind=Node"
    ).items
    assert [(e.reason, e.type) for e in node_evs] == [("BackendDegraded", "Normal")]


def test_node_pod_cache_follows_the_real_watch(
    admin: k8s.ApiClient, rest: RestClient, ns: str
) -> None:
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    src = KubePodSource.from_config(rest, ResourcesConfig())
    cache = NodePodCache(src, NODE)
    cache.start()
    try:
        assert cache.wait_synced(15)
        make_pod(core, ns, "watched", containers=[container("c", mem=3)])
        until(lambda: any(p.name == "watched" for p in cache.list_node_pods(NODE)))
        got = cache.get_pod(ns, "watched")
        assert got is not None and got.containers[0].request == ContainerRequest(3, 0)
        core.delete_namespaced_pod("watched", ns, grace_period_seconds=0)
        until(lambda: all(p.name != "watched" for p in cache.list_node_pods(NODE)))
        assert cache.get_pod(ns, "watched") is None
    finally:
        cache.stop(timeout=10)
    assert cache._watch.thread is not None and not cache._watch.thread.is_alive()


def _agent_token(
    admin: k8s.ApiClient, apiserver: ApiServer, tmp_path: Path
) -> tuple[Path, dict[str, str]]:
    """A service account bound to a ClusterRole built from rbac.AGENT_RULES: its token
    file and the in-cluster service env."""
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    rbac: Any = k8s.RbacAuthorizationV1Api(admin)
    sa_ns = "gpu-share-system"
    core.create_namespace({"metadata": {"name": sa_ns}})
    core.create_namespaced_service_account(sa_ns, {"metadata": {"name": "gpu-share"}})
    rules = [
        {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
        for group, resource, verbs in AGENT_RULES
    ]
    bind_cluster_role(rbac, "gpu-share-agent", rules, sa_ns, "gpu-share")
    tr = core.create_namespaced_service_account_token(
        "gpu-share", sa_ns, {"spec": {"expirationSeconds": 3600}}
    )
    token = tmp_path / "token"
    token.write_text(tr.status.token)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(apiserver.port)}
    return token, env


def _agent_client(admin: k8s.ApiClient, apiserver: ApiServer, tmp_path: Path) -> RestClient:
    """The agent's client through the in-cluster code path (token file + CA + env)."""
    token, env = _agent_token(admin, apiserver, tmp_path)
    return make_rest_client(environ=env, token_file=str(token), ca_file=apiserver.ca_file)


def test_agent_works_with_exactly_the_rbac_rules(
    admin: k8s.ApiClient, apiserver: ApiServer, ns: str, tmp_path: Path
) -> None:
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    make_pod(core, ns, "rbac-pod", containers=[container("c", mem=1, core=5)])
    agent = _agent_client(admin, apiserver, tmp_path)
    src = KubePodSource.from_config(agent, ResourcesConfig())
    # RBAC bindings reach the authorizer through an informer: wait until it sees them.
    until(lambda: rbac_allows(lambda: src.get_pod(ns, "rbac-pod")))
    view = src.get_pod(ns, "rbac-pod")
    assert view is not None and view.containers[0].request == ContainerRequest(1, 5)
    assert "rbac-pod" in {p.name for p in src.list_node_pods(NODE)}
    cache = NodePodCache(src, NODE)
    cache.start()
    try:
        assert cache.wait_synced(15)  # list + watch allowed
    finally:
        cache.stop(timeout=10)
    pub = KubePublisher(agent, host_node=NODE)
    pub.annotate_node(NODE, {"vendor.com/agent": "yes"})
    pub.annotate_pod(ns, "rbac-pod", {"vendor.com/agent": "yes"})
    pub.pod_event(ns, "rbac-pod", reason="Allocated", message="ok", warning=False)
    pub.pod_event(ns, "rbac-pod", reason="Allocated", message="ok", warning=False)
    pub.node_event(NODE, reason="Ready", message="ok", warning=False)
    assert pub.failures == {}
    assert (pub.node_annotations(NODE) or {}).get("vendor.com/agent") == "yes"
    # ... and nothing more: no deleting pods, no secrets, no node writes beyond patch.
    pod_path = f"/api/v1/namespaces/{ns}/pods"
    for method, path, body in (
        ("DELETE", f"{pod_path}/rbac-pod", None),
        ("GET", f"/api/v1/namespaces/{ns}/secrets", None),
        ("DELETE", f"/api/v1/nodes/{NODE}", None),
        ("POST", pod_path, {"metadata": {"name": "x"}, "spec": {"containers": [container("c")]}}),
    ):
        with pytest.raises(ApiError) as ei:
            agent.request("forbidden", method, path, body=body)
        assert ei.value.status == 403 and ei.value.reason == "KubeForbidden"
    assert core.read_namespaced_pod("rbac-pod", ns).metadata.name == "rbac-pod"
