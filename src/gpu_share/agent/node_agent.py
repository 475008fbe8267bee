"""The node agent: I/O and threads around the pure allocation engine.

Every kubelet call runs under one lock: gather facts (PodResources, pod specs), ask the
engine, persist the ledger, then hand publishing to a background thread. The engine
(gpu_share.sharing) owns every decision; this module owns when and with which facts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_share.agent.feed import ChangeFeed
from gpu_share.agent.ports import PodResourcesSource, PodSource, Publisher
from gpu_share.agent.publisher import BackgroundPublisher
from gpu_share.agent.state import LedgerStore
from gpu_share.config.model import AgentConfig
from gpu_share.devices.base import Device, DeviceBackend, HealthEvent
from gpu_share.errors import (
    AllocationError,
    ConfigError,
    GpuShareError,
    KubeAccessError,
    LedgerError,
)
from gpu_share.sharing.annotations import (
    assignment_key,
    encode_assignment,
    encode_inventory,
    inventory_key,
)
from gpu_share.sharing.engine import Allocation, AllocationEngine, CallContext, Preferred
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.ledger import EntrySource, Ledger, LedgerEntry
from gpu_share.sharing.model import (
    AdvertisedDevice,
    AllocateSpec,
    PodResourcesView,
    PodView,
    ResourceKind,
    ResourceNames,
)
from gpu_share.sharing.policy import make_policy
from gpu_share.sharing.response import build_allocate_spec

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 30.0


class AgentMetrics:
    """What the agent reports; the cli binds it to Prometheus. No-ops by default."""

    def observe_call(self, call: str, resource: str, seconds: float) -> None: ...
    def allocation(self, resource: str, source: str) -> None: ...
    def failure(self, resource: str, reason: str) -> None: ...
    def degraded(self, reason: str) -> None: ...
    def ambiguous(self) -> None: ...
    def kube_error(self, op: str) -> None: ...
    def ledger_write(self) -> None: ...
    def devices(self, rows: Sequence[DeviceRow]) -> None: ...


@dataclass(frozen=True)
class DeviceRow:
    """One device's figures for metrics: (resource, used, total) per resource."""

    device: str
    healthy: bool
    units: tuple[tuple[str, int, int], ...]


def _degraded_label(notes: Sequence[str]) -> str:
    """A low-cardinality metric label from the engine's notes."""
    text = " ".join(notes)
    if "PodResources" in text:
        return "podresources-unreachable"
    if "API server" in text:
        return "apiserver-unreachable"
    return "no-candidate"


class ResourceServer:
    """``plugin.handler.ResourceHandler`` for one extended resource."""

    def __init__(self, agent: NodeAgent, kind: ResourceKind, resource_name: str) -> None:
        self._agent = agent
        self.kind = kind
        self._resource_name = resource_name

    @property
    def resource_name(self) -> str:
        return self._resource_name

    @property
    def endpoint(self) -> str:
        return "gpu-share-" + self._resource_name.split("/", 1)[1] + ".sock"

    @property
    def preferred_allocation_available(self) -> bool:
        return True

    @property
    def pre_start_required(self) -> bool:
        return False

    def list_devices(self) -> list[AdvertisedDevice]:
        return self._agent.advertised(self.kind)

    def wait_for_change(self, seen_version: int, timeout_s: float) -> int:
        return self._agent.feed.wait_for_change(seen_version, timeout_s)

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return self._agent.preferred(self.kind, available, must_include, size)

    def allocate(self, device_ids: Sequence[str]) -> AllocateSpec:
        return self._agent.allocate(self.kind, device_ids)

    def pre_start(self, device_ids: Sequence[str]) -> None:
        return None


