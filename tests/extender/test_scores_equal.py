"""Filter and prioritize answer exactly as the per-node path (``evaluate_node`` on every
node, device pick included) on random clusters: grouping nodes by state, skipping the
device pick and reusing filter's scores in prioritize change no answer."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from gpu_share.extender.api import HostPriority
from gpu_share.extender.core import Extender, ExtenderSettings, pod_ask, ranked
from gpu_share.extender.ports import ClusterView
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import (
    ANY_MODEL,
    ClusterPolicy,
    DeviceSlot,
    ModelReq,
    NodeSlots,
    NoFit,
    Placement,
    Shape,
    Workload,
    make_policy,
)
from gpu_share.sharing.placement.pod_models import models_key
from testkit.static_view import StaticView

KEY = b"secret-key-for-tests"
MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
SETTINGS = ExtenderSettings(ResourceNames(MEM, CORE), "vendor.com", KEY)
MODELS = ("Tesla-T4", "NVIDIA-A100-SXM4-80GB", "")
# (devices, memory units per device, model) of the node types
# (same devices, other model: only the model tells those nodes apart)
TYPES = (
    (1, 16, "Tesla-T4"),
    (2, 16, "Tesla-T4"),
    (2, 16, ""),
    (4, 80, MODELS[1]),
    (4, 80, "Tesla-T4"),
    (8, 32, ""),
    (8, 80, MODELS[1]),
)
POLICIES = (
    "fgd",
    "fgd-unpriced",
    "best-fit",
    "packing",
    "spread",
    "random",
    "dotprod",
    "clustering",
)


def _workload(weight: float = 2.0, priced: bool = True) -> Workload:
    # model-bound shapes: fgd prices models by pressure (prices depend on the candidates)
    t4, a100 = (
        (ModelReq.parse("Tesla-T4"), ModelReq.parse(MODELS[1]))
        if priced
        else (ANY_MODEL, ANY_MODEL)
    )
    return Workload(
        [
            Shape(4, 30, weight, 2000, 4096),
            Shape(16, 100, 1.0, models=t4),
            Shape(80, 200, 1.0, 8000, 65536, models=a100),
        ]
    )


class View(StaticView):
    """A copy of ``nodes``, changed by the tests through ``slots``."""

    slots: dict[str, NodeSlots | None]

    def __init__(self, nodes: Mapping[str, NodeSlots | None], priced: bool = True) -> None:
        super().__init__(dict(nodes), _workload(priced=priced))
        self.priced = priced


def _device(rng: random.Random, i: int, mem: int, name: str) -> DeviceSlot:
    used = rng.random() < 0.5
    mf = rng.randint(0, mem) if used else mem
    cf = rng.choice((0, 10, 30, 50, 70, 100)) if used else 100
    return DeviceSlot(f"{name}-{i}", i, mem, mf, 100, cf, healthy=rng.random() > 0.05)


def _template(rng: random.Random, name: str) -> NodeSlots:
    count, mem, model = rng.choice(TYPES)
    devs = tuple(_device(rng, i, mem, name) for i in range(count))
    cpu_total, mem_total = rng.choice(((None, None), (16000, 65536), (96000, 786432)))
    cpu_free = None if cpu_total is None else rng.choice((0, 2000, cpu_total))
    mem_free = None if mem_total is None else rng.choice((1024, mem_total))
    held = frozenset(rng.sample([((4, 30),), ((16, 100),), ((8, 50),)], rng.randint(0, 2)))
    return NodeSlots(name, devs, cpu_free, mem_free, model, cpu_total, mem_total, held)


def _copy(rng: random.Random, t: NodeSlots, name: str) -> NodeSlots:
    """Same state under another name, its devices in another index order."""
    keys = [
        (d.memory_total, d.memory_free, d.cores_total, d.cores_free, d.healthy) for d in t.devices
    ]
    rng.shuffle(keys)
    devs = tuple(DeviceSlot(f"{name}-{i}", i, *k) for i, k in enumerate(keys))
    return replace(t, name=name, devices=devs)


def _variant(rng: random.Random, t: NodeSlots) -> NodeSlots:
    """The same GPU state with one other host value, model or held request."""
    field = rng.choice(
        ("model", "cpu_free", "host_memory_free", "cpu_total", "host_memory_total", "held")
    )
    value: Any = {
        "model": rng.choice(MODELS),
        "cpu_free": rng.choice((None, 0, 1000, 8000)),
        "host_memory_free": rng.choice((None, 512, 65536)),
        "cpu_total": rng.choice((None, 8000, 200000)),
        "host_memory_total": rng.choice((None, 65536, 10**6)),
        "held": frozenset(rng.sample([((4, 30),), ((8, 50),), ((16, 100),)], rng.randint(0, 2))),
    }[field]
    return replace(t, **{field: value})


def cluster(rng: random.Random) -> dict[str, NodeSlots | None]:
    templates = [_template(rng, f"t{i}") for i in range(rng.randint(2, 8))]
    templates += [_variant(rng, t) for t in templates for _ in range(rng.randint(0, 3))]
    out: dict[str, NodeSlots | None] = {}
    for i in range(rng.randint(5, 40)):
        name = f"n{i:02d}"
        out[name] = None if rng.random() < 0.03 else _copy(rng, rng.choice(templates), name)
    return out


def _container(rng: random.Random, i: int) -> dict[str, Any]:
    res: dict[str, Any] = {
        "requests": {
            "cpu": f"{rng.choice((100, 1000, 4000))}m",
            "memory": f"{rng.choice((64, 2048, 40000))}Mi",
        }
    }
    kind = rng.random()
    if kind < 0.3:  # a share of one device, often a shape the nodes hold (clustering)
        m, c = rng.choice(((4, 30), (8, 50)))
        res["limits"] = {MEM: str(m), CORE: str(c)}
    elif kind < 0.6:
        res["limits"] = {MEM: str(rng.randint(1, 20)), CORE: str(rng.choice((10, 30, 50, 90)))}
    elif kind < 0.85:  # whole devices
        k = rng.choice((1, 2, 4))
        res["limits"] = {MEM: str(k * rng.choice((16, 32, 80))), CORE: str(100 * k)}
    return {"name": f"c{i}", "resources": res}


def pod(rng: random.Random, uid: str) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if rng.random() < 0.4:
        ann[models_key("vendor.com")] = rng.choice(("Tesla-T4", MODELS[1], f"Tesla-T4|{MODELS[1]}"))
    containers = [_container(rng, i) for i in range(rng.choice((1, 1, 2, 3)))]
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": ann},
        "spec": {"containers": containers},
    }


def extender(view: View, name: str) -> Extender:
    held: dict[str, tuple[Workload, ClusterPolicy]] = {}

    def factory(v: ClusterView) -> ClusterPolicy:
        w = v.workload()
        got = held.get("p")
        if got is None or got[0] is not w:
            got = held["p"] = (w, make_policy(name, w if name == "fgd" else None))
        return got[1]

    return Extender(SETTINGS, view, None, factory)  # type: ignore[arg-type]


def reference(ext: Extender, p: dict[str, Any], names: list[str]) -> dict[str, Placement | NoFit]:
    """The per-node path: ``evaluate_node`` (and its device pick) on every node."""
    return ext._evaluate(names, pod_ask(p, SETTINGS).demand())


def check_filter(ext: Extender, p: dict[str, Any], names: list[str]) -> list[str]:
    got = ext.filter({"Pod": p, "Nodes": {"items": []}, "NodeNames": names})
    if not pod_ask(p, SETTINGS).uses_ours:
        assert got["FailedNodes"] == {} and got["NodeNames"] == names
        return names
    ref = reference(ext, p, names)
    want = {n: f"gpu-share: {r.reason}" for n, r in ref.items() if isinstance(r, NoFit)}
    assert got["FailedNodes"] == want
    assert got["NodeNames"] == [n for n in names if n not in want]
    return list(got["NodeNames"] or [])


def check_prioritize(ext: Extender, p: dict[str, Any], names: list[str]) -> None:
    got = ext.prioritize({"Pod": p, "Nodes": {"items": []}, "NodeNames": names})
    if not pod_ask(p, SETTINGS).uses_ours:
        assert got == [{"Host": n, "Score": 0} for n in names]
        return
    ref = reference(ext, p, names)
    want: list[HostPriority] = ranked(
        names, {n: r.score for n, r in ref.items() if isinstance(r, Placement)}
    )
    assert got == want
    # and the scores themselves, not only their order
    raw = ext._scores(names, pod_ask(p, SETTINGS).demand())
    assert raw == {n: r.score if isinstance(r, Placement) else r for n, r in ref.items()}


def _change(rng: random.Random, view: View) -> None:
    """A view change: a node's devices, host or existence (a new NodeSlots object)."""
    name = rng.choice(sorted(view.slots))
    n = view.slots[name]
    if n is None or rng.random() < 0.1:
        view.slots[name] = None if n is not None else _template(rng, name)
        return
    devs = list(n.devices)
    if devs:
        i = rng.randrange(len(devs))
        devs[i] = _device(rng, devs[i].index, devs[i].memory_total, name)
    view.slots[name] = replace(n, devices=tuple(devs), cpu_free=rng.choice((None, 0, 8000)))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(20))
