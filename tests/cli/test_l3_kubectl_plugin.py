"""L3: ``kubectl gpu-share`` against a real kube-apiserver + etcd (tests/kube/conftest.py),
as a user holding nothing but get/list on nodes and pods (a ClusterRole), chosen with
--context from a kubeconfig whose current context is the admin: 300 GPU nodes with
inventory annotations, pods with assignment annotations; nodes, pods and fit print what
the annotations say with one LIST of nodes and one of pods, and fit agrees with the
scheduler extender's own view and filter on the same server. Last, through a real
kubectl finding the plugin on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_fakes import ApiServer, bind_cluster_role
from kubernetes import client as k8s

from gpu_share.cli import kubectl_plugin as kp
from gpu_share.cli.kubectl_fit import DEFAULT_WORKLOAD, parse_workload, probe_pod
from gpu_share.cli.kubectl_snapshot import Settings
from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.kube.binder import KubeBinder
from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.kube.rest import ApiError, RestClient, make_rest_client
from gpu_share.kube.rest_config import kubeconfig_config
from gpu_share.sharing.placement import make_policy
from testkit.harness import K8S_VERSION
from testkit.kube_admin import admin_client
from tests.cli.objects import CORE, KEY, MEM, assignment, node_obj, pod_obj

pytestmark = pytest.mark.apiserver

NODES = 300
# Node i: one device of 16 units. gpu-000: 4 used by the inventory + pods below;
# gpu-001: unhealthy; gpu-002: 12 used; every other node full.


def _devices(i: int) -> list[tuple[int, int, int, bool]]:
    if i == 0:
        return [(16, 0, 0, True), (16, 0, 0, True)]
    if i == 1:
        return [(16, 0, 0, False)]
    if i == 2:
        return [(16, 12, 70, True)]
    return [(16, 16, 100, True)]


@dataclass
class Env:
    tag: str
    ns: str
    label: str
    kubeconfig: str  # current context: the admin; "reader": the read-only user
    admin: Any


def _reader_token(core: Any, rbac: Any, ns: str, tag: str) -> str:
    core.create_namespaced_service_account(ns, {"metadata": {"name": "reader"}})
    rules = [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list"]}]
    bind_cluster_role(rbac, f"gs-reader-{tag}", rules, ns, "reader")
    tr = core.create_namespaced_service_account_token(
        "reader", ns, {"spec": {"expirationSeconds": 3600}})
    return str(tr.status.token)


def _kubeconfig(apiserver: ApiServer, token: str, ns: str, path: Path) -> str:
    admin = yaml.safe_load(Path(apiserver.kubeconfig).read_text())
    admin["users"].append({"name": "reader", "user": {"token": token}})
    admin["contexts"].append({"name": "reader",
                              "context": {"cluster": "test", "user": "reader", "namespace": ns}})
    path.write_text(yaml.safe_dump(admin))
    return str(path)


def reader_kubeconfig(
    apiserver: ApiServer, core: Any, rbac: Any, ns: str, tag: str, path: Path
) -> str:
    """A kubeconfig at ``path`` whose "reader" context is a service account of ``ns``
    holding only get/list on nodes and pods (ClusterRole gs-reader-<tag>), returned once
    the API server authorizes it."""
    kc = _kubeconfig(apiserver, _reader_token(core, rbac, ns, tag), ns, path)
    reader = RestClient(kubeconfig_config(kc, "reader"))
    deadline = time.monotonic() + 15
    while True:  # RBAC reaches the authorizer's cache a moment later
        try:
            reader.get("list nodes", "/api/v1/nodes", {"limit": 1})
            return kc
        except ApiError as e:
            if e.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def remove_fleet(core: Any, rbac: Any, ns: str, tag: str, nodes: list[str]) -> None:
    """Deletes what a fixture made: the pods and namespace ``ns``, the ``nodes``, the
    reader's ClusterRole and binding."""
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    core.delete_namespace(ns)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(core.delete_node, nodes))
    rbac.delete_cluster_role_binding(f"gs-reader-{tag}")
    rbac.delete_cluster_role(f"gs-reader-{tag}")


