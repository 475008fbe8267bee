"""Micro-benchmark of the REAL agent without a kubelet.

NodeAgent + PluginManager on the dummy backend (8 devices x 80 GiB, 256 MiB units by
default) behind their real unix-socket gRPC servers, a kubelet stand-in
(testkit/kubelet_stub) that registers them and calls GetPreferredAllocation then
Allocate per (container, resource) as the kubelet does -- the available list it passes
is every healthy id no active pod holds, so the agent releases a deleted pod's units as
the kubelet would make it -- and a fake PodResources server
(testkit/kubelet_stub.FakePodResources) listing the pods and what they hold.

Phases: sequential (one pod at a time, like the kubelet) and C concurrent callers (each
admitting its own pods; each caller's pods ask a distinct size so identity stays
unambiguous). Each call's latency includes the agent's PodResources round trip and its
ledger journal append. Prints p50/p99 per call, and the ListAndWatch message size.

``--agent-process`` runs the agent in its own process (as deployed: the kubelet is
another process), pod specs handed over as files; by default everything shares one
Python process, so the callers' own gRPC work competes with the agent for one GIL.

The simulated kubelet keeps its free lists true: its GetPreferredAllocation calls of one
resource take turns (outside the measured time), as the kubelet's device manager
serializes its bookkeeping; Allocates and the other resource's calls run concurrently.
``--stale-lists`` lets all calls fly at once (the harness of the first runs): a caller's
list may then name units another caller is just being given, and the agent, trusting
the kubelet, releases that pod or refuses the call (counted as failures).

    python -m bench.agent.micro [--pods 250] [--concurrency 8] [--agent-process] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.agent.stats import percentile
from gpu_share.agent.node_agent import NodeAgent
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.podresources import PodResourcesClient
from gpu_share.plugin.sizeguard import listandwatch_message_size
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    PodView,
)
from testkit.kubelet_stub import (
    FakePodResources,
    KubeletStub,
    PluginClient,
    fast_plugin_settings,
)

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"
NODE = "bench-node"


def agent_config(root: Path, devices: int, memory_mib: int, unit_mib: int) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "version": "v1",
            "nodeName": NODE,
            "backend": "dummy",
            "memoryUnitMiB": unit_mib,
            "stateDir": str(root / "state"),
            "dummy": {
                "deviceCount": devices,
                "memoryMiB": memory_mib,
                "faultFile": str(root / "faults.json"),
            },
            "kubelet": {
                "devicePluginDir": str(root / "dp"),
                "podResourcesSocket": str(root / "pr.sock"),
            },
            "logging": {"level": "warning"},
        }
    )


def listandwatch_sizes(devices: int, memory_mib: int, unit_mib: int) -> dict[str, int]:
    """Bytes of each resource's ListAndWatch answer for this device shape."""
    root = Path(tempfile.mkdtemp(prefix="gsm-", dir="/tmp"))
    try:
        cfg = agent_config(root, devices, memory_mib, unit_mib)
        backend = DummyBackend(cfg.dummy, NODE)
        backend.start()
        agent = NodeAgent(cfg, backend, pod_resources=None, pods=None, publisher=None)
        agent.start()
        try:
            return {
                h.resource_name: listandwatch_message_size(h.list_devices())
                for h in agent.handlers()
            }
        finally:
            agent.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


