"""The extender over real HTTP on 127.0.0.1, against a fake view and binder."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.http import make_server
from gpu_share.extender.ports import ClusterView
from gpu_share.sharing.decision import decision_key, verify
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    PodView,
    ResourceNames,
)
from gpu_share.sharing.placement import DeviceSlot, NodeSlots, Shape, Workload, make_policy

KEY = b"secret-key-for-tests"
MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"


class FakeView:
    def __init__(self) -> None:
        self.nodes = {
            # a: one device with 8 units / 40 cores free; b: idle 16-unit devices.
            "a": NodeSlots("a", (DeviceSlot("GPU-a0", 0, 16, 8, 100, 40),)),
            "b": NodeSlots(
                "b",
                (
                    DeviceSlot("GPU-b0", 0, 16, 16, 100, 100),
                    DeviceSlot("GPU-b1", 1, 16, 16, 100, 100),
                ),
            ),
        }
        self.reserved: list[tuple[str, str, dict[str, tuple[int, int]]]] = []

    def node(self, name: str) -> NodeSlots | None:
        return self.nodes.get(name)

    def workload(self) -> Workload:
        return Workload([Shape(4, 30, 1.0), Shape(16, 100, 1.0)])

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        self.reserved.append((pod_uid, node, dict(shares)))

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None


class FakeBinder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.annotations: dict[str, str] = {}

    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        self.annotations.update(annotations)
        self.calls.append(("annotate", namespace, name, uid))
        self.calls.append(("bind", namespace, name, node))


def kpod(mem: int, cores: int, uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {MEM: str(mem), CORE: str(cores)}}},
                {"name": "plain", "resources": {"requests": {"cpu": "1"}}},
            ]
        },
    }


@pytest.fixture
def served() -> Iterator[tuple[str, FakeView, FakeBinder]]:
    view, binder = FakeView(), FakeBinder()

    def policy(v: ClusterView) -> Any:
        return make_policy("fgd", v.workload())

    ext = Extender(
        ExtenderSettings(ResourceNames(MEM, CORE), "vendor.com", KEY),
        view,
        binder,
        policy,
        clock=lambda: 1_700_000_000.0,
    )
    server = make_server(ext, "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", view, binder
    finally:
        server.shutdown()
        server.server_close()
        t.join(timeout=5)


def post(url: str, body: object) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_filter_removes_nodes_without_a_single_fitting_device(served: Any) -> None:
    url, _, _ = served
    got = post(url + "/filter", {"Pod": kpod(12, 30), "NodeNames": ["a", "b", "zz"]})
    assert got["NodeNames"] == ["b"]
    assert "no single device fits" in got["FailedNodes"]["a"]
    assert "largest free block is 8 memory units" in got["FailedNodes"]["a"]
    assert "inventory" in got["FailedNodes"]["zz"]
    assert got["Error"] == ""


def test_filter_with_full_node_objects(served: Any) -> None:
    url, _, _ = served
    nodes = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    got = post(url + "/filter", {"Pod": kpod(4, 30), "Nodes": nodes})
    assert [n["metadata"]["name"] for n in got["Nodes"]["items"]] == ["a", "b"]


def test_prioritize_gives_the_policy_choice_the_top_score(served: Any) -> None:
    url, _, _ = served
    got = post(url + "/prioritize", {"Pod": kpod(4, 30), "NodeNames": ["b", "a"]})
    scores = {h["Host"]: h["Score"] for h in got}
    # Finishing the half-used device of a keeps b's devices whole.
    assert scores == {"a": 10, "b": 9}


def test_pod_without_our_resources_passes_everything(served: Any) -> None:
    url, _, _ = served
    got = post(url + "/filter", {"Pod": kpod(0, 0), "NodeNames": ["a", "b"]})
    assert got["NodeNames"] == ["a", "b"] and got["FailedNodes"] == {}


def test_bind_writes_signed_decision_then_binds(served: Any) -> None:
    url, view, binder = served
    post(url + "/filter", {"Pod": kpod(4, 30), "NodeNames": ["a", "b"]})
    got = post(
        url + "/bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "b"}
    )
    assert got == {"Error": ""}
    assert [c[0] for c in binder.calls] == ["annotate", "bind"]
    text = binder.annotations[decision_key("vendor.com")]
    pv = PodView(
        "uid-1",
        "ns",
        "p",
        "b",
        (ContainerView("main", ContainerKind.APP, ContainerRequest(4, 30)),),
    )
    d = verify(text, KEY, pv, 1_700_000_010.0, node="b")
    assert d.devices_of("main") == ("GPU-b0",)
    assert view.reserved == [("uid-1", "b", {"GPU-b0": (4, 30)})]


def test_bind_that_no_longer_fits_reports_an_error(served: Any) -> None:
    url, _, binder = served
    post(url + "/filter", {"Pod": kpod(12, 30, uid="u2"), "NodeNames": ["a"]})
    got = post(url + "/bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "u2", "Node": "a"})
    assert "no single device fits" in got["Error"] and binder.calls == []


def test_bad_requests(served: Any) -> None:
    url, _, _ = served
    req = urllib.request.Request(url + "/filter", b"not json", {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
        assert r.status == 200


def test_host_cpu_and_memory_count_like_the_replay(served: Any) -> None:
    url, view, _ = served
    gpu = (DeviceSlot("GPU-c0", 0, 16, 16, 100, 100),)
    # c: the GPU fits but only 0.5 CPU is left (the pod's plain container asks 1);
    # d: CPU fits, memory does not.
    view.nodes["c"] = NodeSlots("c", gpu, cpu_free=500, host_memory_free=10_000)
    pod = kpod(4, 30)
    pod["spec"]["containers"][1]["resources"]["requests"]["memory"] = "2Gi"
    view.nodes["d"] = NodeSlots("d", gpu, cpu_free=8000, host_memory_free=1024)
    view.nodes["e"] = NodeSlots("e", gpu, cpu_free=8000, host_memory_free=4096)
    got = post(url + "/filter", {"Pod": pod, "NodeNames": ["c", "d", "e"]})
    assert got["NodeNames"] == ["e"]
    assert "insufficient cpu (500m free, 1000m requested)" in got["FailedNodes"]["c"]
    assert "insufficient memory (1024Mi free, 2048Mi requested)" in got["FailedNodes"]["d"]


def test_unparseable_host_quantity_is_a_filter_error(served: Any) -> None:
    url, _, _ = served
    pod = kpod(4, 30)
    pod["spec"]["containers"][1]["resources"]["requests"]["cpu"] = "lots"
    got = post(url + "/filter", {"Pod": pod, "NodeNames": ["a"]})
    assert "not a quantity" in got["Error"]