@pytest.fixture(scope="module")
def env(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    api = admin_client(apiserver.kubeconfig)
    core: Any = k8s.CoreV1Api(api)  # dict bodies: the stubs want models
    rbac: Any = k8s.RbacAuthorizationV1Api(api)
    tag = uuid.uuid4().hex[:6]
    ns, label = f"kgs-{tag}", f"gpu-share-test/run={tag}"
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    names = [f"gpu-{tag}-{i:03d}" for i in range(NODES)]

    def make(i: int) -> None:
        obj = node_obj(names[i], _devices(i), pool="t4" if i % 2 else "a100",
                       labels={"gpu-share-test/run": tag})
        status = obj.pop("status")
        core.create_node(obj)
        if i < 3:
            core.patch_node_status(names[i], {"status": status})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(NODES)))
    n0 = names[0]
    pods = [
        ("train", {"main": (6, 30)}, [(0, 6, 30, False)]),
        ("infer", {"main": (4, 20)}, [(1, 4, 20, False)]),
    ]
    for name, asks, shares in pods:
        obj = pod_obj(name, n0, asks, namespace=ns)
        obj["metadata"].pop("creationTimestamp")
        annotations = obj["metadata"].pop("annotations", None)
        uid = core.create_namespaced_pod(ns, obj).metadata.uid
        text = assignment(n0, {"main": shares}, key=KEY, uid=uid)
        core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {
            **(annotations or {}), "gpu-share.vendor.com/assignment": text}}})
    pending = pod_obj("waiting", None, {"main": (8, 50)}, namespace=ns)
    pending["metadata"].pop("creationTimestamp")
    core.create_namespaced_pod(ns, pending)
    kc = reader_kubeconfig(
        apiserver, core, rbac, ns, tag, tmp_path_factory.mktemp("kgs") / "config"
    )
    try:
        yield Env(tag, ns, label, kc, core)
    finally:
        remove_fleet(core, rbac, ns, tag, names)