class MemoryPods:
    """PodSource over an in-memory dict (the API server's pod specs)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pods: dict[tuple[str, str], PodView] = {}

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        with self.lock:
            return self.pods.get((namespace, name))

    def list_node_pods(self, node_name: str) -> list[PodView]:
        with self.lock:
            return list(self.pods.values())


class FilePods:
    """PodSource of an agent in its own process: one pickled PodView per file, written
    by the simulated kubelet (the stand-in for the API server's watch cache)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, namespace: str, name: str) -> Path:
        return self.root / f"{namespace}_{name}.pickle"

    def put(self, view: PodView) -> None:
        tmp = self._path(view.namespace, view.name).with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(view))
        os.replace(tmp, self._path(view.namespace, view.name))

    def drop(self, namespace: str, name: str) -> None:
        self._path(namespace, name).unlink(missing_ok=True)

    def get_pod(self, namespace: str, name: str) -> PodView | None:
        try:
            view = pickle.loads(self._path(namespace, name).read_bytes())
        except FileNotFoundError:
            return None
        assert isinstance(view, PodView)
        return view

    def list_node_pods(self, node_name: str) -> list[PodView]:
        return [v for p in sorted(self.root.glob("*.pickle"))
                if (v := self.get_pod(*p.stem.split("_", 1))) is not None]


@dataclass
class Kubelet:
    """What the simulated kubelet knows: admitted pods and the ids each holds."""

    pr: FakePodResources
    specs: MemoryPods
    clients: dict[str, PluginClient]
    files: FilePods | None = None  # the agent runs in its own process
    stale_lists: bool = False  # no kubelet-side turn: lists may miss units in flight
    lock: threading.Lock = field(default_factory=threading.Lock)
    held: dict[tuple[str, str], dict[str, list[str]]] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    admission: dict[str, threading.Lock] = field(
        default_factory=lambda: {MEM: threading.Lock(), CORE: threading.Lock()}
    )

    def _publish(self) -> None:  # caller holds self.lock
        pods = tuple(
            PodResourcesPod(
                "bench",
                name,
                (PodResourcesContainer("main", {
                    k: tuple(v) for k, v in devs.items() if not k.endswith(" offered")
                }),),
            )
            for (_ns, name), devs in self.held.items()
        )
        self.pr.set_pods(PodResourcesView(pods))

    def free_ids(self, resource: str) -> list[str]:
        latest = self.clients[resource].latest or []
        with self.lock:
            taken = {
                i for d in self.held.values()
                for r in (resource, f"{resource} offered") for i in d.get(r, [])
            }
        return [d.id for d in latest if d.healthy and d.id not in taken]

    def admit(self, name: str, memory_units: int, cores: int, created: float) -> None:
        view = PodView(
            uid=f"uid-{name}",
            namespace="bench",
            name=name,
            node_name=NODE,
            containers=(
                ContainerView("main", ContainerKind.APP, ContainerRequest(memory_units, cores)),
            ),
            created_at=created,
        )
        with self.specs.lock:
            self.specs.pods[("bench", name)] = view
        if self.files is not None:
            self.files.put(view)
        with self.lock:
            self.held[("bench", name)] = {}
            self._publish()
        for resource, n in ((MEM, memory_units), (CORE, cores)):
            if n <= 0:
                continue
            client = self.clients[resource]
            try:
                # The kubelet's device bookkeeping is serialized (one mutex): its free
                # list never misses ids it is handing to another container. Only the
                # time inside the plugin's calls is measured.
                turn = contextlib.nullcontext() if self.stale_lists else self.admission[resource]
                with turn:
                    free = self.free_ids(resource)
                    t0 = time.perf_counter()
                    ids = client.preferred_allocation(free, [], n)
                    t1 = time.perf_counter()
                    with self.lock:
                        self.held[("bench", name)][f"{resource} offered"] = list(ids)
                t1b = time.perf_counter()
                client.allocate(ids)
                t2 = time.perf_counter()
            except Exception as exc:  # a benchmark counts failures
                detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
                self.errors.append(f"{name} {resource}: {detail}")
                self.delete(name)  # admission failed: the pod is not active
                return
            with self.lock:
                self.samples.setdefault(f"GetPreferredAllocation {resource}", []).append(t1 - t0)
                self.samples.setdefault(f"Allocate {resource}", []).append(t2 - t1b)
                self.held[("bench", name)].pop(f"{resource} offered", None)
                self.held[("bench", name)][resource] = list(ids)
                self._publish()

    def delete(self, name: str) -> None:
        with self.lock:
            self.held.pop(("bench", name), None)
            self._publish()
        with self.specs.lock:
            self.specs.pods.pop(("bench", name), None)
        if self.files is not None:
            self.files.drop("bench", name)


