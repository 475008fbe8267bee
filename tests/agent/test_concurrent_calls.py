"""Kubelet calls from many threads at once on a real agent (real gRPC, real sockets).

The agent fetches facts without its lock and decides under it: whatever the interleaving,
no unit may be handed to two live containers, and the ledger must hold exactly what the
Allocate answers said. The simulated kubelet keeps its free lists true (a list never
misses a unit already allocated when the call lands), as the kubelet's device manager
does: either its GetPreferredAllocation calls of one resource take turns (Allocates and
everything else run concurrently), or all GetPreferredAllocation calls run at once and
each Allocate waits for the calls in flight (the agent must not offer two callers the
same units).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpu_share.config.model import AgentConfig
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    PodView,
    ResourceKind,
)
from tests.agent.served_agent import CORE, MEM, Rig, agent_config, running_rig

CALLERS = 8
PODS_PER_CALLER = 40
ALIVE = 2  # pods each caller keeps running


class _Shared:
    """A readers-writer lock: many holders of ``shared``, or one of ``exclusive``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self._readers == 0)
            yield


@dataclass
class Sim:
    rig: Rig
    parallel_gpa: bool
    rw: _Shared = field(default_factory=_Shared)
    lock: threading.Lock = field(default_factory=threading.Lock)
    admission: dict[str, threading.Lock] = field(
        default_factory=lambda: {MEM: threading.Lock(), CORE: threading.Lock()}
    )
    offered: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # unit -> live pod answered it
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def free_ids(self, resource: str) -> list[str]:
        with self.lock:
            taken = {i for r in self.rig.held.values() for i in r.get(resource, [])}
            taken |= {i for (_p, r), ids in self.offered.items() if r == resource for i in ids}
        return [i for i in self.rig.all_ids(resource) if i not in taken]

    def admit(self, name: str, memory: int, cores: int) -> None:
        view = PodView(
            uid=f"uid-{name}", namespace="default", name=name, node_name="node-a",
            containers=(ContainerView("main", ContainerKind.APP, ContainerRequest(memory, cores)),),
            phase="Pending", created_at=time.time(),
        )
        with self.lock:
            self.rig.pods.pods[("default", name)] = view
            self.rig.publish_pr()
        for resource, n in ((MEM, memory), (CORE, cores)):
            client = self.rig.clients[resource]
            turn = self.rw.shared() if self.parallel_gpa else self.admission[resource]
            with turn:
                ids = client.preferred_allocation(self.free_ids(resource), [], n)
                with self.lock:
                    self.offered[(name, resource)] = ids
            done = self.rw.exclusive() if self.parallel_gpa else contextlib.nullcontext()
            with done:
                client.allocate(ids)
                self._record(name, resource, ids)

    def _record(self, name: str, resource: str, ids: list[str]) -> None:
        with self.lock:
            for i in ids:
                if self.owner.get(i, name) != name:
                    self.violations.append(f"{i} answered to {name} and {self.owner[i]}")
                self.owner[i] = name
            del self.offered[(name, resource)]
            self.rig.held.setdefault(("default", name, "main"), {})[resource] = ids
            self.rig.publish_pr()

    def delete(self, name: str) -> None:
        with self.lock:
            held = self.rig.held.pop(("default", name, "main"), {})
            for ids in held.values():
                for i in ids:
                    if self.owner.get(i) == name:
                        del self.owner[i]
            self.rig.pods.pods.pop(("default", name), None)
            self.rig.publish_pr()


@pytest.fixture
def rig() -> Iterator[Rig]:
    def cfg(d: Path) -> AgentConfig:
        return agent_config(d, devices=4, memory_mib=65536)

    with running_rig(cfg) as r:
        yield r


@pytest.mark.parametrize("parallel_gpa", [False, True], ids=["allocate-parallel",
                                                          "preferred-parallel"])
def test_concurrent_calls_never_hand_a_unit_twice(rig: Rig, parallel_gpa: bool) -> None:
    sim = Sim(rig, parallel_gpa)
    assert rig.agent is not None
    agent = rig.agent
    stop = threading.Event()
    barrier = threading.Barrier(CALLERS + 1)

    def caller(w: int) -> None:
        barrier.wait(30)
        try:
            for i in range(PODS_PER_CALLER):
                sim.admit(f"c{w}-{i}", 1 + w, 5 + w)  # sizes tell callers apart
                if i >= ALIVE:
                    sim.delete(f"c{w}-{i - ALIVE}")
        except Exception as exc:  # reported below, with the others
            sim.errors.append(f"caller {w}: {exc!r}")

    def reconciler() -> None:  # the agent's own loop, much more often
        barrier.wait(30)
        while not stop.is_set():
            agent.reconcile()
            time.sleep(0.01)

    threads = [threading.Thread(target=caller, args=(w,)) for w in range(CALLERS)]
    extra = threading.Thread(target=reconciler)
    for t in [*threads, extra]:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    extra.join(30)
    assert not sim.errors, sim.errors[:3]
    assert not sim.violations, sim.violations[:3]

    # Settled: the ledger holds exactly what was answered to the pods still running.
    agent.reconcile()
    engine = agent.engine
    assert engine is not None
    answered = {
        (pod, r): sorted(ids) for (_ns, pod, _c), rs in rig.held.items() for r, ids in rs.items()
    }
    in_ledger = {
        (e.ref.pod_name, r): sorted(e.ids(k))
        for e in engine.ledger.entries
        for r, k in ((MEM, ResourceKind.MEMORY), (CORE, ResourceKind.CORE))
        if e.ids(k)
    }
    assert in_ledger == answered
    inv = engine.inventory
    assert engine.ledger.usage(inv) == engine.ledger.recount_usage(inv)

