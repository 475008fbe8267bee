"""The kubelet's calls on the agent: ListAndWatch's device list, GetPreferredAllocation
and Allocate. Facts are read without the agent's lock (other calls go on meanwhile), the
engine decides under it, the ledger is journaled before the answer, and what happened is
said after (``agent/calls.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpu_share.agent.calls import CallReports
from gpu_share.agent.container_dirs import ContainerDirs
from gpu_share.agent.ports import AgentMetrics
from gpu_share.errors import AllocationError, AllocationReason
from gpu_share.sharing.model import AdvertisedDevice, AllocateSpec, ResourceKind, ResourceNames
from gpu_share.sharing.node.engine import Allocation, AllocationEngine, CallContext
from gpu_share.sharing.node.ledger import LedgerEntry
from gpu_share.sharing.node.limits import MEMORY_REQUIRED

# Refusals after which the kubelet runs nothing: the decision is dropped, not kept.
REFUSED = frozenset({MEMORY_REQUIRED, AllocationReason.HOST_DIR_UNAVAILABLE})


@dataclass
class CallSide:
    """What the calls need of the agent."""

    lock: threading.RLock
    engine: Callable[[], AllocationEngine]  # raises before start
    names: ResourceNames
    context: Callable[[], CallContext]  # PodResources and pod specs, without the lock
    clock: Callable[[], float]
    persist: Callable[[], None]  # journal what changed; under the lock
    spec_for: Callable[[LedgerEntry], AllocateSpec]
    dirs: ContainerDirs
    reports: CallReports
    metrics: AgentMetrics
    inventory_changed: Callable[[], None]
    pod_changed: Callable[[str, str], None] | None


class KubeletCalls:
    def __init__(self, side: CallSide) -> None:
        self._s = side

    def advertised(self, kind: ResourceKind) -> list[AdvertisedDevice]:
        with self._s.lock:
            return self._s.engine().advertised(kind)

    def preferred(
        self, kind: ResourceKind, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        s = self._s
        resource = s.names.name_of(kind)
        t0 = time.perf_counter()
        try:
            ctx = s.context()  # I/O without the lock: other calls go on meanwhile
            with s.lock:
                result = s.engine().preferred(kind, available, must_include, size, ctx)
                if result.changed:
                    s.persist()
            s.reports.after(resource, result)
            return list(result.ids)
        except AllocationError as exc:
            s.reports.failed(resource, exc)
            raise
        finally:
            s.metrics.observe_call("preferred", resource, time.perf_counter() - t0)

    def allocate(self, kind: ResourceKind, ids: Sequence[str]) -> AllocateSpec:
        s = self._s
        resource = s.names.name_of(kind)
        t0 = time.perf_counter()
        try:
            # The usual case: these ids are what we offered a moment ago; no need to ask
            # the kubelet and the API server again (and no second scan in the engine).
            with s.lock:
                done = (self._allocate_locked(kind, ids, None)
                        if s.engine().has_offer(kind, ids) else None)
            if done is None:
                ctx = s.context()  # I/O without the lock
                with s.lock:
                    done = self._allocate_locked(kind, ids, ctx)
            result, spec = done
            s.reports.after(resource, result)
            s.metrics.allocation(resource, result.entry.source)
            s.inventory_changed()
            if result.entry.ref.namespace and s.pod_changed is not None:
                s.pod_changed(result.entry.ref.namespace, result.entry.ref.pod_name)
            return spec
        except AllocationError as exc:
            s.reports.failed(resource, exc)
            raise
        finally:
            s.metrics.observe_call("allocate", resource, time.perf_counter() - t0)

    def _allocate_locked(
        self, kind: ResourceKind, ids: Sequence[str], ctx: CallContext | None
    ) -> tuple[Allocation, AllocateSpec]:
        s = self._s
        engine = s.engine()
        ctx = ctx or CallContext(pr=None, pods=None, now=s.clock())
        result = engine.allocate(kind, ids, ctx)
        try:
            spec = s.spec_for(result.entry)
            s.dirs.make(result.entry, spec)
        except AllocationError as exc:
            if exc.reason in REFUSED:  # refused: the kubelet runs nothing
                engine.ledger.remove(result.entry.ref)
            s.persist()
            raise
        s.persist()
        return result, spec
