"""L3: the extender's cluster view on a real kube-apiserver + etcd: host CPU/memory of a
node = its allocatable minus the requests of every pod bound to it (ours or not), plus
bind reservations until the watch shows the pod; pod annotations count only when signed
for that pod on that node. The binder annotates (uid-checked) then binds; the view and
the binder work in-cluster with exactly EXTENDER_RULES."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import ApiServer, bind_cluster_role, rbac_allows
from kubernetes import client as k8s

from gpu_share.errors import BindRefused
from gpu_share.kube.binder import KubeBinder
from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.kube.extender_rbac import EXTENDER_RULES
from gpu_share.kube.rest import ApiError, make_rest_client
from gpu_share.sharing.annotations import (
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
    assignment_key,
    inventory_key,
)
from gpu_share.sharing.model import DeviceShare
from gpu_share.sharing.placement import NodeSlots, Shape, Workload
from testkit.harness.wait import until
from testkit.kube_admin import admin_client

pytestmark = pytest.mark.apiserver

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
KEY = b"l3-cluster-view-key-0123456789"



@pytest.fixture
def env(apiserver: ApiServer) -> Iterator[tuple[k8s.CoreV1Api, str, str, KubeClusterView]]:
    core = k8s.CoreV1Api(admin_client(apiserver.kubeconfig))  # the test's own setup
    tag = uuid.uuid4().hex[:6]
    ns, node = f"cv-{tag}", f"cv-node-{tag}"
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    inv = InventoryAnnotation(
        node, 1024, (InventoryDevice("GPU-0", 0, "T4", 16, 0, 100, 0, True, 0),)
    )
    core.create_node(
        {"metadata": {"name": node, "annotations": {inventory_key("vendor.com"): inv.encode()}}}
    )
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110", MEM: "16", CORE: "100"}
    core.patch_node_status(node, {"status": {"capacity": alloc, "allocatable": alloc}})
    view = KubeClusterView(
        make_rest_client(apiserver.kubeconfig),
        domain="vendor.com",
        memory_resource=MEM,
        core_resource=CORE,
        default_workload=Workload([Shape(4, 30, 1.0)]),
        decision_key=KEY,
    )
    view.start()
    assert view.wait_synced(15)
    try:
        yield core, ns, node, view
    finally:
        view.stop()
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        core.delete_node(node)


def _pod(name: str, node: str | None, cpu: str, mem: str, gpu: bool = False) -> dict[str, Any]:
    res: dict[str, Any] = {"requests": {"cpu": cpu, "memory": mem}}
    if gpu:
        res["limits"] = {MEM: "4", CORE: "30"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def _host(view: KubeClusterView, node: str) -> tuple[int | None, int | None]:
    n: NodeSlots | None = view.node(node)
    assert n is not None
    return (n.cpu_free, n.host_memory_free)


def test_host_resources_follow_bound_pods_and_reservations(
    env: tuple[k8s.CoreV1Api, str, str, KubeClusterView],
) -> None:
    core, ns, node, view = env
    until(lambda: _host(view, node) == (8000, 32768))
    # A GPU-free pod bound to the node takes CPU/memory the GPU pods can no longer use.
    core.create_namespaced_pod(ns, _pod("plain", node, "1500m", "2Gi"))
    until(lambda: _host(view, node) == (6500, 30720))
    # A pending GPU pod reserved by a bind counts at once, then once the watch binds it.
    uid = core.create_namespaced_pod(ns, _pod("gpu", None, "2", "1Gi", gpu=True)).metadata.uid
    until(lambda: uid in view._pods)  # the view saw the pending pod
    view.reserve(uid, node, {"GPU-0": (4, 30)})
    assert _host(view, node) == (4500, 29696)
    n = view.node(node)
    assert n is not None and (n.devices[0].memory_free, n.devices[0].cores_free) == (12, 70)
    # The workload the fgd policy sees carries the pod's host needs.
    shapes = {(s.memory_units, s.cores, s.cpu, s.host_memory) for s in view.workload().shapes}
    assert (4, 30, 2000, 1024) in shapes
    # Deleting the plain pod gives its share back.
    core.delete_namespaced_pod("plain", ns, grace_period_seconds=0)
    until(lambda: _host(view, node) == (6000, 31744))


def test_forged_assignment_annotation_is_ignored(
    env: tuple[k8s.CoreV1Api, str, str, KubeClusterView],
) -> None:
    core, ns, node, view = env

    def gpu_free() -> tuple[int, int]:
        n = view.node(node)
        assert n is not None
        return (n.devices[0].memory_free, n.devices[0].cores_free)

    until(lambda: gpu_free() == (16, 100))
    whole = PodAssignment(
        {"c": ContainerAssignment((DeviceShare("GPU-0", 16, 100, True),), "node-agent")}
    )
    # A tenant's pod on the node claims the whole device in its own annotation.
    forged = _pod("forged", node, "100m", "64Mi", gpu=True)
    forged["metadata"]["annotations"] = {assignment_key("vendor.com"): whole.encode()}
    core.create_namespaced_pod(ns, forged)
    until(lambda: view.untrusted["BadSignature"] >= 1)
    assert gpu_free() == (16, 100)
    # The agent's signed assignment of a real pod counts (the inventory lags here) ...
    uid = core.create_namespaced_pod(ns, _pod("real", node, "100m", "64Mi", gpu=True)).metadata.uid
    four = PodAssignment({"c": ContainerAssignment((DeviceShare("GPU-0", 4, 30),), "node-agent")})
    genuine = four.encode(KEY, pod_uid=uid, node=node)
    core.patch_namespaced_pod(
        "real", ns, {"metadata": {"annotations": {assignment_key("vendor.com"): genuine}}}
    )
    until(lambda: gpu_free() == (12, 70))
    # ... and the same text copied onto the tenant's pod does not.
    core.patch_namespaced_pod(
        "forged", ns, {"metadata": {"annotations": {assignment_key("vendor.com"): genuine}}}
    )
    until(lambda: view.untrusted["UidMismatch"] >= 1)
    assert gpu_free() == (12, 70)


def test_binder_annotates_then_binds_and_a_new_pod_of_the_same_name_is_refused(
    env: tuple[k8s.CoreV1Api, str, str, KubeClusterView], apiserver: ApiServer,
) -> None:
    core, ns, node, view = env
    binder = KubeBinder(make_rest_client(apiserver.kubeconfig))
    uid = core.create_namespaced_pod(ns, _pod("b", None, "100m", "64Mi")).metadata.uid
    binder.annotate_and_bind(ns, "b", uid, node, {"gpu-share.vendor.com/x": "1"})
    got = core.read_namespaced_pod("b", ns)
    assert got.spec.node_name == node and got.metadata.annotations["gpu-share.vendor.com/x"] == "1"
    assert view.pod(ns, "b") is not None and view.pod(ns, "gone") is None
    # Bound already: the server answers 409, the call did nothing.
    with pytest.raises(BindRefused, match="409"):
        binder.annotate_and_bind(ns, "b", uid, node, {})
    # A same-named pod made after the decision: the uid in the patch makes it a refusal.
    core.delete_namespaced_pod("b", ns, grace_period_seconds=0)
    until(lambda: not core.list_namespaced_pod(ns, field_selector="metadata.name=b").items)
    core.create_namespaced_pod(ns, _pod("b", None, "100m", "64Mi"))
    with pytest.raises(BindRefused):
        binder.annotate_and_bind(ns, "b", uid, node, {"gpu-share.vendor.com/x": "2"})
    assert core.read_namespaced_pod("b", ns).spec.node_name is None


def test_extender_works_in_cluster_with_exactly_its_rbac_rules(
    env: tuple[k8s.CoreV1Api, str, str, KubeClusterView], apiserver: ApiServer, tmp_path: Path,
) -> None:
    """The extender's view and binder through the in-cluster path (service env, token
    file, CA) as a service account bound to a ClusterRole of EXTENDER_RULES only."""
    core, ns, node, _ = env
    admin = admin_client(apiserver.kubeconfig)
    setup: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    tag = uuid.uuid4().hex[:6]
    sa_ns = f"ext-sa-{tag}"
    setup.create_namespace({"metadata": {"name": sa_ns}})
    setup.create_namespaced_service_account(sa_ns, {"metadata": {"name": "extender"}})
    rules = [{"apiGroups": [g], "resources": [r], "verbs": list(v)} for g, r, v in EXTENDER_RULES]
    bind_cluster_role(k8s.RbacAuthorizationV1Api(admin), f"gpu-share-extender-{tag}", rules,
                      sa_ns, "extender")
    tr = setup.create_namespaced_service_account_token(
        "extender", sa_ns, {"spec": {"expirationSeconds": 3600}})
    token = tmp_path / "token"
    token.write_text(tr.status.token)
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(apiserver.port)}
    api = make_rest_client(environ=environ, token_file=str(token), ca_file=apiserver.ca_file)
    until(lambda: rbac_allows(lambda: api.get("list nodes", "/api/v1/nodes", {"limit": 1})))
    view = KubeClusterView(api, domain="vendor.com", memory_resource=MEM, core_resource=CORE,
                           default_workload=Workload([Shape(4, 30, 1.0)]), decision_key=KEY)
    view.start()
    try:
        assert view.wait_synced(15)  # list + watch of nodes and pods allowed
        until(lambda: view.node(node) is not None)
        uid = core.create_namespaced_pod(ns, _pod("sa", None, "100m", "64Mi")).metadata.uid
        KubeBinder(api).annotate_and_bind(ns, "sa", uid, node, {"gpu-share.vendor.com/x": "1"})
        assert core.read_namespaced_pod("sa", ns).spec.node_name == node
        assert view.pod(ns, "sa") is not None
    finally:
        view.stop()
    # ... and nothing more: no pod creation, no secrets.
    with pytest.raises(ApiError) as ei:
        api.get("list secrets", f"/api/v1/namespaces/{ns}/secrets")
    assert ei.value.status == 403
