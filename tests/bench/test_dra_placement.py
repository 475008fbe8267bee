"""The pure parts of bench.dra_placement: one stream, the same asks on both paths, figures."""

from __future__ import annotations

from fractions import Fraction

import pytest

from bench import dra_placement as dp
from bench import dra_stream as ds
from bench.replay import trace
from gpu_share.sharing.dra.slices import device_name
from gpu_share.sharing.placement import DeviceSlot, NodeSlots
from gpu_share.sharing.quantity import parse_quantity
from testkit.jsonpatch import PatchError, apply_patch


def _pod(name: str, gpus: int, milli: int, cpu: int = 1000, mem: int = 1024) -> trace.TracePod:
    return trace.TracePod(name, cpu, mem, gpus, milli, "")


def _node(name: str, gpus: int) -> NodeSlots:
    devs = tuple(DeviceSlot(f"{name}-gpu{i}", i, 100, 100, 100, 100) for i in range(gpus))
    return NodeSlots(name, devs, 64000, 262144, "V100M16", cpu_total=64000,
                     host_memory_total=262144)


def test_sample_nodes_every_kth() -> None:
    nodes = [_node(f"n{i:02d}", 1) for i in range(10)]
    assert [n.name for n in ds.sample_nodes(nodes, 3)] == ["n00", "n03", "n06"]
    assert len(ds.sample_nodes(nodes, 20)) == 10
    with pytest.raises(ValueError):
        ds.sample_nodes(nodes, 0)


def test_sample_pods_is_the_arrival_order_prefix_of_gpu_pods() -> None:
    pods = [_pod(f"p{i:02d}", 1 if i % 3 else 0, 500) for i in range(30)]
    got = ds.sample_pods(pods, 7, capacity=10_000, max_pods=5)
    want = [p for p in trace.arrival_order(pods, 7, 10_000) if p.gpu_request > 0][:5]
    assert got == want
    # The GPU-milli bound cuts before the pod count does.
    assert len(ds.sample_pods(pods, 7, capacity=2000, max_pods=50, max_arrived_pct=100)) == 4


def test_renamed_keeps_order_and_devices() -> None:
    got = ds.renamed([_node("a", 2), _node("b", 1)], "x-")
    assert [n.name for n in got] == ["x-a", "x-b"]
    assert got[0].devices[1].uuid == "x-a-gpu1"
    assert got[0].cpu_total == 64000


def test_slice_has_one_device_per_gpu_of_100_gib_and_100_cores() -> None:
    body = ds.resource_slice(_node("n1", 3), "tag")
    spec = body["spec"]
    assert spec["nodeName"] == "n1" and spec["pool"]["name"] == "n1"
    assert spec["driver"] == ds.DRIVER
    assert body["metadata"]["labels"] == ds.node_labels("tag")
    assert [d["name"] for d in spec["devices"]] == [device_name(i) for i in range(3)]
    cap = spec["devices"][0]["capacity"]
    assert parse_quantity(cap["memory"]["value"]) == 100 * 2**30
    assert cap["cores"]["value"] == "100"
    assert spec["devices"][0]["allowMultipleAllocations"] is True


def test_node_status_and_inventory_match_the_extender_test() -> None:
    n = _node("n1", 2)
    st = ds.node_status(n)
    assert st["allocatable"][ds.MEM] == "200" and st["allocatable"]["cpu"] == "64000m"
    assert ds.inventory_annotation(n)


@pytest.mark.parametrize(
    ("gpus", "milli", "template", "count", "caps"),
    [
        (1, 230, "gpu-share-m23-c23", 1, {"cores": "23", "memory": "23552Mi"}),
        (1, 125, "gpu-share-m13-c13", 1, {"cores": "13", "memory": "13312Mi"}),
        (1, 1000, "gpu-share-m100-c100", 1, {"cores": "100"}),
        (4, 1000, "gpu-share-m400-c400", 4, {"cores": "100"}),
    ],
)
def test_dra_pod_is_the_webhooks_rewrite_of_the_extender_pod(
    gpus: int, milli: int, template: str, count: int, caps: dict[str, str]
) -> None:
    p = _pod("x", gpus, milli, cpu=4000, mem=30517)
    vcuda = ds.vcuda_pod("p0001", p, "sched", "tag")
    d = p.demand(ds.UNITS).containers[0]
    assert vcuda["spec"]["containers"][0]["resources"]["limits"] == {
        ds.MEM: str(d.memory_units),
        ds.CORE: str(d.cores),
    }
    pod, t = ds.dra_pod(vcuda, "ns1", ds.translation_settings("cls"))
    res = pod["spec"]["containers"][0]["resources"]
    assert res["limits"] == {}
    assert res["requests"] == {"cpu": "4000m", "memory": "30517Mi"}
    assert res["claims"] == [{"name": "gpu-share-main"}]
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu-share-main", "resourceClaimTemplateName": template}
    ]
    assert pod["spec"]["schedulerName"] == "sched"
    (tb,) = t.templates
    exactly = tb["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert tb["metadata"] == {
        "name": template, "namespace": "ns1",
        "labels": {"app.kubernetes.io/managed-by": "gpu-share"},
    }
    assert exactly["deviceClassName"] == "cls" and exactly["count"] == count
    assert exactly["capacity"]["requests"] == caps
    # The input is left as it was.
    assert vcuda["spec"]["containers"][0]["resources"]["limits"]


