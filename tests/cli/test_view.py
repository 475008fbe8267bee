"""L1: what kubectl gpu-share computes from a snapshot: the extender's free space, the
devices' pods and largest free block, the filters, slices by source, and fit through the
extender's own filter and prioritize (its reason texts)."""

from __future__ import annotations

import json

from gpu_share.cli.kubectl_fit import DEFAULT_WORKLOAD, SnapshotView, fit, parse_workload, probe_pod
from gpu_share.cli.kubectl_snapshot import Settings, Snapshot
from gpu_share.cli.kubectl_view import largest_free, node_problems, node_rows, slice_rows
from gpu_share.sharing.annotations import enforcement_key, inventory_key
from gpu_share.sharing.decision import ContainerDecision, Decision, decision_key, sign
from gpu_share.sharing.model import ContainerRequest
from gpu_share.sharing.placement import DeviceSlot
from tests.cli.objects import DOMAIN, KEY, assignment, node_obj, pod_obj

S = Settings()


def snapshot() -> Snapshot:
    nodes = [
        node_obj("gpu-a", [(16, 10, 60, True), (16, 0, 0, True)], pool="t4"),
        node_obj("gpu-b", [(40, 36, 90, True), (40, 0, 0, False)], pool="a100",
                 model="NVIDIA A100-SXM4-40GB"),
        node_obj("cpu-1", None),
    ]
    pods = [
        pod_obj("train-0", "gpu-a", {"main": (6, 30)},
                annotation=assignment("gpu-a", {"main": [(0, 6, 30, False)]})),
        pod_obj("infer-1", "gpu-a", {"main": (4, 30)}, uid="u1", annotation=assignment(
            "gpu-a", {"main": [(0, 4, 30, False)]}, key=KEY, uid="u1")),
        pod_obj("big", "gpu-b", {"main": (36, 90)},
                annotation=assignment("gpu-b", {"main": [(0, 36, 90, False)]})),
        pod_obj("waiting", None, {"main": (8, 50)}),
        pod_obj("done", "gpu-a", {"main": (8, 50)}, phase="Succeeded",
                annotation=assignment("gpu-a", {"main": [(1, 8, 50, False)]})),
        pod_obj("plain", "gpu-a", {}),
    ]
    return Snapshot.from_lists(nodes, pods, S)


def test_largest_free_is_one_healthy_device() -> None:
    devs = [DeviceSlot("a", 0, 16, 4, 100, 90), DeviceSlot("b", 1, 16, 8, 100, 10),
            DeviceSlot("c", 2, 16, 16, 100, 100, healthy=False)]
    assert largest_free(devs) == (8, 10)
    assert largest_free(devs[2:]) is None


def test_node_rows() -> None:
    rows = node_rows(snapshot())
    assert [r.name for r in rows] == ["gpu-a", "gpu-b"]  # no inventory: not a GPU node
    a = rows[0]
    assert a.pool == "t4" and a.pods == ("team-a/infer-1", "team-a/train-0")
    d0, d1 = a.devices
    assert (d0.memory_used, d0.cores_used, d0.pods) == (10, 60, a.pods)
    assert (d1.memory_used, d1.pods) == (0, ())  # the finished pod holds nothing
    assert a.largest_free == (16, 100)
    b = rows[1]
    assert b.largest_free == (4, 10)  # the unhealthy device is no free block


def test_annotations_count_above_a_lagging_inventory() -> None:
    # The inventory says 0 used; the pods' assignments hold 12 units: free is 4.
    snap = Snapshot.from_lists(
        [node_obj("n", [(16, 0, 0, True)])],
        [pod_obj(f"p{i}", "n", {"c": (6, 20)},
                 annotation=assignment("n", {"c": [(0, 6, 20, False)]})) for i in range(2)],
        S,
    )
    (row,) = node_rows(snap)
    assert (row.devices[0].memory_used, row.devices[0].cores_used) == (12, 40)


