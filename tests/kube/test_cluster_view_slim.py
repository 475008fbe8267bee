"""The view's list keeps only what the view reads of each object (``slim_pod``,
``slim_node``), trimmed as each page arrives: a view fed the trimmed objects reads
exactly like one fed the whole ones, and a list never holds every whole object."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.kube.listwatch import _all_pages
from gpu_share.kube.view_objects import slim_node, slim_pod
from gpu_share.sharing.decision import ContainerDecision, Decision, decision_key, sign
from gpu_share.sharing.model import ContainerRequest
from tests.kube.test_cluster_view_cache import CORE, KEY, MEM, NODES, Clock, World, new_view

MODEL_LABEL = "nvidia.com/gpu.product"


def fat(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server adds that the view never reads."""
    o = copy.deepcopy(obj)
    meta = o.get("metadata")
    if isinstance(meta, dict):
        meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 3
        meta["labels"] = {**meta.get("labels", {}), "app": "x" * 40}
    st = o.setdefault("status", {})
    st["conditions"] = [{"type": "Ready", "status": "True", "message": "m" * 200}]
    st["images"] = [{"names": [f"registry/img{i}:v1"], "sizeBytes": 1} for i in range(20)]
    for c in (o.get("spec") or {}).get("containers") or []:
        if isinstance(c, dict):
            c["env"] = [{"name": f"E{i}", "value": "v" * 50} for i in range(10)]
            c["image"] = "registry/app:v1"
    return o


def hand_pods() -> list[dict[str, Any]]:
    """The cases a random world does not make: sidecars, init containers, overhead,
    model requirements, decisions, finished and malformed pods."""
    lim = {"limits": {MEM: "4", CORE: "30"}, "requests": {"cpu": "1", "memory": "1Gi"}}
    d = Decision("h2", "n1", {"c": ContainerDecision(("n1-g0",), ContainerRequest(4, 30))}, 1)
    return [
        {"metadata": {"name": "h1", "namespace": "t", "uid": "h1"},
         "spec": {"nodeName": "n0", "overhead": {"cpu": "250m", "memory": "64Mi"},
                  "initContainers": [
                      {"name": "side", "restartPolicy": "Always", "resources": lim},
                      {"name": "init", "resources": {"requests": {"cpu": "3"}}}],
                  "containers": [{"name": "c", "resources": lim}]},
         "status": {"phase": "Running"}},
        {"metadata": {"name": "h2", "namespace": "t", "uid": "h2",
                      "annotations": {decision_key("vendor.com"): sign(d, KEY)}},
         "spec": {"nodeName": "n1", "nodeSelector": {MODEL_LABEL: "Tesla-T4"},
                  "containers": [{"name": "c", "resources": lim}]},
         "status": {"phase": "Running"}},
        {"metadata": {"name": "h3", "namespace": "t", "uid": "h3"},
         "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                  {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": MODEL_LABEL, "operator": "In", "values": ["A100"]}]}]}}},
                  "containers": [{"name": "c", "resources": lim}]}},
        {"metadata": {"name": "h4", "namespace": "t", "uid": "h4"},
         "spec": {"nodeName": "n2", "containers": [{"name": "c", "resources": lim}]},
         "status": {"phase": "Succeeded"}},
        {"metadata": {"name": "h5", "namespace": "t", "uid": "h5"},
         "spec": {"nodeName": "n2", "containers": "not a list"}},
        {"metadata": {"name": "h6", "namespace": "t", "uid": "h6"},
         "spec": {"nodeName": "n3", "containers": [7, {"name": "c", "resources": lim}]}},
        {"metadata": None, "spec": None},
    ]


def same(a: KubeClusterView, b: KubeClusterView) -> None:
    for n in [*NODES, "absent"]:
        assert a.node(n) == b.node(n), n
    assert a.workload().shapes == b.workload().shapes
    assert (a._pods, a._asks, a._trusted, a.untrusted) == (b._pods, b._asks, b._trusted,
                                                          b.untrusted)


@pytest.mark.parametrize("seed", range(20))
def test_a_view_of_slim_objects_reads_like_one_of_whole_objects(seed: int) -> None:
    world = World(random.Random(seed))
    for _ in range(60):
        world.step()
    nodes = [fat(n) for n in world.seen_nodes.values()]
    pods = [fat(p) for p in [*world.seen_pods.values(), *hand_pods()]]
    whole, slim = new_view(Clock()), new_view(Clock())
    whole._replace("nodes", copy.deepcopy(nodes))
    whole._replace("pods", copy.deepcopy(pods))
    slim._replace("nodes", [slim_node(copy.deepcopy(n)) for n in nodes])
    slim._replace("pods", [slim_pod(copy.deepcopy(p)) for p in pods])
    same(whole, slim)


def test_slim_objects_drop_what_the_view_never_reads() -> None:
    pod = fat(hand_pods()[0])
    s = slim_pod(pod)
    assert "managedFields" not in s["metadata"] and s["status"] == {"phase": "Running"}
    assert all(set(c) <= {"name", "resources", "restartPolicy"}
               for c in s["spec"]["containers"] + s["spec"]["initContainers"])
    node = slim_node(fat({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "8"}}}))
    assert node == {"metadata": {"name": "n", "labels": {"app": "x" * 40}},
                    "status": {"allocatable": {"cpu": "8"}}}


def test_a_list_trims_each_page_as_it_arrives() -> None:
    pages = {None: {"items": [{"a": 1, "big": "x"}], "metadata": {"continue": "p2"}},
             "p2": {"items": [{"a": 2, "big": "y"}], "metadata": {"resourceVersion": "9"}}}
    seen_pages: list[str | None] = []
    kept: list[int] = []

    def fetch(cont: str | None) -> dict[str, Any]:
        seen_pages.append(cont)
        assert len(kept) == len(seen_pages) - 1  # the last page was trimmed already
        return pages[cont]

    def keep(item: dict[str, Any]) -> dict[str, Any]:
        kept.append(item["a"])
        return {"a": item["a"]}

    items, rv = _all_pages("list x", fetch, keep)
    assert items == [{"a": 1}, {"a": 2}] and rv == "9" and seen_pages == [None, "p2"]
