"""L2: the whole node agent (dummy backend) behind real gRPC servers on unix sockets,
driven by a kubelet-side stub, with a fake PodResources server and in-memory pod specs.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from gpu_share.agent.node_agent import NodeAgent
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend, write_faults
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.podresources import PodResourcesClient
from gpu_share.sharing.annotations import PodAssignment
from gpu_share.sharing.ids import parse_unit_id
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    PodView,
)
from tests.support.kubelet_stub import (
    FakePodResources,
    KubeletStub,
    PluginClient,
    fast_plugin_settings,
)

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"


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
    pods: dict[tuple[str, str], dict[str, str | None]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None]) -> None:
        self.node.update(annotations)

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
    clients: dict[str, PluginClient] = field(default_factory=dict)
    # What the simulated kubelet has allocated: (ns, pod, container) -> resource -> ids
    held: dict[tuple[str, str, str], dict[str, list[str]]] = field(default_factory=dict)

    def start_agent(self) -> None:
        backend = DummyBackend(self.cfg.dummy, self.cfg.node_name, check_interval_s=0.05)
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
            view = self.pods.pods.get((ns, pod))
            names = [c.name for c in view.containers] if view else []
            for name in names:
                devs = self.held.get((ns, pod, name), {})
                conts.append(PodResourcesContainer(name, {k: tuple(v) for k, v in devs.items()}))
        self.pr.set_pods(
            PodResourcesView(
                tuple(PodResourcesPod(ns, pod, tuple(c)) for (ns, pod), c in pods.items())
            )
        )

    def admit(self, view: PodView, rng: random.Random) -> dict[str, dict[str, list[str]]]:
        """What the kubelet does for one pod: containers in order, resources in random
        order, GetPreferredAllocation then Allocate, then record the devices."""
        self.pods.pods[(view.namespace, view.name)] = view
        self.publish_pr()
        envs: dict[str, dict[str, list[str]]] = {}
        for c in view.containers:
            wanted = [(MEM, c.request.memory_units), (CORE, c.request.cores)]
            wanted = [(r, n) for r, n in wanted if n > 0]
            rng.shuffle(wanted)
            for resource, n in wanted:
                client = self.clients[resource]
                ids = client.preferred_allocation(self.free_ids(resource), [], n)
                assert len(ids) == n
                resp = client.allocate(ids)
                envs.setdefault(c.name, {})[resource] = sorted(resp.envs.items())
                self.held.setdefault((view.namespace, view.name, c.name), {})[resource] = ids
                self.publish_pr()
        return envs


def _pod(name: str, *containers: tuple[str, int, int], uid: str | None = None) -> PodView:
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


@pytest.fixture
def rig() -> Iterator[Rig]:
    d = Path(tempfile.mkdtemp(prefix="gsa-", dir="/tmp"))  # short: unix socket paths
    (d / "dp").mkdir()
    cfg = AgentConfig.model_validate(
        {
            "version": "v1",
            "nodeName": "node-a",
            "backend": "dummy",
            "stateDir": str(d / "state"),
            "dummy": {"deviceCount": 2, "memoryMiB": 8192, "faultFile": str(d / "faults.json")},
            "kubelet": {"devicePluginDir": str(d / "dp"), "podResourcesSocket": str(d / "pr.sock")},
            "health": {"pollIntervalSeconds": 0.05},
        }
    )
    kubelet = KubeletStub(d / "dp").start()
    pr = FakePodResources(d / "pr.sock").start()
    r = Rig(d, cfg, kubelet, pr, FakePods(), RecordingPublisher())
    try:
        r.start_agent()
        yield r
    finally:
        r.stop_agent()
        pr.stop()
        kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)


def _device_of(ids: list[str]) -> set[str]:
    return {parse_unit_id(i).device for i in ids}


def test_registers_both_resources_and_lists_units(rig: Rig) -> None:
    assert rig.kubelet.wait_for_registrations(2, timeout_s=5)
    names = sorted(r.resource_name for r in rig.kubelet.registrations)
    assert names == [CORE, MEM]
    assert all(r.options.get_preferred_allocation_available for r in rig.kubelet.registrations)
    assert len(rig.all_ids(MEM)) == 2 * 8  # 2 devices x 8 GiB at 1 GiB units
    assert len(rig.all_ids(CORE)) == 2 * 100


@pytest.mark.parametrize("seed", range(6))
def test_memory_and_cores_of_each_container_land_on_one_device(rig: Rig, seed: int) -> None:
    rng = random.Random(seed)
    pods = [
        _pod("a", ("main", 4, 30)),
        _pod("b", ("main", 3, 50), ("side", 1, 20)),
        _pod("c", ("main", 4, 0)),
        _pod("d", ("main", 0, 40)),
        _pod("e", ("main", 2, 10)),
    ]
    for view in pods:
        envs = rig.admit(view, rng)
        for c in view.containers:
            held = rig.held[(view.namespace, view.name, c.name)]
            devices = set().union(*(_device_of(ids) for ids in held.values()))
            assert len(devices) == 1, (view.name, c.name, held)
            # Both resources' responses describe the same slice.
            answers = list(envs[c.name].values())
            assert all(a == answers[0] for a in answers)
            assert ("DUMMY_VISIBLE_DEVICES", devices.pop()) in answers[0]
    # Nothing over-committed (ids are units; no id handed out twice).
    for resource in (MEM, CORE):
        ids = [i for r in rig.held.values() for i in r.get(resource, [])]
        assert len(ids) == len(set(ids))
    assert rig.agent is not None and rig.agent.flush(5)
    doc = PodAssignment.decode(
        rig.publisher.pods[("default", "b")]["gpu-share.vendor.com/assignment"]
    )
    assert set(doc.containers) == {"main", "side"}


def test_no_single_device_fits_fails_with_a_clear_message(rig: Rig) -> None:
    rng = random.Random(1)
    rig.admit(_pod("a", ("main", 5, 0)), rng)
    rig.admit(_pod("b", ("main", 5, 0)), rng)  # 3 + 3 units left on two devices
    view = _pod("c", ("main", 6, 0))
    rig.pods.pods[("default", "c")] = view
    rig.publish_pr()
    with pytest.raises(grpc.RpcError) as err:
        rig.clients[MEM].preferred_allocation(rig.free_ids(MEM), [], 6)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no single device has 6 free memory units" in (err.value.details() or "")
    assert rig.agent is not None and rig.agent.flush(5)
    assert any(r == "NoFit" and who == "default/c" for who, r, _ in rig.publisher.events)


def test_fault_file_marks_units_unhealthy_and_recovers(rig: Rig) -> None:
    devices = sorted(_device_of(rig.all_ids(MEM)))
    write_faults(rig.cfg.dummy.fault_file, [devices[0]])
    latest = rig.clients[MEM].wait_for_list(lambda ds: any(not d.healthy for d in ds), timeout_s=5)
    bad = {parse_unit_id(d.id).device for d in latest if not d.healthy}
    assert bad == {devices[0]}
    write_faults(rig.cfg.dummy.fault_file, [])
    rig.clients[MEM].wait_for_list(lambda ds: all(d.healthy for d in ds), timeout_s=5)


def test_agent_restart_keeps_slices_and_never_gives_one_twice(rig: Rig) -> None:
    rng = random.Random(7)
    rig.admit(_pod("a", ("main", 6, 60)), rng)
    first = _device_of(rig.held[("default", "a", "main")][MEM])
    rig.stop_agent()
    rig.start_agent()  # same state dir: ledger reloaded, reconciled with PodResources
    # A pod that only fits on an empty device must not be put next to "a".
    rig.admit(_pod("b", ("main", 4, 60)), rng)
    second = _device_of(rig.held[("default", "b", "main")][MEM])
    assert first.isdisjoint(second)
    assert _device_of(rig.held[("default", "b", "main")][CORE]) == second
