"""L3: ``kubectl gpu-share plot`` against a real kube-apiserver + etcd (tests/kube/conftest.py)
as a user holding only get/list on nodes and pods: a fleet of 300 GPU nodes (8 x A100 or
4 x T4, devices idle, shared, full or unhealthy) and pods holding slices. The plot reads
one LIST of nodes and one of pods, like ``nodes``, and its PNG shows every device in the
colour of its used memory and cores. GPU_SHARE_PLOT_OUT=path keeps the picture."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import ApiServer
from kubernetes import client as k8s

from gpu_share.cli import kubectl_plot as kplot
from gpu_share.cli import kubectl_plugin as kp
from gpu_share.cli.kubectl_snapshot import Settings
from gpu_share.sharing.annotations import InventoryAnnotation, inventory_key
from testkit.kube_admin import admin_client
from tests.cli.test_l3_kubectl_plugin import reader_kubeconfig, remove_fleet
from tests.cli.test_plot import _parsed, cell_colours, fleet_objects, read_png

pytestmark = pytest.mark.apiserver

NODES = 300


@pytest.fixture(scope="module")
def fleet(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """(kubeconfig with a read-only "reader" context, label of the fleet, node objects)."""
    api = admin_client(apiserver.kubeconfig)
    core: Any = k8s.CoreV1Api(api)
    rbac: Any = k8s.RbacAuthorizationV1Api(api)
    tag = uuid.uuid4().hex[:6]
    ns = f"kgp-{tag}"
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    nodes, pods = fleet_objects(NODES, tag=tag, namespace=ns)

    def make_node(obj: dict[str, Any]) -> None:
        body = {k: v for k, v in obj.items() if k != "status"}
        core.create_node(body)
        core.patch_node_status(obj["metadata"]["name"], {"status": obj["status"]})

    def make_pod(obj: dict[str, Any]) -> None:
        obj["metadata"].pop("creationTimestamp")
        core.create_namespaced_pod(ns, obj)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make_node, nodes))
        list(pool.map(make_pod, pods))
    kc = reader_kubeconfig(
        apiserver, core, rbac, ns, tag, tmp_path_factory.mktemp("kgp") / "config"
    )
    try:
        yield kc, f"gpu-share-test/run={tag}", nodes
    finally:
        remove_fleet(core, rbac, ns, tag, [n["metadata"]["name"] for n in nodes])


def test_plot_of_300_nodes_with_the_lists_of_nodes(
    fleet: tuple[str, str, list[dict[str, Any]]], requests: list[tuple[str, str]],
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    kc, label, nodes = fleet
    drawn: list[kplot.Picture] = []
    render = kplot.render

    def keep_layout(f: kplot.Fleet, **kw: Any) -> kplot.Picture:
        drawn.append(render(f, **kw))
        return drawn[-1]

    monkeypatch.setattr(kplot, "render", keep_layout)
    flags = ["--kubeconfig", kc, "--context", "reader"]
    assert kp.main([*flags, "nodes", "-l", label, "-o", "json"],
                   environ={"HOME": "/nonexistent"}) == 0
    listed = json.loads(capsys.readouterr().out)["items"]
    by_nodes = list(requests)
    requests.clear()
    out = tmp_path / "cluster.png"
    a = _parsed(*flags, "plot", "--out", str(out), "-l", label)
    api = kp.client(a, {"HOME": "/nonexistent"})
    t0 = time.monotonic()
    try:
        assert kplot.cmd_plot(api, a, Settings()) == 0
    finally:
        api.close()
    took = time.monotonic() - t0
    assert took < 10, f"{NODES} nodes took {took:.1f}s"
    # The same two GETs; the pods' one keeps pending pods (their asks are fgd's workload).
    assert [m for m, _ in requests] == [m for m, _ in by_nodes] == ["GET", "GET"]
    assert requests[0] == by_nodes[0] and "labelSelector=gpu-share-test" in requests[0][1]
    assert requests[1][1].split("?")[0] == by_nodes[1][1].split("?")[0] == "/api/v1/pods"
    assert len(listed) == NODES

    png = read_png(out.read_bytes())
    assert drawn[0].png == out.read_bytes()
    cells, unhealthy = drawn[0].cells, 0
    for obj in nodes:
        name = obj["metadata"]["name"]
        inv = InventoryAnnotation.decode(obj["metadata"]["annotations"][inventory_key(
            "vendor.com")])
        for d in inv.devices:
            box = cells[(name, d.index)]
            mem, cores, _ = cell_colours(png, box)
            if d.healthy:
                assert mem == kplot.used_colour(d.memory_used / d.memory_total), (name, d)
                assert cores == kplot.used_colour(d.cores_used / d.cores_total), (name, d)
            else:
                x, y, _, h = box
                assert png.pixel(x, y + h - 1) == kplot.DEAD
                unhealthy += 1
    assert len(cells) == sum(len(n["devices"]) for n in listed) and unhealthy > 0
    if keep := os.environ.get("GPU_SHARE_PLOT_OUT"):
        shutil.copyfile(out, keep)