def run(env: Env, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = kp.main(["--kubeconfig", env.kubeconfig, "--context", "reader", *argv],
                 environ={"HOME": "/nonexistent"})
    out, err = capsys.readouterr()
    return rc, out, err


def test_nodes_of_300_with_one_list_each(
    env: Env, requests: list[tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.monotonic()
    rc, out, err = run(env, capsys, "nodes", "-l", env.label)
    took = time.monotonic() - t0
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 + NODES + 1  # header, one row per device (gpu-000 has two)
    assert [m for m, _ in requests] == ["GET", "GET"]
    assert requests[0][1].startswith("/api/v1/nodes?") and "labelSelector=gpu-share-test" \
        in requests[0][1]
    assert requests[1][1].startswith("/api/v1/pods?")
    assert took < 10, f"{NODES} nodes took {took:.1f}s"
    n0 = f"gpu-{env.tag}-000"
    assert lines[1].split() == [n0, "0", "Tesla", "T4", "6/16Gi", "30/100", "Healthy", "1",
                                "12Gi/80%", "mem[####------]", "core[###-------]"]
    assert lines[2].split()[:8] == [n0, "1", "Tesla", "T4", "4/16Gi", "20/100", "Healthy", "1"]
    assert "Unhealthy" in lines[3] and lines[4].split()[4:9] == [
        "12/16Gi", "70/100", "Healthy", "0", "4Gi/30%"]
    assert lines[5].split()[4:9] == ["16/16Gi", "100/100", "Healthy", "0", "0Gi/0%"]


def test_nodes_filters_and_documents(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(env, capsys, "nodes", "-l", env.label, "--unhealthy", "-o", "json")
    assert rc == 0
    assert [n["name"] for n in json.loads(out)["items"]] == [f"gpu-{env.tag}-001"]
    rc, out, _ = run(env, capsys, "nodes", "-l", env.label, "--pool", "t4", "-o", "yaml")
    items = yaml.safe_load(out)["items"]
    assert len(items) == NODES // 2 and {n["pool"] for n in items} == {"t4"}
    rc, out, _ = run(env, capsys, "nodes", f"gpu-{env.tag}-000", "-l", env.label, "-o", "wide")
    lines = out.splitlines()
    assert len(lines) == 3 and lines[1].split()[-4:] == [
        "a100", f"GPU-gpu-{env.tag}-000-0", "0", f"{env.ns}/train"]


def test_pods_in_the_contexts_namespace(
    env: Env, requests: list[tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(env, capsys, "pods")  # no -n: the reader context's namespace
    assert rc == 0, err
    assert requests[0][1].startswith(f"/api/v1/namespaces/{env.ns}/pods?")
    rows = {r.split()[0]: r.split() for r in out.splitlines()[1:]}
    assert rows["train"][:8] == ["train", "main", f"gpu-{env.tag}-000", "0", "6Gi", "30",
                                 "shared", "node-agent"]
    assert rows["infer"][3] == "1"
    assert rows["waiting"][2:8] == ["<none>", "<none>", "8u", "50", "shared", "pending"]
    assert rows["train"][8].endswith("s") or rows["train"][8].endswith("m")  # age
    rc, out, _ = run(env, capsys, "pods", "-A", "-o", "json")
    mine = [p for p in json.loads(out)["items"] if p["namespace"] == env.ns]
    assert {(p["pod"], p["signed"]) for p in mine} == {
        ("train", True), ("infer", True), ("waiting", False)}


def _extender_verdict(apiserver: ApiServer, names: list[str], pod: dict[str, Any]
                      ) -> dict[str, str]:
    """What the real extender (its view over list+watch, trusting KEY) filters out."""
    api = make_rest_client(apiserver.kubeconfig)
    view = KubeClusterView(api, domain="vendor.com", memory_resource=MEM, core_resource=CORE,
                           default_workload=parse_workload(DEFAULT_WORKLOAD),
                           decision_key=KEY)
    view.start()
    try:
        assert view.wait_synced(30)
        ext = Extender(ExtenderSettings(Settings().names, "vendor.com", KEY), view,
                       KubeBinder(api), lambda v: make_policy("fgd", v.workload()))
        got = ext.filter({"Pod": pod, "Nodes": {"items": []}, "NodeNames": names})
        return dict(got["FailedNodes"])
    finally:
        view.stop()


def test_fit_agrees_with_the_extender(
    env: Env, apiserver: ApiServer, requests: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run(env, capsys, "fit", "--memory", "6", "--cores", "30", "-l", env.label,
                       "-o", "json")
    assert rc == 0, err
    assert len(requests) == 2  # one LIST of nodes, one of pods
    doc = json.loads(out)
    n = [f"gpu-{env.tag}-{i:03d}" for i in range(NODES)]
    assert [(f["node"], f["score"]) for f in doc["fits"]] == [(n[0], 10)]
    assert doc["fits"][0]["devices"] == [
        {"container": "main", "index": 1, "id": f"GPU-{n[0]}-1"}]  # fgd: the emptier one
    assert doc["failed"][n[1]] == "gpu-share: no healthy device"
    assert doc["failed"][n[2]] == (
        "gpu-share: no single device fits (main: 6 memory units/30 cores); largest free "
        "block is 4 memory units and 30 cores, 0 device(s) wholly free")
    assert len(doc["failed"]) == NODES - 1
    pod = probe_pod(Settings(), 6, 30)
    assert _extender_verdict(apiserver, n, pod) == doc["failed"]
    rc, out, _ = run(env, capsys, "fit", "--memory", "13", "--cores", "10", "-l", env.label)
    assert rc == kp.EXIT_NO_FIT and out.startswith("Fits on no node.")
    rc, out, _ = run(env, capsys, "fit", "--memory", "1", "--cores", "1", "--cpu", "16",
                     "-l", env.label)
    assert "insufficient cpu (14000m free, 16000m requested)" in out  # 2 pods of 1 CPU


def test_writes_are_not_needed_nor_allowed(env: Env) -> None:
    reader = RestClient(kubeconfig_config(env.kubeconfig, "reader"))
    with pytest.raises(ApiError) as e:
        reader.patch("patch node", f"/api/v1/nodes/gpu-{env.tag}-000",
                     {"metadata": {"labels": {"x": "y"}}})
    assert e.value.status == 403


def test_through_kubectl_plugin_discovery(env: Env, tmp_path: Path) -> None:
    cache = Path(os.environ.get("GPU_SHARE_CACHE", str(Path.home() / ".cache" / "gpu-share")))
    # The kubectl the test command built (never one that happens to be on PATH).
    kubectl = cache / f"k8s-{K8S_VERSION}" / "bin" / "kubectl"
    if not kubectl.is_file():
        pytest.skip(f"no kubectl built at {kubectl} (hack/local-up-cluster.sh build)")
    shim = tmp_path / "kubectl-gpu_share"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpu_share.cli.kubectl_plugin \"$@\"\n")
    shim.chmod(0o755)
    run_env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
               "KUBECONFIG": env.kubeconfig}
    got = subprocess.run(
        [str(kubectl), "gpu-share", "--context", "reader", "nodes", "-l", env.label,
         "--unhealthy"],
        capture_output=True, text=True, env=run_env, timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[1].split()[:2] == [f"gpu-{env.tag}-001", "0"]
    listed = subprocess.run([str(kubectl), "plugin", "list"], capture_output=True, text=True,
                            env=run_env, timeout=60, check=False)
    assert str(shim) in listed.stdout
