"""The pure parts of bench.scale: node replication, objects, the misplaced count, figures."""

from __future__ import annotations

import json
import math

import pytest

from bench import dra_stream as ds
from bench.replay import trace
from bench.scale import model
from bench.scale.extender_proc import _kind
from gpu_share.sharing.annotations import InventoryAnnotation
from gpu_share.sharing.placement import DeviceSlot, NodeSlots


def _node(name: str, gpus: int) -> NodeSlots:
    devs = tuple(DeviceSlot(f"{name}-gpu{i}", i, 100, 100, 100, 100) for i in range(gpus))
    return NodeSlots(name, devs, 64000, 262144, "V100M16", cpu_total=64000,
                     host_memory_total=262144)


def _pod(name: str, gpus: int, milli: int) -> trace.TracePod:
    return trace.TracePod(name, 4000, 8192, gpus, milli, "")


def test_replicate_keeps_the_list_then_copies_it() -> None:
    src = [_node("a", 2), _node("b", 8), _node("c", 1)]
    got = model.replicate(src, 7, "gss1-")
    assert [n.name for n in got] == [
        "gss1-c0-a", "gss1-c0-b", "gss1-c0-c", "gss1-c1-a", "gss1-c1-b", "gss1-c1-c",
        "gss1-c2-a",
    ]
    assert [len(n.devices) for n in got] == [2, 8, 1, 2, 8, 1, 2]
    # Device ids are unique across copies (the extender keys devices by id).
    ids = [d.uuid for n in got for d in n.devices]
    assert len(ids) == len(set(ids))
    assert model.replicate(src, 2, "x-")[1].cpu_total == 64000
    with pytest.raises(ValueError):
        model.replicate(src, 0, "x-")


def test_replicate_the_trace_sizes() -> None:
    nodes = trace.load_nodes(units=model.UNITS)
    assert len(nodes) == 1213
    assert sum(len(n.devices) for n in model.replicate(nodes, 1213, "p-")) == 6212
    assert len(model.replicate(nodes, 5000, "p-")) == 5000


def test_node_object_has_inventory_taint_and_kwok_annotation() -> None:
    n = _node("gss1-c0-a", 2)
    body = model.node_body(n, "t1")
    meta = body["metadata"]
    assert meta["labels"][model.LABEL] == "t1"
    assert meta["annotations"][model.KWOK_ANNOTATION] == "fake"
    inv = InventoryAnnotation.decode(meta["annotations"][ds.INVENTORY_KEY])
    assert [d.id for d in inv.devices] == ["gss1-c0-a-gpu0", "gss1-c0-a-gpu1"]
    assert body["spec"]["taints"] == [
        {"key": model.TAINT_KEY, "value": "t1", "effect": "NoSchedule"}
    ]
    alloc = model.node_status(n)["status"]["allocatable"]
    assert alloc[ds.MEM] == alloc[ds.CORE] == "200"
    assert alloc["cpu"] == "64000m"


def test_pod_object_tolerates_the_taint_and_asks_the_trace() -> None:
    body = model.vcuda_pod("p00001", _pod("x", 1, 250), "sched", "t1")
    spec = body["spec"]
    assert spec["schedulerName"] == "sched"
    assert spec["nodeSelector"] == {model.LABEL: "t1"}
    assert {"key": model.TAINT_KEY, "operator": "Exists"} in spec["tolerations"]
    res = spec["containers"][0]["resources"]
    assert res["limits"] == {ds.MEM: "25", ds.CORE: "25"}
    assert res["requests"] == {"cpu": "4000m", "memory": "8192Mi"}
    json.dumps(body)  # plain JSON for the REST client


def test_pods_for_is_the_replay_order_up_to_capacity() -> None:
    pods = [_pod(f"p{i}", 1, 500) for i in range(10)] + [_pod("cpu", 0, 0)]
    got = model.pods_for(pods, 42, 3000, 100)
    assert len(got) == 6 and all(p.gpu_request == 500 for p in got)
    assert [p.name for p in got] == [
        p.name for p in trace.arrival_order(pods, 42, 3000) if p.gpu_request
    ][:6]
    assert len(model.pods_for(pods, 42, 3000, 4)) == 4


