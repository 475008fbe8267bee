"""Shared setup of the L2 agent tests (dummy backend, everything in a scratch dir under
/tmp): the agent's config, the kubelet-call rig (the whole agent behind real gRPC
servers on unix sockets, a kubelet-side stub, a fake PodResources and in-memory pod
specs), the served agent of the ids/offers and gRPC-fuzz tests, and the agent as a real
process."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_share.agent.node_agent import NodeAgent
from gpu_share.config.model import AgentConfig
from gpu_share.devices.base import DeviceBackend
from gpu_share.devices.dummy import DummyBackend
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.podresources import PodResourcesClient
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    PodView,
)
from testkit.host_agent import agent_argv
from testkit.kubelet_stub import (
    FakePodResources,
    KubeletStub,
    PluginClient,
    fast_plugin_settings,
    socket_dir,
)

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"


@contextlib.contextmanager
def scratch_dir(prefix: str = "gsa-") -> Iterator[Path]:
    """A fresh dir under /tmp (short: unix socket paths) with an empty ``dp`` (the
    kubelet's device-plugin dir), removed afterwards."""
    with socket_dir(prefix) as d:
        (d / "dp").mkdir()
        yield d


def hami_core_install(d: Path) -> dict[str, str]:
    """``runtime.hamiCore`` of a node where the library is installed as the chart does
    (library, its checksum beside it, the preload file naming it; agent/enforcement.py
    checks them). The library here is any shared object of this machine: these tests
    load nothing."""
    import _ctypes  # an ELF shared object for this machine

    lib = d / "vgpu" / "libvgpu.so"
    lib.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(str(_ctypes.__file__), lib)
    digest = hashlib.sha256(lib.read_bytes()).hexdigest()
    (d / "vgpu" / "libvgpu.so.sha256").write_text(f"{digest}  libvgpu.so\n")
    (d / "vgpu" / "ld.so.preload").write_text(f"{lib}\n")
    return {"libraryPath": str(lib), "preloadPath": str(d / "vgpu" / "ld.so.preload"),
            "cacheDir": str(d / "cache")}


def agent_config(
    d: Path,
    *,
    devices: int = 2,
    memory_mib: int = 8192,
    poll_s: float | None = 0.05,
    **sections: Any,
) -> AgentConfig:
    """The dummy-backend agent of node-a, its files under ``d``; ``poll_s`` None leaves
    the health poll at its default. ``sections`` set top-level keys (camelCase); a
    callable value is called with ``d``."""
    raw: dict[str, Any] = {
        "version": "v1",
        "nodeName": "node-a",
        "backend": "dummy",
        "stateDir": str(d / "state"),
        "dummy": {"deviceCount": devices, "memoryMiB": memory_mib,
                  "faultFile": str(d / "faults.json")},
        "kubelet": {"devicePluginDir": str(d / "dp"), "podResourcesSocket": str(d / "pr.sock")},
    }
    if poll_s is not None:
        raw["health"] = {"pollIntervalSeconds": poll_s}
    for key, value in sections.items():
        raw[key] = value(d) if callable(value) else value
    return AgentConfig.model_validate(raw)


class FakePods:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], PodView] = {}

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        return self.pods.get((namespace, name))

    def list_node_pods(self, node_name: str) -> list[PodView]:
        return list(self.pods.values())


@dataclass
class RecordingPublisher:
    node: dict[str, str | None] = field(default_factory=dict)
    labels: dict[str, str | None] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, str | None]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None],
                      labels: Mapping[str, str | None] | None = None) -> None:
        self.node.update(annotations)
        self.labels.update(labels or {})

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        self.pods.setdefault((namespace, name), {}).update(annotations)

    def pod_event(
        self, namespace: str, name: str, *, reason: str, message: str, warning: bool
    ) -> None:
        self.events.append((f"{namespace}/{name}", reason, message))

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None:
        self.events.append((node_name, reason, message))