def serve_agent(root: Path, devices: int, memory_mib: int, unit_mib: int) -> int:
    """The agent's process of ``--agent-process``: serve until stdin closes."""
    cfg = agent_config(root, devices, memory_mib, unit_mib)
    backend = DummyBackend(cfg.dummy, NODE)
    backend.start()
    pr_client = PodResourcesClient(str(root / "pr.sock"), timeout_s=2.0, resource_names=[MEM, CORE])
    agent = NodeAgent(cfg, backend, pod_resources=pr_client, pods=FilePods(root / "specs"),
                      publisher=None)
    agent.start()
    manager = PluginManager(agent.handlers(), root / "dp", fast_plugin_settings())
    manager.start()
    try:
        sys.stdin.read()
    finally:
        manager.stop()
        agent.stop()
        pr_client.close()
    return 0


def run(
    pods: int = 250,
    concurrency: int = 8,
    devices: int = 8,
    memory_mib: int = 81920,
    unit_mib: int = 256,
    resident: int = 40,
    agent_process: bool = False,
    stale_lists: bool = False,
) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="gsm-", dir="/tmp"))
    (root / "dp").mkdir()
    (root / "specs").mkdir()
    cfg = agent_config(root, devices, memory_mib, unit_mib)
    kubelet_stub = KubeletStub(root / "dp").start()
    fake_pr = FakePodResources(root / "pr.sock").start()
    specs = MemoryPods()
    backend = DummyBackend(cfg.dummy, NODE)
    backend.start()
    pr_client = PodResourcesClient(str(root / "pr.sock"), timeout_s=2.0, resource_names=[MEM, CORE])
    agent = NodeAgent(cfg, backend, pod_resources=pr_client, pods=specs, publisher=None)
    manager: PluginManager | None = None
    kubelet: Kubelet | None = None
    proc: subprocess.Popen[str] | None = None
    result: dict[str, object] = {}
    try:
        if agent_process:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.agent.micro", "--serve-agent", str(root),
                 "--devices", str(devices), "--memory-mib", str(memory_mib),
                 "--unit-mib", str(unit_mib)],
                stdin=subprocess.PIPE, text=True,
            )
            kubelet_stub.wait_for_registrations(2, timeout_s=60)
            endpoints = [h.endpoint for h in agent.handlers()]
            names = [h.resource_name for h in agent.handlers()]
        else:
            agent.start()
            manager = PluginManager(agent.handlers(), root / "dp", fast_plugin_settings())
            manager.start()
            endpoints = [h.endpoint for h in agent.handlers()]
            names = [h.resource_name for h in agent.handlers()]
        clients = {
            name: kubelet_stub.plugin(ep).watch() for name, ep in zip(names, endpoints, strict=True)
        }
        for c in clients.values():
            c.wait_for_list(lambda ds: len(ds) > 0, timeout_s=30)
        kubelet = Kubelet(fake_pr, specs, clients,
                          FilePods(root / "specs") if agent_process else None, stale_lists)
        # Plausible background: pods already running and holding units.
        for i in range(resident):
            kubelet.admit(f"resident-{i}", 4 + i % 8, 10 + 5 * (i % 3) if i % 4 else 0, float(i))
        kubelet.samples.clear()
        tables: dict[str, dict[str, list[float]]] = {}

        # Sequential: one pod at a time; keep at most `window` bench pods alive.
        window = 20
        for i in range(pods):
            kubelet.admit(f"seq-{i}", 4, 10, 1000.0 + i)
            if i >= window:
                kubelet.delete(f"seq-{i - window}")
        for i in range(max(0, pods - window), pods):
            kubelet.delete(f"seq-{i}")
        tables["sequential"] = kubelet.samples
        kubelet.samples = {}

        # Concurrent: each caller admits its own pods (distinct sizes), keeps 2 alive.
        per = max(1, pods // concurrency)
        barrier = threading.Barrier(concurrency)

        def caller(w: int) -> None:
            barrier.wait(30)
            for i in range(per):
                assert kubelet is not None
                kubelet.admit(f"c{w}-{i}", 1 + w, 1 + w, 1e6 + w * 1e4 + i)
                if i >= 2:
                    kubelet.delete(f"c{w}-{i - 2}")

        threads = [
            threading.Thread(target=caller, args=(w,), daemon=True) for w in range(concurrency)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        tables[f"{concurrency} concurrent callers"] = kubelet.samples
        result = {
            "shape": f"{devices} x {memory_mib // 1024} GiB at {unit_mib} MiB units",
            "agent": "own process" if agent_process else "same process as the callers",
            "free_lists": "may be stale (no kubelet-side turn)" if stale_lists
            else "true (GetPreferredAllocation of one resource takes turns in the kubelet)",
            "latency_s": {
                phase: {
                    label: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "n": len(v)}
                    for label, v in sorted(samples.items())
                }
                for phase, samples in tables.items()
            },
            "errors": kubelet.errors[:20],
            "error_count": len(kubelet.errors),
        }
    finally:
        if kubelet is not None:
            for c in kubelet.clients.values():
                c.close()
        if manager is not None:
            manager.stop()
        if proc is not None:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)
        agent.stop()
        pr_client.close()
        fake_pr.stop()
        kubelet_stub.stop()
        shutil.rmtree(root, ignore_errors=True)
    result["listandwatch_bytes"] = {
        f"{unit} MiB units": listandwatch_sizes(devices, memory_mib, unit)
        for unit in sorted({unit_mib, 1024})
    }
    return result