def test_filters() -> None:
    snap = snapshot()
    bad = node_rows(snap, unhealthy_only=True)
    assert [(r.name, [d.index for d in r.devices]) for r in bad] == [("gpu-b", [1])]
    assert bad[0].pods == ()
    assert [r.name for r in node_rows(snap, names=["gpu-b", "nope"])] == ["gpu-b"]


def test_malformed_inventory_is_reported_not_fatal() -> None:
    obj = node_obj("n", None)
    obj["metadata"]["annotations"] = {inventory_key(DOMAIN): "{not json"}
    snap = Snapshot.from_lists([obj], [], S)
    assert node_rows(snap) == []
    (line,) = node_problems(snap)
    assert line.startswith("node n: inventory annotation is not JSON")


def test_slice_rows_by_source() -> None:
    dec = Decision("u9", "gpu-a", {"main": ContainerDecision(("GPU-gpu-a-1",),
                                                             ContainerRequest(2, 20))}, 1)
    decided = pod_obj("decided", "gpu-a", {"main": (2, 20)}, uid="u9")
    decided["metadata"]["annotations"] = {decision_key(DOMAIN): sign(dec, KEY)}
    snap = Snapshot.from_lists(
        [node_obj("gpu-a", [(16, 10, 60, True), (16, 0, 0, True)])], [*_raw_pods(), decided], S)
    rows = {(r.pod, r.container): r for r in slice_rows(snap)}
    assert set(rows) == {("train-0", "main"), ("infer-1", "main"), ("waiting", "main"),
                         ("decided", "main")}
    t, i = rows[("train-0", "main")], rows[("infer-1", "main")]
    assert (t.index, t.memory_units, t.cores, t.source, t.signed) == (0, 6, 30, "node-agent",
                                                                       False)
    assert i.signed is True and i.unit_mib == 1024
    w = rows[("waiting", "main")]
    assert (w.device, w.source, w.node, w.unit_mib) == ("", "pending", "", None)
    d = rows[("decided", "main")]
    assert (d.index, d.memory_units, d.source) == (1, 2, "extender (decided)")


def _raw_pods() -> list[dict[str, object]]:
    return [
        pod_obj("train-0", "gpu-a", {"main": (6, 30)},
                annotation=assignment("gpu-a", {"main": [(0, 6, 30, False)]})),
        pod_obj("infer-1", "gpu-a", {"main": (4, 30)}, uid="u1", annotation=assignment(
            "gpu-a", {"main": [(0, 4, 30, False)]}, key=KEY, uid="u1")),
        pod_obj("waiting", None, {"main": (8, 50)}),
        pod_obj("plain", "gpu-a", {}),
    ]


def _fit(snap: Snapshot, memory: int, cores: int, **kw: object):  # type: ignore[no-untyped-def]
    view = SnapshotView(snap, parse_workload(DEFAULT_WORKLOAD))
    return fit(view, probe_pod(S, memory, cores, **kw), sorted(snap.nodes))  # type: ignore[arg-type]


def test_fit_uses_the_extenders_filter_and_reasons() -> None:
    res = _fit(snapshot(), 6, 30)
    assert res.error == ""
    assert [(f.node, f.score, f.devices) for f in res.fits] == [
        ("gpu-a", 10, (("main", 0, "GPU-gpu-a-0"),))]  # fgd packs onto the used device
    assert res.failed == {
        "cpu-1": "gpu-share: node has no gpu-share inventory (agent not running?)",
        "gpu-b": "gpu-share: no single device fits (main: 6 memory units/30 cores); largest "
                 "free block is 4 memory units and 10 cores, 0 device(s) wholly free",
    }


def test_fit_ranks_every_fitting_node() -> None:
    snap = Snapshot.from_lists(
        [node_obj("n1", [(16, 0, 0, True)]), node_obj("n2", [(16, 8, 50, True)])], [], S)
    res = _fit(snap, 4, 25)
    assert [f.node for f in res.fits] == ["n2", "n1"] and res.fits[0].score == 10
    assert res.failed == {}