def test_apply_patch_add_remove_replace_append_and_escapes() -> None:
    doc = {"a": {"b/c": 1, "l": [1, 2], "r": "4"}}
    out = apply_patch(
        doc,
        [
            {"op": "remove", "path": "/a/b~1c"},
            {"op": "add", "path": "/a/l/-", "value": 3},
            {"op": "add", "path": "/a/l/0", "value": 0},
            {"op": "add", "path": "/z", "value": {"k": [1]}},
            {"op": "replace", "path": "/a/r", "value": "0"},
        ],
    )
    assert out == {"a": {"l": [0, 1, 2, 3], "r": "0"}, "z": {"k": [1]}}
    assert doc == {"a": {"b/c": 1, "l": [1, 2], "r": "4"}}
    with pytest.raises(PatchError):
        apply_patch(doc, [{"op": "move", "path": "/a", "from": "/z"}])
    with pytest.raises(PatchError):
        apply_patch(doc, [{"op": "replace", "path": "/a/missing", "value": 1}])


def test_allocation_and_cores_count_bound_pods_only() -> None:
    pods = [_pod("a", 1, 125), _pod("b", 2, 1000), _pod("c", 1, 500)]
    nodes = ["n1", "n2", None]
    assert ds.allocation_pct(pods, nodes, 4000) == pytest.approx(100 * 2125 / 4000)
    # 125 milli asks 13 cores (rounded up, as the replay's 100-unit translation).
    assert ds.cores_pct(pods, nodes, 4) == pytest.approx(100 * 213 / 400)


def _claim(results: list[dict[str, object]]) -> dict[str, object]:
    return {"status": {"allocation": {"devices": {"results": results}}}}


def test_claim_use_sums_consumed_capacity_and_flags_overcommit() -> None:
    r = {"driver": ds.DRIVER, "pool": "n1", "device": "gpu-0"}
    claims = [
        _claim([{**r, "consumedCapacity": {"cores": "60", "memory": "60Gi"}}]),
        _claim([{**r, "consumedCapacity": {"cores": "50", "memory": "50Gi"}}]),
        _claim([{**r, "device": "gpu-1", "consumedCapacity": {"cores": "10", "memory": "10Gi"}}]),
        _claim([{**r, "driver": "other", "consumedCapacity": {"cores": "99"}}]),
        {"status": {}},
    ]
    use = ds.claim_use(claims)
    assert use.cores == Fraction(120) and use.memory_mib == Fraction(120 * 1024)
    assert use.devices_over == 1 and use.claims == 4


def test_percentile_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert ds.percentile(xs, 50) == 50.0
    assert ds.percentile(xs, 99) == 99.0
    assert ds.percentile([3.0], 99) == 3.0
    assert ds.percentile([], 50) != ds.percentile([], 50)  # NaN


def test_table_has_a_column_per_run_and_the_simulator() -> None:
    pods = [_pod("a", 1, 500), _pod("b", 1, 500)]
    f = ds.figures(pods, ["n1", None], ["bound", "unschedulable"], 2000, 2, 2.0, [0.1])
    assert f.pods_per_s == 1.0
    out = ds.table([("DRA seq", f), ("extender seq", None)], 2, ("sim", pods, ["n1", "n1"], 2000))
    lines = out.splitlines()
    assert "DRA seq" in lines[0] and "sim" in lines[0]
    alloc = next(line for line in lines if line.startswith("allocation"))
    assert alloc.split()[-3:] == ["25.00", "-", "50.00"]
    assert "100 / 100" in next(line for line in lines if line.startswith("creation"))


@pytest.mark.parametrize(
    ("sched", "server", "ok"),
    [
        ("v1.35.4", "v1.35.4", True),
        ("v1.34.4", "v1.35.4", True),
        ("v1.35.4", "v1.34.4", False),
        ("v1.33.1", "v1.35.4", False),
    ],
)
def test_skew_policy(sched: str, server: str, ok: bool) -> None:
    assert (dp.skew_problem(sched, server) is None) == ok


def test_issue_133705_only_before_135() -> None:
    assert dp.has_issue_133705("v1.34.4")
    assert not dp.has_issue_133705("v1.35.4")
