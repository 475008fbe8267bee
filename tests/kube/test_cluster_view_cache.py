"""The cluster view's per-node cache (``KubeClusterView.node``): after random sequences of
node and pod events, relists, binds (reservations) and clock steps, every node reads
exactly as in a view built afresh from the objects the view has seen."""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.ports import ClusterView
from gpu_share.kube.cluster_view import PENDING_TTL_S, KubeClusterView
from gpu_share.sharing.annotations import InventoryAnnotation, InventoryDevice, inventory_key
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import ClusterPolicy, Shape, Workload, make_policy
from testkit.kube_admin import idle_api

KEY = b"secret-key-for-tests"
MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
NODES = [f"n{i}" for i in range(6)]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def new_view(clock: Callable[[], float] = time.monotonic) -> KubeClusterView:
    """The view of node/pod events applied by hand (``_apply``): its API is never called."""
    return KubeClusterView(
        idle_api(),  # never called: events are applied by hand
        domain="vendor.com",
        memory_resource=MEM,
        core_resource=CORE,
        default_workload=Workload([Shape(4, 30, 1.0)]),
        decision_key=KEY,
        clock=clock,
    )


def knode(rng: random.Random, name: str) -> dict[str, Any]:
    mem = rng.choice((16, 32))
    devs = tuple(
        InventoryDevice(
            f"{name}-g{i}",
            i,
            "Tesla T4",
            mem,
            rng.choice((0, 0, 4)),
            100,
            rng.choice((0, 0, 30)),
            rng.random() > 0.1,
            0,
        )
        for i in range(rng.randint(1, 3))
    )
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {},
            "annotations": {
                inventory_key("vendor.com"): InventoryAnnotation(name, 1024, devs).encode()
            },
        },
    }
    if rng.random() < 0.8:
        obj["status"] = {"allocatable": {"cpu": str(rng.choice((8, 16))), "memory": "32Gi"}}
    return obj


def kpod(rng: random.Random, uid: str) -> dict[str, Any]:
    res: dict[str, Any] = {"requests": {"cpu": f"{rng.choice((100, 500, 2000))}m", "memory": "1Gi"}}
    if rng.random() < 0.8:
        res["limits"] = {MEM: str(rng.choice((2, 4, 8))), CORE: str(rng.choice((10, 30, 50)))}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": res}]}
    if "limits" not in res and rng.random() < 0.7:
        spec["nodeName"] = rng.choice(NODES)  # a plain pod, bound by someone else
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {}},
        "spec": spec,
    }


class World:
    """The API server's objects, what the view has seen of them, and the view."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = Clock()
        self.view = new_view(self.clock)
        self.nodes: dict[str, dict[str, Any]] = {}  # server
        self.pods: dict[str, dict[str, Any]] = {}
        self.seen_nodes: dict[str, dict[str, Any]] = {}  # as the view's watch delivered
        self.seen_pods: dict[str, dict[str, Any]] = {}
        self.queued: list[str] = []  # pods changed on the server, event not yet delivered

        def policy(v: ClusterView) -> ClusterPolicy:
            return make_policy("fgd", v.workload())

        self.ext = Extender(
            ExtenderSettings(ResourceNames(MEM, CORE), "vendor.com", KEY),
            self.view,
            self,
            policy,
            clock=lambda: 1_700_000_000.0,
        )

    # -- the extender's binder: the server changes, the watch event comes later
    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        p = self.pods[uid]
        p["metadata"]["annotations"].update(annotations)
        p["spec"]["nodeName"] = node
        self.queued.append(uid)

    def node_event(self, name: str, etype: str) -> None:
        if etype == "DELETED":
            obj = self.nodes.pop(name)
            self.seen_nodes.pop(name, None)
        else:
            obj = self.nodes[name] = knode(self.rng, name)
            self.seen_nodes[name] = copy.deepcopy(obj)
        self.view._apply("nodes", etype, copy.deepcopy(obj))

    def pod_event(self, uid: str, etype: str) -> None:
        obj = copy.deepcopy(self.pods[uid])
        if etype == "DELETED":
            del self.pods[uid]
            self.seen_pods.pop(uid, None)
        else:
            self.seen_pods[uid] = copy.deepcopy(obj)
        self.view._apply("pods", etype, obj)

    def step(self) -> None:
        rng = self.rng
        op = rng.random()
        if op < 0.15:
            name = rng.choice(NODES)
            self.node_event(name, "MODIFIED" if name in self.nodes else "ADDED")
        elif op < 0.2 and self.nodes:
            self.node_event(rng.choice(sorted(self.nodes)), "DELETED")
        elif op < 0.4:
            uid = f"u{rng.randrange(10**6)}"
            self.pods[uid] = kpod(rng, uid)
            self.pod_event(uid, "ADDED")
        elif op < 0.6:
            pending = [u for u, p in self.pods.items() if not p["spec"].get("nodeName")]
            if pending and self.nodes:
                uid = rng.choice(pending)
                node = rng.choice(sorted(self.nodes))
                self.ext.filter(
                    {"Pod": self.pods[uid], "Nodes": {"items": []}, "NodeNames": [node]}
                )
                self.ext.bind({"PodName": uid, "PodNamespace": "ns", "PodUID": uid, "Node": node})
        elif op < 0.75 and self.queued:
            uid = self.queued.pop(rng.randrange(len(self.queued)))
            if uid in self.pods:
                self.pod_event(uid, "MODIFIED")
        elif op < 0.78 and self.pods:
            # A pod seen on another node than before (kube never moves a pod, but the
            # view must not depend on that: e.g. a reserved pod bound elsewhere).
            uid = rng.choice(sorted(self.pods))
            self.pods[uid]["spec"]["nodeName"] = rng.choice(NODES)
            self.pod_event(uid, "MODIFIED")
        elif op < 0.84 and self.pods:
            uid = rng.choice(sorted(self.pods))
            if rng.random() < 0.5:
                self.pods[uid]["status"] = {"phase": "Succeeded"}
                self.pod_event(uid, "MODIFIED")
            else:
                self.pod_event(uid, "DELETED")
        elif op < 0.87:
            self.seen_pods = copy.deepcopy(self.pods)  # a relist sees the server as it is
            self.queued.clear()
            self.view._replace("pods", copy.deepcopy(list(self.pods.values())))
        elif op < 0.9:
            self.seen_nodes = copy.deepcopy(self.nodes)
            self.view._replace("nodes", copy.deepcopy(list(self.nodes.values())))
        else:
            self.clock.t += rng.choice((1.0, 30.0, PENDING_TTL_S + 1))

    def fresh(self) -> KubeClusterView:
        """A view built from the objects this one has seen, with its reservations."""
        v = new_view(self.clock)
        v._replace("nodes", copy.deepcopy(list(self.seen_nodes.values())))
        v._replace("pods", copy.deepcopy(list(self.seen_pods.values())))
        for uid, by_node in self.view._pending.items():
            for entry in by_node.values():
                v._set_pending(uid, entry)
        return v


@pytest.mark.parametrize("seed", range(30))
def test_cached_nodes_equal_a_fresh_view(seed: int) -> None:
    world = World(random.Random(seed))
    for _ in range(120):
        world.step()
        names = [*NODES, "absent"]
        for n in names:  # fill the cache, as every filter does
            world.view.node(n)
        fresh = world.fresh()
        for n in names:
            assert world.view.node(n) == fresh.node(n), (seed, n)
        # one call for many nodes (what filter and prioritize use) reads the same
        assert world.view.nodes(names) == fresh.nodes(list(reversed(names))), seed