def test_fit_model_host_and_bad_ask() -> None:
    snap = snapshot()
    res = _fit(snap, 4, 10, model="Tesla-T4")
    assert [f.node for f in res.fits] == ["gpu-a"]
    assert res.failed["gpu-b"].startswith(
        "gpu-share: device model 'NVIDIA-A100-SXM4-40GB' is not one the pod accepts")
    # 16 CPUs allocatable, 2 pods of 1 CPU bound to gpu-a (the finished one does not count).
    assert "gpu-a" in {f.node for f in _fit(snap, 1, 10, cpu="14").fits}
    res = _fit(snap, 1, 10, cpu="15")
    assert res.failed["gpu-a"] == "gpu-share: insufficient cpu (14000m free, 15000m requested)"
    assert _fit(snap, 1, 10, cpu="bogus").error
    # Two containers need two devices that fit: gpu-a has them (0: 6 free, 1: 16 free).
    res = _fit(snap, 5, 30, containers=2)
    assert [(f.node, len(f.devices)) for f in res.fits] == [("gpu-a", 2)]


def test_workload_follows_the_pods_seen() -> None:
    view = SnapshotView(snapshot(), parse_workload("1:1"))
    shapes = {(s.memory_units, s.cores, s.weight) for s in view.workload().shapes}
    assert (8, 50) in {(m, c) for m, c, _ in shapes}  # the pending pod counts
    empty = SnapshotView(Snapshot.from_lists([], [], S), parse_workload("1:1"))
    assert [(s.memory_units, s.cores) for s in empty.workload().shapes] == [(1, 1)]


def test_a_thousand_nodes_are_quick() -> None:
    import time

    n = 1000
    nodes = [node_obj(f"n{i:04d}", [(16, (i * 3) % 17, (i * 7) % 101, True)] * 8)
             for i in range(n)]
    pods = [pod_obj(f"p{i}", f"n{i % n:04d}", {"main": (2, 10)}, annotation=assignment(
        f"n{i % n:04d}", {"main": [(i % 8, 2, 10, False)]})) for i in range(10 * n)]
    t0 = time.perf_counter()
    snap = Snapshot.from_lists(nodes, pods, S)
    assert len(node_rows(snap)) == n and len(slice_rows(snap)) == 10 * n
    res = _fit(snap, 6, 30)
    assert len(res.fits) + len(res.failed) == n
    assert time.perf_counter() - t0 < 20  # ~1 s unloaded


def test_a_node_that_cannot_enforce_says_why_in_nodes_and_fit() -> None:
    """The agent holds every device back (cordoned in its inventory) and says why in its
    enforcement annotation: `nodes` reports it, `fit` gives the extender's reason."""
    obj = node_obj("n", [(16, 0, 0, True)])
    obj["metadata"]["annotations"][enforcement_key(DOMAIN)] = json.dumps(
        {"mode": "hami-core", "ready": False,
         "problems": ["library /usr/local/vgpu/libvgpu.so missing (No such file)"]})
    snap = Snapshot.from_lists([obj], [], S)
    (line,) = node_problems(snap)
    assert line == ("node n: enforcement 'hami-core' unavailable: library "
                    "/usr/local/vgpu/libvgpu.so missing (No such file)")
    res = _fit(snap, 4, 30)
    assert not res.fits
    assert "no new slice on this node: enforcement 'hami-core' unavailable" in res.failed["n"]
    # Ready again: nothing to say, the node fits.
    obj["metadata"]["annotations"][enforcement_key(DOMAIN)] = json.dumps(
        {"mode": "hami-core", "ready": True, "problems": []})
    snap = Snapshot.from_lists([obj], [], S)
    assert node_problems(snap) == [] and [f.node for f in _fit(snap, 4, 30).fits] == ["n"]