def test_filter_and_prioritize_answer_as_per_node_evaluation(policy: str, seed: int) -> None:
    rng = random.Random(f"{policy}-{seed}")
    view = View(cluster(rng), priced=policy == "fgd")
    ext = extender(view, policy.removesuffix("-unpriced"))
    pods = [pod(rng, f"u{i}") for i in range(6)]
    # the same asks under other uids: they may share the first ones' scores
    pods += [{**p, "metadata": {**p["metadata"], "uid": f"again-{i}"}} for i, p in enumerate(pods)]
    for _ in range(25):
        p = rng.choice(pods)
        names = sorted(view.slots)
        if rng.random() < 0.2:
            names = rng.sample(names, rng.randint(1, len(names)))
        passed = check_filter(ext, p, names)
        # kube-scheduler's own filters may drop more before prioritize
        subset = [n for n in passed if rng.random() < 0.8]
        check_prioritize(ext, p, subset)
        if rng.random() < 0.5:
            _change(rng, view)
            check_prioritize(ext, p, subset)  # after a change: re-scored where it matters
        if rng.random() < 0.1:
            view.load = _workload(rng.choice((0.5, 2.0, 8.0)), view.priced)  # a new policy
        if rng.random() < 0.1:
            check_prioritize(ext, p, passed)  # a prioritize without a filter before it