@dataclass
class Rig:
    dir: Path
    cfg: AgentConfig
    kubelet: KubeletStub
    pr: FakePodResources
    pods: FakePods
    publisher: RecordingPublisher
    agent: NodeAgent | None = None
    manager: PluginManager | None = None
    # None: the dummy backend of ``cfg``; else the backend to serve (hack/gpu-delivery.py
    # serves the NVML backend of a real GPU).
    backend_factory: Callable[[AgentConfig], DeviceBackend] | None = None
    clients: dict[str, PluginClient] = field(default_factory=dict)
    # What the simulated kubelet has allocated: (ns, pod, container) -> resource -> ids
    held: dict[tuple[str, str, str], dict[str, list[str]]] = field(default_factory=dict)

    def start_agent(self) -> None:
        backend: DeviceBackend
        if self.backend_factory is None:
            backend = DummyBackend(self.cfg.dummy, self.cfg.node_name, check_interval_s=0.05)
        else:
            backend = self.backend_factory(self.cfg)
        backend.start()
        client = PodResourcesClient(
            str(self.dir / "pr.sock"), timeout_s=1.0, resource_names=[MEM, CORE]
        )
        self.agent = NodeAgent(
            self.cfg, backend, pod_resources=client, pods=self.pods, publisher=self.publisher
        )
        self.agent.start()
        self.manager = PluginManager(self.agent.handlers(), self.dir / "dp", fast_plugin_settings())
        self.manager.start()
        self.clients = {
            h.resource_name: self.kubelet.plugin(h.endpoint).watch() for h in self.agent.handlers()
        }

    def stop_agent(self) -> None:
        for c in self.clients.values():
            c.close()
        if self.manager is not None:
            self.manager.stop()
        if self.agent is not None:
            self.agent.stop()

    def all_ids(self, resource: str) -> list[str]:
        latest = self.clients[resource].wait_for_list(lambda ds: len(ds) > 0)
        return [d.id for d in latest if d.healthy]

    def free_ids(self, resource: str) -> list[str]:
        taken = {i for r in self.held.values() for i in r.get(resource, [])}
        return [i for i in self.all_ids(resource) if i not in taken]

    def publish_pr(self) -> None:
        pods: dict[tuple[str, str], list[PodResourcesContainer]] = {}
        for ns, pod, _c in self.held:
            pods.setdefault((ns, pod), [])
        for view in self.pods.pods.values():
            pods.setdefault((view.namespace, view.name), [])
        for (ns, pod), conts in pods.items():
            found = self.pods.pods.get((ns, pod))
            names = [c.name for c in found.containers] if found else []
            for name in names:
                devs = self.held.get((ns, pod, name), {})
                conts.append(PodResourcesContainer(name, {k: tuple(v) for k, v in devs.items()}))
        self.pr.set_pods(
            PodResourcesView(
                tuple(PodResourcesPod(ns, pod, tuple(c)) for (ns, pod), c in pods.items())
            )
        )

    def admit(
        self, view: PodView, rng: random.Random
    ) -> dict[str, dict[str, list[tuple[str, str]]]]:
        """What the kubelet does for one pod: containers in order, resources in random
        order, GetPreferredAllocation then Allocate, then record the devices."""
        self.pods.pods[(view.namespace, view.name)] = view
        self.publish_pr()
        envs: dict[str, dict[str, list[tuple[str, str]]]] = {}
        for c in view.containers:
            wanted = [(MEM, c.request.memory_units), (CORE, c.request.cores)]
            wanted = [(r, n) for r, n in wanted if n > 0]
            rng.shuffle(wanted)
            for resource, n in wanted:
                client = self.clients[resource]
                ids = client.preferred_allocation(self.free_ids(resource), [], n)
                assert len(ids) == n
                resp = client.allocate(ids)
                envs.setdefault(c.name, {})[resource] = sorted(
                    (str(k), str(v)) for k, v in resp.envs.items()
                )
                self.held.setdefault((view.namespace, view.name, c.name), {})[resource] = ids
                self.publish_pr()
        return envs