def test_misplaced_best_fit_without_a_choice() -> None:
    devs = {"n1": ["d0", "d1"]}
    fits = [model.BoundPod("n1", _pod(f"p{i}", 1, 500)) for i in range(4)]
    assert model.misplaced(fits, devs) == 0
    # A fifth half-GPU pod: the node-wide sums may let it in, no device has room.
    assert model.misplaced([*fits, model.BoundPod("n1", _pod("p5", 1, 500))], devs) == 1
    # 0.6 + 0.6 on two devices leaves 0.4 + 0.4: 0.8 in sum, but no device fits 0.5.
    frag = [model.BoundPod("n1", _pod("a", 1, 600)), model.BoundPod("n1", _pod("b", 1, 600)),
            model.BoundPod("n1", _pod("c", 1, 500))]
    assert model.misplaced(frag, devs) == 1
    # Whole GPUs need that many free devices.
    whole = [model.BoundPod("n1", _pod("w", 2, 1000)), model.BoundPod("n1", _pod("x", 1, 100))]
    assert model.misplaced(whole, devs) == 1


def test_misplaced_checks_the_extenders_choice() -> None:
    devs = {"n1": ["d0", "d1"]}
    ok = [model.BoundPod("n1", _pod("a", 1, 600), ("d0",)),
          model.BoundPod("n1", _pod("b", 1, 600), ("d1",))]
    assert model.misplaced(ok, devs) == 0
    over = [*ok, model.BoundPod("n1", _pod("c", 1, 500), ("d0",))]
    assert model.misplaced(over, devs) == 1
    # Bound without a decision (empty choice) counts; so does a foreign device.
    assert model.misplaced([model.BoundPod("n1", _pod("d", 1, 100), ())], devs) == 1
    assert model.misplaced([model.BoundPod("n1", _pod("e", 1, 100), ("zz",))], devs) == 1
    assert model.misplaced([model.BoundPod("n1", _pod("f", 2, 1000), ("d0", "d1"))], devs) == 0


def test_figures_and_table() -> None:
    f = model.PathFigures("extender max", pods=10, bound=8, unschedulable=2, wall_s=4.0,
                          latencies_s=[0.5, 1.0, 2.0], alloc_pct=80.0,
                          filter_ms=[1.0, 3.0], prioritize_ms=[2.0], bind_ms=[5.0],
                          rss_mib=120.0, view_mib=30.0, cpu_s=2.0, api_requests=16)
    assert f.pods_per_s == 2.0
    assert f.api_per_s == 4.0
    base = model.PathFigures("base max", pods=10, bound=10, unschedulable=0, wall_s=0.0)
    assert math.isnan(base.pods_per_s) and math.isnan(base.api_per_s)
    text = model.table([base, f], 80.5)
    lines = text.splitlines()
    assert lines[0].split() == ["base", "max", "extender", "max", "simulator"]
    row = {line[:31].strip(): line[31:].split() for line in lines[1:]}
    assert row["allocation % (GPU-milli)"] == ["-", "80.00", "80.50"]
    assert row["extender filter p50 / p99 ms"] == ["-", "1.0", "/", "3.0", "-"]
    assert row["our API requests (/s)"] == ["-", "16", "(4.0)", "-"]
    assert row["extender CPU s (% of wall)"] == ["-", "2.0", "(50", "%)", "-"]


def test_allocation_and_offsets() -> None:
    assert model.allocation_pct(500, 2000) == 25.0
    assert math.isnan(model.allocation_pct(1, 0))
    assert model.arrival_offsets(3, 0) == [0.0, 0.0, 0.0]
    assert model.arrival_offsets(3, 2) == [0.0, 0.5, 1.0]
    assert model.arrival_offsets(2, model.SEQUENTIAL) == [model.SEQUENTIAL] * 2


def test_api_request_kinds_have_no_names() -> None:
    assert _kind("https://h:6443/api/v1/namespaces/ns/pods/p1/binding") == "pods/binding"
    assert _kind("https://h:6443/api/v1/namespaces/ns/bindings") == "bindings"
    assert _kind("https://h:6443/api/v1/nodes?limit=500") == "nodes"


# ---------------------------------------------------------------- bench.scale.viewmem