def test_prices_over_other_candidates_are_not_reused() -> None:
    """fgd's model prices depend on the candidate set: prioritize over fewer nodes than
    filter saw must not reuse filter's scores."""
    t4 = NodeSlots("t4", (DeviceSlot("a", 0, 16, 16, 100, 100),), model="Tesla-T4")
    a100 = NodeSlots("a100", (DeviceSlot("b", 0, 80, 80, 100, 100),), model=MODELS[1])
    view = View({"t4": t4, "a100": a100, "t4b": replace(t4, name="t4b")})
    ext = extender(view, "fgd")
    p = {
        "metadata": {"uid": "u"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {MEM: "4", CORE: "30"}}}]},
    }
    check_filter(ext, p, ["a100", "t4", "t4b"])
    check_prioritize(ext, p, ["a100", "t4"])
    check_prioritize(ext, p, ["t4"])


def _host_variants(rng: random.Random, templates: list[NodeSlots], count: int) -> View:
    """Many nodes over few GPU states, told apart by host free (often too little for
    the pod), model and held requests only: the per-state plans are shared."""
    nodes: dict[str, NodeSlots | None] = {}
    for i in range(count):
        t = _copy(rng, rng.choice(templates), f"h{i:03d}")
        cpu_total = t.cpu_total or 16000
        nodes[t.name] = replace(
            t,
            cpu_free=rng.choice((None, 0, 50, 1000, rng.randint(0, cpu_total))),
            host_memory_free=rng.choice((None, 32, 4096, rng.randint(0, 10**6))),
            cpu_total=cpu_total,
            model=rng.choice(MODELS) if rng.random() < 0.3 else t.model,
            held=frozenset(rng.sample([((4, 30),), ((8, 50),)], rng.randint(0, 2))),
        )
    return View(nodes)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_nodes_sharing_a_gpu_state_and_cold_shapes_after_a_new_workload(
    policy: str, seed: int
) -> None:
    rng = random.Random(f"shared-{policy}-{seed}")
    view = _host_variants(rng, [_template(rng, f"t{i}") for i in range(3)], 120)
    view.priced = policy == "fgd"
    view.load = _workload(priced=view.priced)
    ext = extender(view, policy.removesuffix("-unpriced"))
    pods = [pod(rng, f"s{i}") for i in range(8)]
    names = sorted(view.slots)
    for round_ in range(3):
        for p in pods:  # every shape cold at first, then warm; then a new policy
            passed = check_filter(ext, p, names)
            check_prioritize(ext, p, passed)
        if round_ == 1:
            view.load = _workload(rng.choice((0.5, 8.0)), view.priced)
            for n in rng.sample(names, 10):  # and some nodes' host values change
                node = view.slots[n]
                assert node is not None
                view.slots[n] = replace(node, cpu_free=rng.choice((None, 0, 3000)))