class NodeAgent:
    def __init__(
        self,
        cfg: AgentConfig,
        backend: DeviceBackend,
        *,
        pod_resources: PodResourcesSource | None,
        pods: PodSource | None,
        publisher: Publisher | None,
        metrics: AgentMetrics | None = None,
        store: LedgerStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self._pr = pod_resources
        self._pods = pods if cfg.identity.use_api_server else None
        self._metrics = metrics or AgentMetrics()
        self._store = store or LedgerStore(cfg.state_dir)
        self._clock = clock
        self.names = ResourceNames(cfg.resources.memory_resource, cfg.resources.core_resource)
        self.feed = ChangeFeed()
        self._lock = threading.RLock()
        self._pod_cache: dict[tuple[str, str], PodView] = {}
        self._devices: dict[str, Device] = {}
        self._stop = threading.Event()
        self._inventory_dirty = threading.Event()
        self._threads: list[threading.Thread] = []
        self.engine: AllocationEngine | None = None
        self._annotation_prefix = f"gpu-share.{cfg.resources.domain}"
        self._publisher = (
            BackgroundPublisher(
                publisher,
                cfg.node_name,
                self._node_annotations,
                self._pod_annotations,
                enable_node=cfg.publish.node_annotation,
                enable_pods=cfg.publish.pod_annotation,
                enable_events=cfg.publish.events,
                on_error=self._metrics.kube_error,
            )
            if publisher is not None and cfg.node_name
            else None
        )

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Discover devices (the backend is already started), load and reconcile the
        ledger."""
        devices = self.backend.devices()
        self._devices = {d.uuid: d for d in devices}
        inventory = Inventory.from_devices(devices, self.cfg.memory_unit_mib)
        ledger = self._load_ledger()
        self.engine = AllocationEngine(
            inventory,
            ledger,
            self.names,
            make_policy(self.cfg.placement.policy),
            degraded_mode=self.cfg.identity.degraded_mode,
            decision_key=self._decision_key(),
            node_name=self.cfg.node_name,
        )
        log.info(
            "devices discovered",
            extra={"devices": [d.uuid for d in devices], "backend": self.backend.name},
        )
        # Before serving: adopt every slice the kubelet knows (PodResources alone is enough
        # to never give one twice); the API server's view follows in the background.
        self.reconcile(use_api=False)
        if self._publisher is not None:
            self._publisher.start()
            self._publisher.node_changed()
        self._report_devices()
        self._spawn("health", self._health_loop)
        self._spawn("reconcile", self._reconcile_loop)
        self._spawn("refresh", self._refresh_loop)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5.0)
        if self._publisher is not None:
            self._publisher.flush(2.0)
            self._publisher.stop()
        with self._lock:
            if self.engine is not None:
                self._persist()
        self.backend.stop()

    def handlers(self) -> list[ResourceServer]:
        return [
            ResourceServer(self, ResourceKind.MEMORY, self.names.memory),
            ResourceServer(self, ResourceKind.CORE, self.names.core),
        ]

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self._publisher.flush(timeout_s) if self._publisher is not None else True

    # ---- kubelet calls -----------------------------------------------------------------

    def advertised(self, kind: ResourceKind) -> list[AdvertisedDevice]:
        with self._lock:
            return self._engine().advertised(kind)

    def preferred(
        self, kind: ResourceKind, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        resource = self._resource(kind)
        t0 = time.perf_counter()
        try:
            with self._lock:
                ctx = self._context()
                result = self._engine().preferred(kind, available, must_include, size, ctx)
                if result.changed:
                    self._persist()
            self._after_call(resource, result)
            return list(result.ids)
        except AllocationError as exc:
            self._failed(resource, exc)
            raise
        finally:
            self._metrics.observe_call("preferred", resource, time.perf_counter() - t0)

    def allocate(self, kind: ResourceKind, ids: Sequence[str]) -> AllocateSpec:
        resource = self._resource(kind)
        t0 = time.perf_counter()
        try:
            with self._lock:
                engine = self._engine()
                # The usual case: these ids are what we offered a moment ago; no need to
                # ask the kubelet and the API server again.
                ctx = (
                    CallContext(pr=None, pods=None, now=self._clock())
                    if engine.has_offer(kind, ids)
                    else self._context()
                )
                result = engine.allocate(kind, ids, ctx)
                self._persist()
                spec = self._spec_for(result.entry)
            self._after_call(resource, result)
            self._metrics.allocation(resource, result.entry.source)
            self.feed_inventory_changed()
            if result.entry.ref.namespace and self._publisher is not None:
                self._publisher.pod_changed(result.entry.ref.namespace, result.entry.ref.pod_name)
            return spec
        except AllocationError as exc:
            self._failed(resource, exc)
            raise
        finally:
            self._metrics.observe_call("allocate", resource, time.perf_counter() - t0)

    # ---- reconciliation, health ------------------------------------------------------------

    def reconcile(self, *, use_api: bool = True) -> None:
        """Bring the ledger in line with the kubelet and (``use_api``) the API server."""
        listed: list[PodView] | None = None
        listed_at = self._clock()
        if use_api and self._pods is not None and self.cfg.node_name:
            try:
                listed = self._pods.list_node_pods(self.cfg.node_name)
            except KubeAccessError as exc:
                self._metrics.kube_error("list_node_pods")
                log.warning("reconcile without pod specs: %s", exc)
        with self._lock:
            # PodResources under the lock: a pod admitted meanwhile must be in it.
            pr = self._list_pod_resources()
            if pr is None:
                log.warning("reconcile skipped: PodResources unreachable")
                return
            engine = self._engine()
            pods: dict[tuple[str, str], PodView | None] | None = None
            if listed is not None:
                # The list is complete for this node as of listed_at: a pod we held before
                # then and that is missing from it is gone. Younger entries are not judged.
                pods = {e.pod_key: None for e in engine.ledger.entries
                        if e.created_at < listed_at}
                pods.update({(p.namespace, p.name): p for p in listed})
            result = engine.reconcile(pr, pods, self._clock())
            if result.changed:
                self._persist()
                for ns, name in result.pods_touched:
                    if self._publisher is not None:
                        self._publisher.pod_changed(ns, name)
        if result.changed:
            log.info(
                "ledger reconciled",
                extra={"released": [str(r) for r in result.released],
                       "adopted": [str(r) for r in result.adopted]},
            )
            self.feed_inventory_changed()

    def on_health(self, events: Sequence[HealthEvent]) -> None:
        changed = False
        with self._lock:
            for ev in events:
                changed |= self._engine().set_health(ev.uuid, ev.healthy)
        if not changed:
            return
        for ev in events:
            log.warning(
                "device health changed",
                extra={"device": ev.uuid, "healthy": ev.healthy, "reason": ev.reason},
            )
            if self._publisher is not None:
                self._publisher.event(
                    None,
                    self.cfg.node_name,
                    reason="DeviceHealthy" if ev.healthy else "DeviceUnhealthy",
                    message=f"device {ev.uuid} is {'healthy' if ev.healthy else 'unhealthy'}"
                    f" ({ev.reason})",
                    warning=not ev.healthy,
                )
        self.feed.bump()
        self.feed_inventory_changed()

    def feed_inventory_changed(self) -> None:
        """Usage or health changed: refresh metrics and the node annotation, coalesced in
        the background (off the kubelet's call path)."""
        self._inventory_dirty.set()

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            if not self._inventory_dirty.wait(0.5):
                continue
            self._inventory_dirty.clear()
            self._report_devices()
            if self._publisher is not None:
                self._publisher.node_changed()
            self._stop.wait(0.2)  # at most a few refreshes a second under load

    # ---- internals ---------------------------------------------------------------------

    def _engine(self) -> AllocationEngine:
        if self.engine is None:
            raise GpuShareError("agent not started")
        return self.engine

    def _resource(self, kind: ResourceKind) -> str:
        return self.names.memory if kind is ResourceKind.MEMORY else self.names.core

    def _spawn(self, name: str, fn: Callable[[], None]) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _health_loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self.backend.poll_health(self.cfg.health.poll_interval_seconds)
            except GpuShareError as exc:
                log.error("health poll failed: %s", exc)
                self._stop.wait(self.cfg.health.poll_interval_seconds)
                continue
            if events:
                self.on_health(events)

    def _reconcile_loop(self) -> None:
        wait = 0.0  # the first full reconcile right after start
        while not self._stop.wait(wait):
            wait = RECONCILE_INTERVAL_S
            try:
                self.reconcile()
            except GpuShareError as exc:
                log.error("reconcile failed: %s", exc)

    def _decision_key(self) -> bytes | None:
        path = self.cfg.placement.decision_key_file
        if not path:
            return None
        try:
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"placement.decisionKeyFile {path} cannot be read: {exc}") from exc
        if not key:
            raise ConfigError(f"placement.decisionKeyFile {path} is empty")
        return key

    def _load_ledger(self) -> Ledger:
        try:
            data = self._store.load()
            return Ledger.from_json(data) if data is not None else Ledger()
        except LedgerError as exc:
            moved = self._store.quarantine()
            log.error(
                "ledger unreadable, starting empty; PodResources reconciliation re-adopts"
                " every running container",
                extra={"error": str(exc), "moved_to": str(moved)},
            )
            return Ledger()

    def _persist(self) -> None:
        self._store.save(self._engine().ledger.to_json())
        self._metrics.ledger_write()

    def _list_pod_resources(self) -> PodResourcesView | None:
        if self._pr is None:
            return None
        try:
            return self._pr.list()
        except KubeAccessError as exc:
            self._metrics.kube_error("podresources_list")
            log.warning("PodResources unreachable: %s", exc)
            return None

    def _context(self) -> CallContext:
        """Facts for one kubelet call: PodResources now, and specs of pods it needs."""
        now = self._clock()
        pr = self._list_pod_resources()
        if pr is None:
            return CallContext(pr=None, pods=None, now=now)
        active = {(p.namespace, p.name) for p in pr.pods}
        for key in [k for k in self._pod_cache if k not in active]:
            del self._pod_cache[key]
        if self._pods is None:
            return CallContext(pr=pr, pods=None, now=now)
        for ns, name in self._engine().context_needs(pr):
            if (ns, name) in self._pod_cache:
                continue
            try:
                view = self._pods.get_pod(ns, name)
            except KubeAccessError as exc:
                self._metrics.kube_error("get_pod")
                log.warning("API server unreachable for pod %s/%s: %s", ns, name, exc)
                return CallContext(pr=pr, pods=None, now=now)
            if view is not None:
                self._pod_cache[(ns, name)] = view
        return CallContext(pr=pr, pods=dict(self._pod_cache), now=now)

    def _after_call(self, resource: str, result: Preferred | Allocation) -> None:
        if result.identity_source is EntrySource.DEGRADED:
            reason = "; ".join(result.notes) or "pod unknown"
            self._metrics.degraded(_degraded_label(result.notes))
            log.warning("degraded decision", extra={"resource": resource, "notes": reason})
            if self._publisher is not None:
                self._publisher.event(
                    None, self.cfg.node_name, reason="DegradedAllocation",
                    message=f"{resource}: {reason}", warning=True,
                )
        elif result.notes:
            log.info("allocation notes", extra={"resource": resource, "notes": result.notes})
            ref = result.entry.ref
            for note in result.notes:
                if note.startswith("extender decision") and self._publisher is not None:
                    self._publisher.event(ref.namespace, ref.pod_name,
                                          reason="ExtenderDecisionIgnored", message=note,
                                          warning=True)
        if result.ambiguity:
            self._metrics.ambiguous()

    def _failed(self, resource: str, exc: AllocationError) -> None:
        self._metrics.failure(resource, exc.reason)
        ref = getattr(exc, "ref", None)
        log.warning(
            "allocation failed",
            extra={"resource": resource, "reason": exc.reason, "error": exc.message,
                   "container": str(ref) if ref else None},
        )
        if self._publisher is None:
            return
        if ref is not None and ref.namespace:
            self._publisher.event(
                ref.namespace, ref.pod_name, reason=exc.reason,
                message=f"container {ref.container_name}: {exc.message}", warning=True,
            )
        else:
            self._publisher.event(
                None, self.cfg.node_name, reason=exc.reason,
                message=f"{resource}: {exc.message}", warning=True,
            )

    def _spec_for(self, entry: LedgerEntry) -> AllocateSpec:
        return build_allocate_spec(
            entry,
            self._devices,
            self.backend.naming(),
            self.cfg.runtime,
            self.cfg.memory_unit_mib,
            self._annotation_prefix,
        )

    def _report_devices(self) -> None:
        with self._lock:
            if self.engine is None:
                return
            usage = self.engine.usage()
            rows = [
                DeviceRow(
                    d.uuid,
                    d.healthy,
                    (
                        (self.names.memory, usage[d.uuid].memory_used, d.memory_units),
                        (self.names.core, usage[d.uuid].cores_used, d.cores),
                    ),
                )
                for d in self.engine.inventory.devices
            ]
        self._metrics.devices(rows)

    def _node_annotations(self) -> Mapping[str, str | None]:
        with self._lock:
            doc = self._engine().inventory_view(self.cfg.node_name)
        return {inventory_key(self.cfg.resources.domain): encode_inventory(doc)}

    def _pod_annotations(self, namespace: str, name: str) -> Mapping[str, str | None] | None:
        with self._lock:
            doc = self._engine().assignment_of(namespace, name)
        # None removes a stale annotation once we hold nothing for the pod.
        return {assignment_key(self.cfg.resources.domain): encode_assignment(doc) if doc else None}
