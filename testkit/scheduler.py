"""A gpu-share extender (in this process) and a second real kube-scheduler calling it;
the Node objects (no kubelet) it places pods on, and the namespace of a test's pods."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.http import make_server
from gpu_share.sharing.annotations import InventoryAnnotation, InventoryDevice
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import NodeSlots, Workload, make_policy
from testkit.harness import live_cluster

if TYPE_CHECKING:
    import pytest

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"


def extender_entry(port: int, mem: str = MEM, core: str = CORE) -> dict[str, Any]:
    """The scheduler's extender entry as the chart configures it (nodeCacheCapable,
    filter + prioritize + bind, not ignorable), for an extender on 127.0.0.1:``port``."""
    return {
        "urlPrefix": f"http://127.0.0.1:{port}",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 1,
        "nodeCacheCapable": True,
        "httpTimeout": "30s",
        "ignorable": False,
        "managedResources": [
            {"name": mem, "ignoredByScheduler": False},
            {"name": core, "ignoredByScheduler": False},
        ],
    }


def inventory_annotation(n: NodeSlots, units: int, unit_mib: int = 1024) -> str:
    """The agent's inventory annotation of ``n``: each device healthy and free, ``units``
    memory units and cores."""
    return InventoryAnnotation(
        n.name,
        unit_mib,
        tuple(
            InventoryDevice(d.uuid, d.index, n.model, units, 0, units, 0, True, 0)
            for d in n.devices
        ),
    ).encode()


def node_status(n: NodeSlots, units: int) -> dict[str, Any]:
    """Capacity = allocatable = the node's CPU and memory, plus the vcuda sums."""
    gpu = str(len(n.devices) * units)
    cap = {
        "cpu": f"{n.cpu_free}m",
        "memory": f"{n.host_memory_free}Mi",
        "pods": "1000",
        MEM: gpu,
        CORE: gpu,
    }
    return {"capacity": cap, "allocatable": cap}


@dataclass
class LiveSpace:
    """What a test on the local cluster with its own scheduler names: its namespace and
    scheduler (``gs-<kind>-<tag>``, ``gpu-share-<kind>-<tag>``), an admin CoreV1Api."""

    env: Mapping[str, str]
    core: Any
    tag: str
    ns: str
    sched_name: str

    @property
    def kubeconfig(self) -> str:
        return self.env["KUBECONFIG"]

    @property
    def sched_bin(self) -> Path:
        return Path(self.env["K8S_BIN_DIR"]) / "kube-scheduler"

    def remove_unrun(self, nodes: Sequence[str]) -> None:
        """Best effort: the pods no kubelet runs (only a zero grace period removes them
        at once), the namespace, then ``nodes``."""
        with contextlib.suppress(Exception):
            self.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)
        with contextlib.suppress(Exception):
            self.core.delete_namespace(self.ns, grace_period_seconds=0)
        for n in nodes:
            with contextlib.suppress(Exception):
                self.core.delete_node(n)


def live_space(request: pytest.FixtureRequest, what: str, kind: str) -> LiveSpace:
    """The local cluster (skips without it: ``live_cluster``) and fresh names."""
    from kubernetes import client as k8s  # the test may import it; the package may not

    from testkit.kube_admin import admin_client

    env = live_cluster(request, what)
    core = k8s.CoreV1Api(admin_client(env["KUBECONFIG"]))
    tag = uuid.uuid4().hex[:6]
    return LiveSpace(env, core, tag, f"gs-{kind}-{tag}", f"gpu-share-{kind}-{tag}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def extender_and_scheduler(
    kubeconfig: str,
    sched_bin: Path,
    workdir: Path,
    sched_name: str,
    workload: Workload,
    key: bytes,
    dra_driver: str = "",
) -> Iterator[subprocess.Popen[bytes]]:
    """Yields the scheduler process; its log is ``workdir/sched.log``. The extender's
    view and binder get their own ``kube.rest`` client from ``kubeconfig``.
    ``dra_driver``: DRA pods too (the scheduler's DRAConsumableCapacity on; the
    extender reads that driver's claims at bind)."""
    from gpu_share.kube.binder import KubeBinder
    from gpu_share.kube.cluster_view import KubeClusterView
    from gpu_share.kube.resourceclaims import KubeClaimReader
    from gpu_share.kube.rest import make_rest_client

    rest = make_rest_client(kubeconfig)
    view = KubeClusterView(
        rest, domain="vendor.com", memory_resource=MEM, core_resource=CORE,
        default_workload=workload, decision_key=key,
    )
    server = None
    sched = None
    try:
        view.start()
        assert view.wait_synced(30)
        settings = ExtenderSettings(ResourceNames(MEM, CORE), "vendor.com", key,
                                    dra_driver=dra_driver or "gpu-share.vendor.com")
        ext = Extender(
            settings,
            view,
            KubeBinder(rest),
            lambda v: make_policy("fgd", workload),
            claims=KubeClaimReader(rest) if dra_driver else None,
        )
        port = free_port()
        server = make_server(ext, "127.0.0.1", port)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        cfg = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "leaderElection": {"leaderElect": False},
            "percentageOfNodesToScore": 100,
            "profiles": [
                {"schedulerName": sched_name, "plugins": {"score": {"disabled": [{"name": "*"}]}}}
            ],
            "extenders": [extender_entry(port)],
        }
        (workdir / "sched.yaml").write_text(yaml.safe_dump(cfg))
        log = (workdir / "sched.log").open("w")
        gates = ["--feature-gates=DRAConsumableCapacity=true"] if dra_driver else []
        sched = subprocess.Popen(
            [str(sched_bin), f"--config={workdir / 'sched.yaml'}", "--secure-port=0", "--v=1",
             *gates],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": kubeconfig},
        )
        yield sched
    finally:
        if sched is not None:
            sched.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sched.wait(timeout=10)
        if server is not None:
            server.shutdown()
        view.stop()
