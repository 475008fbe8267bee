"""A gpu-share extender (in this process) and a second real kube-scheduler calling it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.http import make_server
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import Workload, make_policy

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
) -> Iterator[subprocess.Popen[bytes]]:
    """Yields the scheduler process; its log is ``workdir/sched.log``. The extender's
    view and binder get their own ``kube.rest`` client from ``kubeconfig``."""
    from gpu_share.kube.binder import KubeBinder
    from gpu_share.kube.cluster_view import KubeClusterView
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
        ext = Extender(
            ExtenderSettings(ResourceNames(MEM, CORE), "vendor.com", key),
            view,
            KubeBinder(rest),
            lambda v: make_policy("fgd", workload),
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
        sched = subprocess.Popen(
            [str(sched_bin), f"--config={workdir / 'sched.yaml'}", "--secure-port=0", "--v=1"],
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
