"""A small pure model of the kubelet's device manager, driving an AllocationEngine.

Models: active pods (a pod is active from just before its admission), one pod admitted
at a time, containers in admission order, a random resource order per container, GPA
then Allocate (the engine's preferred ids when they suffice, else the kubelet fills in
arbitrarily), init-container reuse incl. Allocate without GPA, sidecars keeping theirs,
rejections, pods ending. PodResources shows a resource only after its Allocate returned.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpu_share.errors import GpuShareError
from gpu_share.sharing.ids import parse_unit_id
from gpu_share.sharing.model import (
    ContainerKind,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    PodView,
    ResourceKind,
)
from gpu_share.sharing.node.engine import AllocationEngine, CallContext
from gpu_share.sharing.node.ledger import PodKey

RestartHook = Callable[["KubeletSim"], None]


@dataclass
class KubeletSim:
    engine: AllocationEngine
    rng: random.Random
    now: float = 1000.0
    # Pods the API server knows (None: deleted).
    api: dict[PodKey, PodView | None] = field(default_factory=dict)
    active: dict[PodKey, PodView] = field(default_factory=dict)
    # pod -> container -> kind -> ids
    held: dict[PodKey, dict[str, dict[ResourceKind, list[str]]]] = field(default_factory=dict)
    before_call: RestartHook | None = None
    pr_reachable: bool = True
    api_reachable: bool = True  # False: calls get PodResources but no pod specs
    rejected: list[tuple[PodKey, str]] = field(default_factory=list)
    calls: int = 0

    # -- kubelet views ------------------------------------------------------------
    def healthy_ids(self, kind: ResourceKind) -> set[str]:
        return {a.id for a in self.engine.advertised(kind) if a.healthy}

    def allocated(self, kind: ResourceKind) -> set[str]:
        return {i for cs in self.held.values() for ks in cs.values() for i in ks.get(kind, [])}

    def pr(self) -> PodResourcesView:
        names = self.engine.resources
        pods = []
        for key, view in self.active.items():
            cs = self.held.get(key, {})
            pods.append(
                PodResourcesPod(
                    key[0],
                    key[1],
                    tuple(
                        PodResourcesContainer(
                            c.name,
                            {
                                names.name_of(k): tuple(ids)
                                for k, ids in cs.get(c.name, {}).items()
                                if ids
                            },
                        )
                        for c in view.containers
                    ),
                )
            )
        return PodResourcesView(tuple(pods))

    def ctx(self) -> CallContext:
        self.now += 0.5
        if not self.pr_reachable:
            return CallContext(None, None, self.now)
        pr = self.pr()
        if not self.api_reachable:
            return CallContext(pr, None, self.now)
        needs = self.engine.context_needs(pr)
        return CallContext(pr, {k: self.api.get(k) for k in needs}, self.now)

    def reconcile(self) -> None:
        self.now += 1.0
        pr = self.pr()
        self.engine.reconcile(pr, dict(self.api), self.now)

    # -- lifecycle ------------------------------------------------------------------
    def admit(self, view: PodView) -> bool:
        key = (view.namespace, view.name)
        self.api[key] = view
        self.active[key] = view
        self.held[key] = {}
        reuse: dict[ResourceKind, set[str]] = {k: set() for k in ResourceKind}
        try:
            for c in view.containers:
                kinds = [k for k in ResourceKind if c.request.amount(k) > 0]
                self.rng.shuffle(kinds)
                mine: dict[ResourceKind, list[str]] = {}
                for kind in kinds:
                    ids = self._devices_to_allocate(kind, c.request.amount(kind), reuse[kind])
                    self._call()
                    self.engine.allocate(kind, ids, self.ctx())
                    mine[kind] = ids
                    self.held[key][c.name] = dict(mine)
                for kind in ResourceKind:
                    got = set(mine.get(kind, []))
                    if c.kind is ContainerKind.INIT:
                        reuse[kind] |= got
                    else:
                        reuse[kind] -= got
        except GpuShareError as e:
            self.rejected.append((key, f"{e.reason}: {e}"))
            self.active.pop(key)
            self.held.pop(key)
            self.api[key] = replace(view, phase="Failed")
            return False
        return True

    def _devices_to_allocate(
        self, kind: ResourceKind, needed: int, reusable: set[str]
    ) -> list[str]:
        pool = sorted(reusable)
        self.rng.shuffle(pool)
        alloc = pool[:needed]
        if len(alloc) == needed:
            return alloc  # all reused: Allocate without GPA
        available = sorted(self.healthy_ids(kind) - self.allocated(kind))
        if len(available) < needed - len(alloc):
            raise GpuShareError("not enough devices", reason="UnexpectedAdmissionError")
        self._call()
        pref = self.engine.preferred(
            kind, sorted(set(available) | set(alloc)), sorted(alloc), needed, self.ctx()
        )
        for i in pref.ids:
            if len(alloc) < needed and i in available and i not in alloc:
                alloc.append(i)
        rest = [i for i in available if i not in alloc]
        self.rng.shuffle(rest)
        alloc.extend(rest[: needed - len(alloc)])
        return alloc

    def _call(self) -> None:
        self.calls += 1
        if self.before_call is not None:
            self.before_call(self)

    def end(self, key: PodKey) -> None:
        self.active.pop(key, None)
        self.held.pop(key, None)
        self.api[key] = None

    # -- invariants --------------------------------------------------------------------
    def check_invariants(self, *, colocated: bool = True) -> None:
        dev_pods: dict[str, set[PodKey]] = {}
        for key, cs in self.held.items():
            for ks in cs.values():
                for ids in ks.values():
                    for i in ids:
                        dev_pods.setdefault(parse_unit_id(i).device, set()).add(key)
        for key, view in self.active.items():
            for c in view.containers:
                ks = self.held.get(key, {}).get(c.name, {})
                devs = {parse_unit_id(i).device for ids in ks.values() for i in ids}
                if c.request.cores >= 100 and colocated:
                    # Exclusive: nobody from another pod on any of its devices.
                    for d in devs:
                        assert dev_pods[d] == {key}, (c, d, dev_pods[d])
                    assert len(devs) <= c.request.cores // 100 or not colocated
                elif colocated:
                    assert len(devs) <= 1, (key, c.name, ks)
        usage = self.engine.usage()
        for d in self.engine.inventory.devices:
            u = usage[d.uuid]
            assert u.memory_used <= d.memory_units, (d.uuid, u)
            assert u.cores_used <= d.cores, (d.uuid, u)
            assert len(u.exclusive_pods) <= 1, (d.uuid, u)
