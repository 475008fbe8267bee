"""The real kube-scheduler with the extender places trace pods like the simulator.

~100 openb GPU nodes are registered as Node objects (inventory annotation, extended
resources in status); an extender (in this process) and a second kube-scheduler (the
cached binary of the local cluster, its own schedulerName) place the trace's GPU pods one at a time.
The simulator runs the same nodes and pods with the same policy; allocation must agree
within 0.5 pp. Host resources count on both sides: the nodes report the trace's CPU and
memory as allocatable and the pods request the trace's CPU and memory (kube-scheduler
filters on them, the extender's fgd scores them, as the replay does). GPU-free pods are
left out: the extender does not rank them, so kube-scheduler's choice is arbitrary.

Needs the local cluster (hack/local-up-cluster.sh up); cleans up its nodes and pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.replay import trace
from gpu_share.sharing.annotations import inventory_key
from gpu_share.sharing.placement import ClusterIndex, Shape, TieBreak, Workload, make_policy
from testkit.harness import wait_until
from testkit.scheduler import extender_and_scheduler, inventory_annotation, live_space, node_status

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
UNITS = 100
N_NODES = 100
KEY = b"real-scheduler-test-key-0123456789"


def test_real_scheduler_matches_simulator(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    space = live_space(request, "real-scheduler test", "replay")
    core, tag, ns, sched_name = space.core, space.tag, space.ns, space.sched_name
    prefix = f"gsr{tag}-"

    all_nodes = trace.load_nodes(units=UNITS)
    nodes = all_nodes[:: max(1, len(all_nodes) // N_NODES)][:N_NODES]
    capacity = sum(len(n.devices) for n in nodes) * trace.GPU_MILLI
    pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    order = [p for p in trace.arrival_order(pods, 42, capacity) if p.gpu_request > 0]
    arrived, chosen = 0, []
    for p in order:  # up to 100 % of these nodes' capacity
        if arrived + p.gpu_request > capacity:
            break
        arrived += p.gpu_request
        chosen.append(p)
    workload = Workload(
        Shape(c.memory_units, c.cores, 1.0, p.cpu_milli, p.memory_mib)
        for p in pods
        for c in p.demand(UNITS).containers
    )

    # Simulator, same nodes (renamed alike: the prefix keeps name order) and pods.
    sim_nodes = [
        type(n)(
            prefix + n.name,
            tuple(
                type(d)(
                    f"{prefix}{d.uuid}",
                    d.index,
                    d.memory_total,
                    d.memory_free,
                    d.cores_total,
                    d.cores_free,
                )
                for d in n.devices
            ),
            cpu_free=n.cpu_free,
            host_memory_free=n.host_memory_free,
            model=n.model,
        )
        for n in nodes
    ]
    index = ClusterIndex(make_policy("fgd", workload), sim_nodes, TieBreak.DETERMINISTIC)
    sim_choice: list[str | None] = []
    for p in chosen:
        got = index.place(p.demand(UNITS))
        sim_choice.append(None if got is None else got.node)

    created_nodes: list[str] = []
    try:
        core.create_namespace({"metadata": {"name": ns}})
        for n in sim_nodes:
            core.create_node(
                {
                    "metadata": {
                        "name": n.name,
                        "labels": {"gs-replay": tag},
                        "annotations": {
                            inventory_key("vendor.com"): inventory_annotation(n, UNITS)
                        },
                    }
                }
            )
            created_nodes.append(n.name)
            core.patch_node_status(n.name, {"status": node_status(n, UNITS)})

        with extender_and_scheduler(
            space.kubeconfig, space.sched_bin, tmp_path, sched_name, workload, KEY
        ) as sched:
            real_choice: list[str | None] = []
            for i, p in enumerate(chosen):
                d = p.demand(UNITS).containers[0]
                name = f"p{i:04d}"
                core.create_namespaced_pod(
                    ns,
                    {
                        "metadata": {"name": name},
                        "spec": {
                            "schedulerName": sched_name,
                            "nodeSelector": {"gs-replay": tag},
                            "tolerations": [{"operator": "Exists"}],
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.k8s.io/pause:3.10",
                                    "resources": {
                                        "requests": {
                                            "cpu": f"{p.cpu_milli}m",
                                            "memory": f"{p.memory_mib}Mi",
                                        },
                                        "limits": {MEM: str(d.memory_units), CORE: str(d.cores)},
                                    },
                                }
                            ],
                        },
                    },
                )
                real_choice.append(_wait_placed(core, ns, name, timeout=30.0))
                assert sched.poll() is None, (tmp_path / "sched.log").read_text()[-3000:]

        def alloc(choice: list[str | None]) -> float:
            return (
                100
                * sum(p.gpu_request for p, c in zip(chosen, choice, strict=True) if c)
                / capacity
            )

        same = sum(a == b for a, b in zip(sim_choice, real_choice, strict=True))
        print(
            f"pods {len(chosen)}: same node {same}; allocation sim {alloc(sim_choice):.2f} %"
            f" real {alloc(real_choice):.2f} %"
        )
        assert abs(alloc(sim_choice) - alloc(real_choice)) <= 0.5
    finally:
        space.remove_unrun(created_nodes)


def _wait_placed(core: Any, ns: str, name: str, timeout: float) -> str | None:
    """The node the pod was bound to, or None once the scheduler calls it unschedulable."""

    def placed() -> tuple[str | None] | None:
        pod = core.read_namespaced_pod(name, ns)
        if pod.spec.node_name:
            return (str(pod.spec.node_name),)
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return (None,)
        return None

    return wait_until(f"pod {ns}/{name} bound or unschedulable", placed, timeout, 0.05)[0]