def test_viewmem_pods_carry_the_decision_the_view_trusts() -> None:
    from kubernetes import client as k8s

    from bench.scale import viewmem
    from gpu_share.kube.cluster_view import KubeClusterView
    from gpu_share.sharing.decision import decision_key, verify_binding

    nodes = model.replicate(trace.load_nodes(units=model.UNITS), 20, "gsv-")
    cap = ds.capacity_milli(nodes)
    tpods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    # Past the 130 % a replay stops at: the stream goes on as far as asked.
    pods = viewmem.stream_of(tpods, 42, cap, 400)
    assert len(pods) == 400 and all(p.gpu_request > 0 for p in pods)
    placed = viewmem.placements(nodes, pods, ds.workload(tpods))
    assert 0 < sum(p is not None for p in placed) < 400
    view = KubeClusterView(k8s.ApiClient(), domain="vendor.com", memory_resource=ds.MEM,
                           core_resource=ds.CORE, default_workload=ds.workload(tpods),
                           decision_key=viewmem.KEY)
    for n in nodes:
        view._apply("nodes", "ADDED", model.node_body(n, "t") | {"status": ds.node_status(n)})
    used = 0
    for i, (p, pl) in enumerate(zip(pods, placed, strict=True)):
        body = viewmem.pod_body(f"v{i}", p, pl, "t")
        assert body["spec"].get("nodeName") == (pl.node if pl else None)
        if pl is None:
            continue
        uid = f"uid-{i}"
        text = viewmem.decision(body, uid, pl)
        assert verify_binding(text, viewmem.KEY, uid, pl.node).node == pl.node
        body["metadata"].update(uid=uid, annotations={decision_key("vendor.com"): text})
        body["status"] = {"phase": "Pending"}
        view._apply("pods", "ADDED", body)
        used += p.gpu_request
    # Every decision is trusted: the view's devices hold exactly what the simulator put.
    free = sum(d.memory_free for n in nodes if (s := view.node(n.name)) for d in s.devices)
    assert sum(len(n.devices) for n in nodes) * model.UNITS - free == used * model.UNITS // 1000


def _claim(node: str, device: str, cores: int, memory_gib: int, driver: str = ds.DRIVER) -> dict:
    result = {"driver": driver, "pool": node, "device": device,
              "consumedCapacity": {"cores": str(cores), "memory": f"{memory_gib}Gi"}}
    return {"status": {"allocation": {"devices": {"results": [result]}}}}


def test_device_use_sums_the_claims_per_device_rounding_up() -> None:
    claims = [
        _claim("a", "gpu-0", 30, 30), _claim("a", "gpu-0", 25, 20), _claim("a", "gpu-1", 100, 100),
        _claim("b", "gpu-0", 5, 7), _claim("b", "gpu-0", 50, 50, driver="other.example.com"),
        {"status": {}},  # not allocated
    ]
    assert model.device_use(claims) == {"a": {"gpu-0": 55, "gpu-1": 100}, "b": {"gpu-0": 7}}
    half = {"status": {"allocation": {"devices": {"results": [{
        "driver": ds.DRIVER, "pool": "c", "device": "gpu-0",
        "consumedCapacity": {"cores": "1", "memory": "1536Mi"}}]}}}}
    assert model.device_use([half]) == {"c": {"gpu-0": 2}}  # 1.5 units of memory


def test_unbound_that_fit_counts_devices_cpu_and_memory_left() -> None:
    nodes = [_node("a", 2), _node("b", 8)]
    pods = {
        "whole8": _pod("whole8", 8, 1000), "whole2": _pod("whole2", 2, 1000),
        "half": _pod("half", 1, 500), "bound": _pod("bound", 1, 1000),
    }
    # b has 7 of 8 devices free; a has one device with 50 units left.
    used = {"a": {"gpu-0": 50, "gpu-1": 100}, "b": {"gpu-3": 100}}
    got = model.unbound_that_fit(nodes, pods, {"bound": "b"}, used)
    assert got == ["whole2", "half"]  # 8 whole GPUs fit nowhere; "bound" is not counted
    # No CPU left on b: whole2 fits nowhere (a has no whole device), half still fits on a.
    big = {**pods, "hog": trace.TracePod("hog", 64000 - 4000, 8192, 1, 10, "")}
    got = model.unbound_that_fit(nodes, big, {"bound": "b", "hog": "b"}, used)
    assert got == ["half"]
    assert model.unbound_that_fit(nodes, pods, {}, {}) == ["whole8", "whole2", "half", "bound"]