def render(result: dict[str, object]) -> str:
    lines = [f"micro-benchmark (real agent, no kubelet): {result.get('shape')};"
             f" agent in {result.get('agent')}; free lists {result.get('free_lists')}"]
    latency = result.get("latency_s")
    assert isinstance(latency, dict)
    lines.append(f"{'phase':<22} {'call':<48} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}")
    for phase, calls in latency.items():
        for label, f in calls.items():
            lines.append(
                f"{phase:<22} {label:<48} {f['n']:>5} {f['p50'] * 1e3:8.2f} {f['p99'] * 1e3:8.2f}"
            )
    errors = result.get("errors") or []
    assert isinstance(errors, list)
    lines.append(
        f"failed calls: {result.get('error_count')} (concurrent phase: see docs/performance.md)"
    )
    lines += [f"  e.g. {e[:160]}" for e in errors[:3]]
    sizes = result.get("listandwatch_bytes")
    assert isinstance(sizes, dict)
    for unit, per_resource in sizes.items():
        text = ", ".join(f"{r} {b / 1024:.1f} KiB" for r, b in per_resource.items())
        lines.append(f"ListAndWatch message at {unit}: {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=250)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--agent-process", action="store_true")
    parser.add_argument("--stale-lists", action="store_true",
                        help="8 callers' GetPreferredAllocation calls all in flight at once;"
                        " a free list may then miss units another caller is being given")
    parser.add_argument("--serve-agent", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--memory-mib", type=int, default=81920)
    parser.add_argument("--unit-mib", type=int, default=256)
    ns = parser.parse_args(argv)
    if ns.serve_agent is not None:
        return serve_agent(ns.serve_agent, ns.devices, ns.memory_mib, ns.unit_mib)
    result = run(ns.pods, ns.concurrency, ns.devices, ns.memory_mib, ns.unit_mib,
                 agent_process=ns.agent_process, stale_lists=ns.stale_lists)
    print(render(result))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
