"""L4: the gpu-share agent (host process, dummy backend) driven by the REAL kubelet.

The kubelet calls GetPreferredAllocation/Allocate once per (container, resource) in its
own order; these tests check what matters to a user: each container's memory and cores
end up on one device, as the container itself sees it, and no device is over-committed —
also across an agent restart. (The chart-based stories live in tests/e2e.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.harness import wait_until
from testkit.host_agent import HostAgent
from tests.cluster.cluster_support import Cluster

pytestmark = pytest.mark.cluster

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"
ASSIGNMENT = "gpu-share.vendor.com/assignment"
DEVICES = 3
UNITS = 8  # 8 GiB per dummy device at 1 GiB units


class Agent(HostAgent):
    """The host agent, started only once the kubelet's node status shows its devices."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        super().__init__(cluster.env, workdir, devices=DEVICES, units=UNITS, metrics_port=19471)
        self.cluster = cluster

    def start(self, timeout_s: float = 60) -> None:
        t0 = time.monotonic()
        # Registered first (node status may still show the previous agent's devices),
        # then the kubelet's view.
        super().start(timeout_s)

        def shown() -> bool:
            alloc = self.cluster.get("node", self.cluster.node)["status"].get("allocatable", {})
            if alloc.get(MEM) == str(DEVICES * UNITS) and alloc.get(CORE) == str(DEVICES * 100):
                return True
            assert self.proc is not None and self.proc.poll() is None, self.log()
            return False

        left = max(0.0, timeout_s - (time.monotonic() - t0))
        if not wait_until("our resources in allocatable", shown, left, 0.5, fail=False):
            raise AssertionError(f"allocatable never showed our resources:\n{self.log()}")


@pytest.fixture
def agent(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    a = Agent(cluster, tmp_path_factory.mktemp("agent"))
    a.start()
    try:
        yield a
    finally:
        a.stop()


def _container(name: str, mem: int, cores: int, cmd: str) -> dict:
    limits = {}
    if mem:
        limits[MEM] = str(mem)
    if cores:
        limits[CORE] = str(cores)
    return {
        "name": name,
        "image": "localhost/busybox:local",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", cmd],
        "resources": {"limits": limits},
    }


SHOW = 'echo "$DUMMY_VISIBLE_DEVICES"; sleep 600'


def _pod(ns: str, name: str, containers: list[dict], init: list[dict] | None = None) -> dict:
    spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": containers,
    }
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def _wait_settled(cluster: Cluster, ns: str, names: list[str], timeout: float = 180) -> dict:
    """Every pod Running or Failed (admission refused); returns name -> pod."""
    pods: dict[str, dict] = {}

    def settled() -> dict[str, dict] | None:
        nonlocal pods
        pods = {p["metadata"]["name"]: p for p in cluster.get("pods", "-n", ns)["items"]}
        phases = {n: pods.get(n, {}).get("status", {}).get("phase") for n in names}
        ready = all(
            ph == "Failed"
            or (ph == "Running" and ASSIGNMENT in pods[n]["metadata"].get("annotations", {}))
            for n, ph in phases.items()
        )
        return pods if ready else None

    if wait_until("pods settled", settled, timeout, fail=False) is None:
        raise AssertionError(
            f"pods did not settle: { {n: p['status'].get('phase') for n, p in pods.items()} }"
        )
    return pods


def _check_slices(cluster: Cluster, ns: str, pods: dict) -> dict[str, list[int]]:
    """One device per container; per-device totals within capacity; the container sees
    exactly its device. Returns device -> [memory units used, cores used]."""
    used: dict[str, list[int]] = {}
    for name, pod in pods.items():
        if pod["status"]["phase"] != "Running":
            continue
        doc = json.loads(pod["metadata"]["annotations"][ASSIGNMENT])
        init_names = {c["name"] for c in pod["spec"].get("initContainers", [])}
        for cname, c in doc["containers"].items():
            devices = [d["id"] for d in c["devices"]]
            spec = next(
                x
                for x in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
                if x["name"] == cname
            )
            cores = int(spec["resources"]["limits"].get(CORE, "0"))
            assert len(devices) == max(1, cores // 100), (name, cname, c)
            if cname in init_names:
                continue  # its slice is reused by the app containers (kubelet semantics)
            for d in c["devices"]:
                u = used.setdefault(d["id"], [0, 0])
                u[0] += d["memoryUnits"]
                u[1] += d["cores"]
            if cores <= 100 and not cname.startswith("quiet"):
                seen = cluster.kubectl("-n", ns, "logs", name, "-c", cname).stdout.split()
                assert seen[:1] == devices, (name, cname, seen, devices)
    for dev, (mem, cores) in used.items():
        assert mem <= UNITS and cores <= 100, (dev, mem, cores)
    return used


def test_kubelet_calls_pair_memory_and_cores_on_one_device(
    cluster: Cluster, ns: str, agent: Agent
) -> None:
    pods = [
        _pod(ns, "both-a", [_container("main", 2, 30, SHOW)]),
        _pod(ns, "both-b", [_container("main", 3, 40, SHOW)]),
        _pod(ns, "mem-only", [_container("main", 2, 0, SHOW)]),
        _pod(ns, "cores-only", [_container("main", 0, 20, SHOW)]),
        _pod(
            ns,
            "two-containers",
            [_container("a", 1, 10, SHOW), _container("b", 2, 20, SHOW)],
        ),
        _pod(
            ns,
            "with-init",
            [_container("main", 2, 20, SHOW)],
            init=[_container("quiet-init", 2, 20, "true")],
        ),
        _pod(ns, "whole-device", [_container("main", 0, 100, SHOW)]),
        _pod(ns, "too-big", [_container("main", UNITS + 1, 10, SHOW)]),
    ]
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": pods})
    names = [p["metadata"]["name"] for p in pods]
    settled = _wait_settled(cluster, ns, names)
    failed = {n for n, p in settled.items() if p["status"]["phase"] == "Failed"}
    assert failed == {"too-big"}, {n: settled[n]["status"] for n in failed}
    used = _check_slices(cluster, ns, settled)
    # The whole-device container holds a device nobody else shares.
    whole = json.loads(settled["whole-device"]["metadata"]["annotations"][ASSIGNMENT])
    dev = whole["containers"]["main"]["devices"][0]["id"]
    assert used[dev] == [0, 100]
    events = cluster.kubectl("-n", ns, "get", "events", "-o", "json").stdout
    assert "no single device" in events or "UnexpectedAdmissionError" in events


def test_agent_restart_keeps_slices_and_new_pods_never_overlap(
    cluster: Cluster, ns: str, agent: Agent
) -> None:
    first = [_pod(ns, f"keep-{i}", [_container("main", 3, 30, SHOW)]) for i in range(3)]
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": first})
    before = _wait_settled(cluster, ns, [p["metadata"]["name"] for p in first])
    _check_slices(cluster, ns, before)
    agent.stop()
    agent.start()  # same state dir; reconciles with PodResources and the API server
    more = [_pod(ns, f"new-{i}", [_container("main", 3, 30, SHOW)]) for i in range(3)]
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": more})
    after = _wait_settled(cluster, ns, [p["metadata"]["name"] for p in first + more])
    assert all(p["status"]["phase"] == "Running" for p in after.values())
    # Slices of the running pods did not move, and nothing is over-committed.
    for name, pod in before.items():
        assert (
            after[name]["metadata"]["annotations"][ASSIGNMENT]
            == pod["metadata"]["annotations"][ASSIGNMENT]
        )
    _check_slices(cluster, ns, after)
