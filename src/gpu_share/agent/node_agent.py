"""The node agent: I/O and threads around the pure allocation engine.

A kubelet call gathers its facts (PodResources, pod specs) without the lock, then takes
the agent's lock only to ask the engine and append the change to the ledger journal;
publishing goes to a background thread. An Allocate matching the preceding offer needs
no facts. The engine (gpu_share.sharing) owns every decision; this module owns when and
with which facts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from gpu_share.agent.bindings import ResourceBinding
from gpu_share.agent.calls import CallFacts, CallReports
from gpu_share.agent.container_dirs import ContainerDirs
from gpu_share.agent.enforcement import EnforcementStatus
from gpu_share.agent.feed import ChangeFeed
from gpu_share.agent.journal import LedgerJournal
from gpu_share.agent.kubelet_calls import CallSide, KubeletCalls
from gpu_share.agent.node_holds import AgentSide, NodeHolds
from gpu_share.agent.ports import (
    AgentMetrics,
    PodResourcesSource,
    PodSource,
    Publisher,
)
from gpu_share.agent.published import (
    decision_key,
    device_rows,
    node_annotations,
    node_labels,
    pod_annotations,
    previous_decision_keys,
)
from gpu_share.agent.publisher import BackgroundPublisher
from gpu_share.agent.response import RuntimeResponses
from gpu_share.agent.state import LedgerStore
from gpu_share.agent.unit_size import apply_configured_unit, unit_in_use
from gpu_share.config.model import AgentConfig, EnforcementMode
from gpu_share.devices.base import DeviceBackend, HealthEvent
from gpu_share.errors import (
    GpuShareError,
)
from gpu_share.observability.loops import LoopSupervisor
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    AllocateSpec,
    PodResourcesView,
    PodView,
    ResourceKind,
    ResourceNames,
)
from gpu_share.sharing.node.device_policy import make_policy
from gpu_share.sharing.node.engine import (
    AllocationEngine,
    CallContext,
    ReconcileResult,
)
from gpu_share.sharing.node.ledger import LedgerEntry
from gpu_share.sharing.node.ledger_annotations import inventory_annotation

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 30.0
# Max heartbeat ages (liveness): a pass may wait on PodResources and the API server
# (each bounded by its client timeouts, at most about 30 s) and on the agent's lock,
# which a kubelet call holds for as long; these leave room for both, several times.
RECONCILE_MAX_AGE_S = RECONCILE_INTERVAL_S + 150.0
REFRESH_MAX_AGE_S = 120.0
HEALTH_MAX_AGE_EXTRA_S = 120.0  # on top of two poll intervals
# stop(): the agent's share of the 5 s the process has after SIGTERM.
STOP_TIMEOUT_S = 2.0
# Allocations refused whole: nothing is held for the container (the kubelet runs nothing).


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
        loops: LoopSupervisor | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self._pr = pod_resources
        self._pods = pods if cfg.identity.use_api_server else None
        self._metrics = metrics or AgentMetrics()
        self._journal = LedgerJournal(store or LedgerStore(cfg.state_dir), self._metrics,
                                      self.warn_node)
        self._clock = clock
        self.names = ResourceNames(cfg.resources.memory_resource, cfg.resources.core_resource)
        self.feed = ChangeFeed()
        self._lock = threading.RLock()
        self._responses: RuntimeResponses | None = None
        self._stop = threading.Event()
        self._inventory_dirty = threading.Event()
        self._reconcile_now = threading.Event()
        self._reconcile_started = False
        self._threads: list[threading.Thread] = []
        # Every background loop is supervised (logged, counted, restarted) and beats a
        # heartbeat the liveness probe reads.
        self.loops = loops or LoopSupervisor(on_error=self._metrics.loop_error)
        self.engine: AllocationEngine | None = None
        # True once start() finished: only then may stop() write the ledger (an aborted
        # start must never overwrite what is on disk).
        self._started = False
        self._annotation_prefix = f"gpu-share.{cfg.resources.domain}"
        # Which devices take no new slice, and why (agent/node_holds.py).
        self.holds = NodeHolds(cfg.runtime, cfg.resources.domain, AgentSide(
            self._lock, lambda: self.engine, self.feed.bump, self.feed_inventory_changed,
            self.warn_node, self._node_event, self._metrics), dra=cfg.dra.enabled)
        self._dirs = ContainerDirs(
            cfg.runtime.hami_core.cache_dir
            if cfg.runtime.enforcement in (EnforcementMode.HAMI_CORE, EnforcementMode.AUTO)
            else None
        )
        self._publisher = (
            BackgroundPublisher(
                publisher, cfg.node_name, self._node_annotations, self._pod_annotations,
                enable_node=cfg.publish.node_annotation,
                enable_pods=cfg.publish.pod_annotation,
                enable_events=cfg.publish.events,
                on_error=self._metrics.kube_error,
                node_labels=self._node_labels,
                on_event_dropped=self._metrics.event_dropped,
            )
            if publisher is not None and cfg.node_name
            else None
        )
        self._facts = CallFacts(self._pr, self._pods, self._metrics, clock)
        self._reports = CallReports(self._metrics, self._publisher, cfg.node_name)
        self.calls = KubeletCalls(CallSide(
            self._lock, self._engine, self.names, self._context, clock, self._persist,
            self._spec_for, self._dirs, self._reports, self._metrics,
            self.feed_inventory_changed,
            self._publisher.pod_changed if self._publisher is not None else None))

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Discover devices (the backend is already started), load and reconcile the
        ledger."""
        devices = self.backend.devices()
        unit = unit_in_use(self.cfg.memory_unit_mib, self._journal, self.warn_node)
        inventory = Inventory.from_devices(devices, unit)
        ledger = self._journal.load(inventory)
        recorded, ledger.unit_mib = ledger.unit_mib, unit
        self.engine = AllocationEngine(
            inventory,
            ledger,
            self.names,
            make_policy(self.cfg.placement.policy),
            degraded_mode=self.cfg.identity.degraded_mode,
            decision_key=decision_key(self.cfg.placement.decision_key_file),
            previous_decision_keys=previous_decision_keys(
                self.cfg.placement.decision_key_file),
            node_name=self.cfg.node_name,
        )
        # The response reads the engine's device table at each call (health, devices).
        self._responses = RuntimeResponses(
            lambda: self._engine().inventory,
            self.backend.naming(),
            self.holds.runtime,
            annotation_prefix=self._annotation_prefix,
            memory_resource=self.names.memory,
        )
        self._dirs.start(self._engine().ledger.entries)
        self.holds.check_enforcement()
        if self.holds.state.annotations is not None:
            self.holds.on_node_annotations(self.holds.state.annotations)
        log.info(
            "devices discovered",
            extra={"devices": [d.uuid for d in devices], "backend": self.backend.name},
        )
        # Before serving: adopt every slice the kubelet knows (PodResources alone is enough
        # to never give one twice); the API server's view follows in the background.
        self.reconcile(use_api=False)
        if self._stop.is_set():
            return  # stopped while starting: spawn nothing
        if recorded != unit:
            with self._lock:
                self._persist()  # the unit size the ledger's ids are cut in
        # A fresh snapshot and journal generation: a torn record at the end of the old
        # journal is never appended to.
        self.compact()
        self._metrics.memory_unit(self.cfg.memory_unit_mib, unit)
        if self._publisher is not None:
            self._publisher.start(self.loops)
            self._publisher.node_changed()
        self._report_devices()
        health_age = 2 * self.cfg.health.poll_interval_seconds + HEALTH_MAX_AGE_EXTRA_S
        self._threads = [
            self.loops.spawn("health", self._health_step, max_age_s=health_age, stop=self._stop),
            self.loops.spawn(
                "reconcile", self._reconcile_step, max_age_s=RECONCILE_MAX_AGE_S, stop=self._stop
            ),
            self.loops.spawn(
                "refresh", self._refresh_step, max_age_s=REFRESH_MAX_AGE_S, stop=self._stop
            ),
        ]
        self._started = True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the loops and the backend within about ``timeout_s``; whatever is stuck
        in a call (a loop, NVML's event wait) is left behind in its daemon thread.
        Writes the ledger only after a complete start, and only if no kubelet call holds
        the lock (such a call writes the ledger itself)."""
        deadline = time.monotonic() + timeout_s

        def left(reserve: float = 0.0) -> float:
            return max(0.0, deadline - time.monotonic() - reserve)

        self._stop.set()
        self._reconcile_now.set()
        # The backend's stop wakes a health poll; NVML's may wait for the poll's lock.
        backend_stop = threading.Thread(target=self.backend.stop, name="backend-stop",
                                        daemon=True)
        backend_stop.start()
        if self._publisher is not None:
            self._publisher.flush(min(0.5, left(1.0)))
            self._publisher.stop(left(1.0))
        for t in self._threads:
            t.join(left(0.5))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            log.warning("loops still busy at stop, left behind: %s", ", ".join(stuck))
        if self._started and self._lock.acquire(timeout=left(0.1)):
            try:
                self._persist()
                self._journal.snapshot(self._engine().ledger.to_json(),
                                       self._journal.store.journal_gen)
            finally:
                self._journal.store.close_journal()
                self._lock.release()
        backend_stop.join(left())

    def request_reconcile(self) -> None:
        """Reconcile soon, from the reconcile loop (e.g. after the kubelet restarted)."""
        self._reconcile_now.set()

    def handlers(self) -> list[ResourceBinding]:
        return [self._binding(k, self.names.name_of(k)) for k in ResourceKind]

    def _binding(self, kind: ResourceKind, resource_name: str) -> ResourceBinding:
        return ResourceBinding(
            kind,
            resource_name,
            list_devices=partial(self.calls.advertised, kind),
            wait_for_change=self.feed.wait_for_change,
            preferred_allocation=partial(self.calls.preferred, kind),
            allocate=partial(self.calls.allocate, kind),
        )

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self._publisher.flush(timeout_s) if self._publisher is not None else True

    # ---- reconciliation, health ------------------------------------------------------------

    def reconcile(self, *, use_api: bool = True) -> None:
        """Bring the ledger in line with the kubelet and (``use_api``) the API server."""
        listed_at = self._clock()
        listed = self._facts.node_pods(self.cfg.node_name) if use_api else None
        with self._lock:
            # PodResources under the lock: a pod admitted meanwhile must be in it.
            pr = self._facts.pod_resources()
            if pr is None:
                log.warning("reconcile skipped: PodResources unreachable")
                # Offers no Allocate followed expire all the same (docs/allocation.md).
                if self._engine().reconcile(None, None, self._clock()).changed:
                    self._persist()
                    self.feed_inventory_changed()
                return
            result = self._reconcile_with(pr, listed, listed_at)
        if result.changed:
            log.info(
                "ledger reconciled",
                extra={"released": [str(r) for r in result.released],
                       "adopted": [str(r) for r in result.adopted]},
            )
            self.feed_inventory_changed()
        self._dirs.sweep()
        if apply_configured_unit(self.cfg.memory_unit_mib, self._engine, self._lock,
                                 self._persist, self._metrics, self._node_event):
            self.feed.bump()  # ListAndWatch sends the new unit list
            self.feed_inventory_changed()

    def _reconcile_with(self, pr: PodResourcesView, listed: list[PodView] | None,
                        listed_at: float) -> ReconcileResult:
        """One reconcile pass under the lock, with the node's pods as of ``listed_at``."""
        engine = self._engine()
        pods: dict[tuple[str, str], PodView | None] | None = None
        if listed is not None:
            # The list is complete for this node as of listed_at: a pod we held before
            # then and that is missing from it is gone. Younger entries are not judged.
            pods = {e.pod_key: None for e in engine.ledger.entries if e.created_at < listed_at}
            pods.update({(p.namespace, p.name): p for p in listed})
        result = engine.reconcile(pr, pods, self._clock())
        if result.changed:
            self._persist()
            for ns, name in result.pods_touched:
                if self._publisher is not None:
                    self._publisher.pod_changed(ns, name)
        return result

    def on_health(self, events: Sequence[HealthEvent]) -> None:
        changed = False
        with self._lock:
            for ev in events:
                changed |= self._engine().set_health(ev.uuid, ev.healthy)
        if not changed:
            return
        for ev in events:
            log.warning("device health changed",
                        extra={"device": ev.uuid, "healthy": ev.healthy, "reason": ev.reason})
            state = "healthy" if ev.healthy else "unhealthy"
            say = self._node_event if ev.healthy else self.warn_node
            say(f"Device{state.capitalize()}", f"device {ev.uuid} is {state} ({ev.reason})")
        self.feed.bump()
        self.feed_inventory_changed()

    # ---- devices held back (agent/node_holds.py) -------------------------------------

    @property
    def enforcement(self) -> EnforcementStatus:
        """Whether the node can enforce its pool's mode, as last checked."""
        return self.holds.enforcement

    def device_ids(self) -> list[str]:
        """Every device of the node (uuid)."""
        with self._lock:
            return [d.uuid for d in self._engine().inventory.devices]

    def feed_inventory_changed(self) -> None:
        """Usage or health changed: refresh metrics and the node annotation, coalesced in
        the background (off the kubelet's call path)."""
        self._inventory_dirty.set()

    def _refresh_step(self) -> None:
        self._maybe_compact()
        if not self._inventory_dirty.wait(0.5):
            return
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

    # Loop steps: the supervisor calls each again and again; whatever one raises is
    # logged, counted, and followed by a pause (observability.loops).

    def _health_step(self) -> None:
        events = self.backend.poll_health(self.cfg.health.poll_interval_seconds)
        if events and not self._stop.is_set():
            self.on_health(events)
        if not self._stop.is_set():
            self.holds.check_enforcement()
            self.holds.cordon_wait_over()

    def _reconcile_step(self) -> None:
        # The first full reconcile right after start, then every interval or on request.
        if self._reconcile_started:
            self._reconcile_now.wait(RECONCILE_INTERVAL_S)
        self._reconcile_started = True
        self._reconcile_now.clear()
        if not self._stop.is_set():
            self.reconcile()

    def _node_event(self, reason: str, message: str) -> None:
        """A Normal Event on this node."""
        if self._publisher is not None:
            self._publisher.event(None, self.cfg.node_name, reason=reason, message=message,
                                  warning=False)

    def warn_node(self, reason: str, message: str) -> None:
        """A Warning Event on this node (what the agent could not do)."""
        if self._publisher is not None:
            text = message if len(message) <= 1000 else message[:1000] + "..."
            self._publisher.event(None, self.cfg.node_name, reason=reason, message=text,
                                  warning=True)

    def _persist(self) -> None:
        """Append what changed to the journal (one write; a snapshot follows in the
        background, ``_maybe_compact``). Called under the lock."""
        if self.engine is not None:  # before the ledger forgets an entry: its dir first
            self._dirs.follow(self.engine.ledger.entries)
        self._journal.append(self._engine().ledger)

    def compact(self) -> None:
        """Fold the journal into a new ledger.json: the snapshot is taken under the lock,
        written without it; appends go to the next generation meanwhile."""
        with self._journal.compact_lock:
            with self._lock:
                self._persist()
                text, gen = self._journal.cut(self._engine().ledger)
            self._journal.snapshot(text, gen)

    def _maybe_compact(self) -> None:
        if self.engine is not None and self._started and self._journal.due():
            self.compact()

    def _context(self) -> CallContext:
        """Facts for one kubelet call, without the lock (``agent/calls.py``)."""
        return self._facts.context(self._engine().context_needs)

    def _spec_for(self, entry: LedgerEntry) -> AllocateSpec:
        if self._responses is None:
            raise GpuShareError("agent not started")
        return self._responses.build(entry)

    def _report_devices(self) -> None:
        with self._lock:
            if self.engine is None:
                return
            rows = device_rows(self.engine, self.names, self.holds.state.counts_as_cordoned)
        self._metrics.devices(rows)

    def _node_labels(self) -> Mapping[str, str | None]:
        return node_labels(self.cfg.resources.domain, self.enforcement)

    def _node_annotations(self) -> Mapping[str, str | None]:
        with self._lock:
            engine = self._engine()
            doc = inventory_annotation(self.cfg.node_name, engine.inventory, engine.usage())
        return node_annotations(self.cfg.resources.domain, doc, self.enforcement)

    def _pod_annotations(self, namespace: str, name: str) -> Mapping[str, str | None] | None:
        with self._lock:
            return pod_annotations(self.cfg.resources.domain, self._engine(),
                                   self.cfg.node_name, namespace, name)