def pod_view(name: str, *containers: tuple[str, int, int], uid: str | None = None) -> PodView:
    return PodView(
        uid=uid or f"uid-{name}",
        namespace="default",
        name=name,
        node_name="node-a",
        containers=tuple(
            ContainerView(n, ContainerKind.APP, ContainerRequest(m, c)) for n, m, c in containers
        ),
        phase="Pending",
    )


@contextlib.contextmanager
def running_rig(
    make_cfg: Callable[[Path], AgentConfig] = agent_config,
    backend_factory: Callable[[AgentConfig], DeviceBackend] | None = None,
) -> Iterator[Rig]:
    """A started ``Rig`` on a fresh dir, its config ``make_cfg(dir)``."""
    with scratch_dir() as d:
        cfg = make_cfg(d)
        kubelet = KubeletStub(d / "dp").start()
        pr = FakePodResources(d / "pr.sock").start()
        r = Rig(d, cfg, kubelet, pr, FakePods(), RecordingPublisher(),
                backend_factory=backend_factory)
        try:
            r.start_agent()
            yield r
        finally:
            r.stop_agent()
            pr.stop()
            kubelet.stop()


def rig_with(
    sections: Mapping[str, Any],
    backend_factory: Callable[[AgentConfig], DeviceBackend] | None = None,
) -> contextlib.AbstractContextManager[Rig]:
    """``running_rig`` with config ``sections`` (see ``agent_config``) set."""
    return running_rig(lambda d: agent_config(d, **sections), backend_factory)


def spawn_agent(
    d: Path, *extra: str, env_extra: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """``gpu-share-plugin`` as a process on ``d``: no API server, nothing published,
    metrics on an ephemeral port unless ``extra`` says otherwise; output merged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SHARE_", "KUBE"))}
    env.update(
        {
            "GPU_SHARE_IDENTITY__USE_API_SERVER": "false",
            "GPU_SHARE_PUBLISH__NODE_ANNOTATION": "false",
            "GPU_SHARE_PUBLISH__POD_ANNOTATION": "false",
            "GPU_SHARE_PUBLISH__EVENTS": "false",
            "GPU_SHARE_DUMMY__FAULT_FILE": str(d / "faults.json"),
        }
    )
    env.update(env_extra or {})  # last: a test may turn the API server back on
    return subprocess.Popen(
        [
            *agent_argv("n1", str(d / "dp"), str(d / "pr.sock"), str(d / "state"), 0),
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def kill_if_running(*procs: subprocess.Popen[str]) -> None:
    """Test teardown: kill what a failed assertion left running."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


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
    """The whole agent behind its gRPC servers with a kubelet-side stub, a fake
    PodResources (``podresources`` False: unreachable) and a clock the test may move."""
    with scratch_dir("gsf-") as d:
        cfg = agent_config(d, devices=devices, memory_mib=memory_mib,
                           identity={"useApiServer": False})
        kubelet = KubeletStub(d / "dp").start()
        pr = FakePodResources(d / "pr.sock").start() if podresources else None
        clock = FakeClock()
        backend = DummyBackend(cfg.dummy, cfg.node_name, check_interval_s=0.05)
        backend.start()
        client = PodResourcesClient(str(d / "pr.sock"), timeout_s=1.0,
                                    resource_names=[MEM, CORE])
        agent = NodeAgent(cfg, backend, pod_resources=client, pods=None, publisher=None,
                          clock=clock)
        manager: PluginManager | None = None
        try:
            agent.start()
            manager = PluginManager(agent.handlers(), d / "dp", fast_plugin_settings())
            manager.start()
            clients = {
                h.resource_name: kubelet.plugin(h.endpoint).watch() for h in agent.handlers()
            }
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
