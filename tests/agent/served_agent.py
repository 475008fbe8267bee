"""A whole node agent (dummy backend) behind its real gRPC servers on unix sockets, with
a kubelet-side stub, a fake PodResources (optional: absent = unreachable) and a clock the
test may move. Shared by the L2 tests of ids, offers and the gRPC fuzz."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpu_share.agent.node_agent import NodeAgent
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.podresources import PodResourcesClient
from tests.support.kubelet_stub import (
    FakePodResources,
    KubeletStub,
    PluginClient,
    fast_plugin_settings,
)

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"


@dataclass
class FakeClock:
    t: float = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Served:
    dir: Path
    agent: NodeAgent
    clients: dict[str, PluginClient]
    clock: FakeClock
    pr: FakePodResources | None
    ids: dict[str, list[str]] = field(default_factory=dict)  # advertised, per resource


@contextlib.contextmanager
def served_agent(
    *, podresources: bool = True, devices: int = 2, memory_mib: int = 8192
) -> Iterator[Served]:
    d = Path(tempfile.mkdtemp(prefix="gsf-", dir="/tmp"))  # short: unix socket paths
    (d / "dp").mkdir()
    cfg = AgentConfig.model_validate(
        {
            "version": "v1",
            "nodeName": "node-a",
            "backend": "dummy",
            "stateDir": str(d / "state"),
            "dummy": {"deviceCount": devices, "memoryMiB": memory_mib,
                      "faultFile": str(d / "faults.json")},
            "kubelet": {"devicePluginDir": str(d / "dp"), "podResourcesSocket": str(d / "pr.sock")},
            "identity": {"useApiServer": False},
            "health": {"pollIntervalSeconds": 0.05},
        }
    )
    kubelet = KubeletStub(d / "dp").start()
    pr = FakePodResources(d / "pr.sock").start() if podresources else None
    clock = FakeClock()
    backend = DummyBackend(cfg.dummy, cfg.node_name, check_interval_s=0.05)
    backend.start()
    client = PodResourcesClient(str(d / "pr.sock"), timeout_s=1.0, resource_names=[MEM, CORE])
    agent = NodeAgent(cfg, backend, pod_resources=client, pods=None, publisher=None,
                      clock=clock)
    manager: PluginManager | None = None
    try:
        agent.start()
        manager = PluginManager(agent.handlers(), d / "dp", fast_plugin_settings())
        manager.start()
        clients = {h.resource_name: kubelet.plugin(h.endpoint).watch() for h in agent.handlers()}
        s = Served(d, agent, clients, clock, pr)
        for name, c in clients.items():
            s.ids[name] = [x.id for x in c.wait_for_list(lambda ds: len(ds) > 0)]
        yield s
    finally:
        if manager is not None:
            manager.stop()
        agent.stop()
        client.close()
        if pr is not None:
            pr.stop()
        kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)
