"""The agent's devices held back, kept on its engine: the node's cordons as the node watch
reads them (and the bounded wait for the first read), the devices of DRA claims left from
DRA mode, and the pool's enforcement as checked at start and on every health pass. The
state is ``DeviceHolds`` (agent/holds.py); this applies it to the engine under the
agent's lock and says what changed (Events, metrics, ListAndWatch)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from gpu_share.agent.enforcement import EnforcementStatus, auto_candidates, resolve_auto
from gpu_share.agent.enforcement import check as check_enforcement
from gpu_share.agent.holds import DeviceHolds, report_cordon_change, report_enforcement
from gpu_share.agent.ports import AgentMetrics
from gpu_share.config.model import EnforcementMode, RuntimeConfig
from gpu_share.sharing.cordon import Cordon, diff_cordons, scan_cordons
from gpu_share.sharing.node.engine import AllocationEngine

Say = Callable[[str, str], None]  # a node Event: reason, message


@dataclass
class AgentSide:
    """What the holds need of the agent: its lock, its engine (None before start), the
    change signals (ListAndWatch; metrics and the node annotation) and its node Events."""

    lock: threading.RLock
    engine: Callable[[], AllocationEngine | None]
    bump: Callable[[], object]  # the feed's bump (its new generation is not used)
    inventory_changed: Callable[[], None]
    warn: Say
    event: Say
    metrics: AgentMetrics


class NodeHolds:
    def __init__(self, runtime: RuntimeConfig, domain: str, agent: AgentSide, *,
                 dra: bool = False) -> None:
        self.state = DeviceHolds(runtime.enforcement)
        self._runtime = runtime
        self._in_force = runtime
        self._auto = (auto_candidates(runtime, dra)
                      if runtime.enforcement is EnforcementMode.AUTO else None)
        self._domain = domain
        self._agent = agent

    def runtime(self) -> RuntimeConfig:
        """The pool's runtime with the mode in force (``auto`` resolved; until the first
        check it is still ``auto`` and every device is held back)."""
        return self._in_force

    @property
    def enforcement(self) -> EnforcementStatus:
        """Whether the node can enforce its pool's mode, as last checked."""
        return self.state.enforcement

    def await_cordons(self, timeout_s: float) -> None:
        """Before the agent's start: the node's cordons will come from the node watch.
        Until its first read (``on_node_annotations``), or ``timeout_s`` at most, every
        device is held back (a restarted agent must not offer a cordoned device); past
        the bound they are offered without cordons and a Warning Event says so."""
        self.state.await_cordons(timeout_s)

    def apply(self) -> bool:
        """The engine's cordons as the holds say now; True when they changed. Under the
        lock, after start."""
        engine = self._agent.engine()
        if engine is None:
            return False
        return engine.set_cordons(self.state.held(d.uuid for d in engine.inventory.devices))

    def _changed(self, changed: bool) -> None:
        if changed:
            self._agent.bump()  # ListAndWatch: the held devices' units are unhealthy now
            self._agent.inventory_changed()

    def cordon_wait_over(self) -> None:
        """The health pass: the first read did not come in time (API server down)."""
        if self._agent.engine() is None:
            return
        with self._agent.lock:
            if not self.state.cordon_wait_over():
                return
            changed = self.apply()
        self._agent.warn("CordonsUnread", "the node's cordons could not be read from the API "
                         "server in time; devices are offered without them until it answers")
        self._changed(changed)

    def on_node_annotations(self, annotations: Mapping[str, str]) -> None:
        """The node's cordon annotations changed (the node watch): honour them at once.
        Never raises: a bad value is logged, counted, and cordons its device."""
        holds = self.state
        with self._agent.lock:
            holds.cordons_due = None  # read: no longer held back for want of them
            holds.annotations = dict(annotations)
            engine = self._agent.engine()
            if engine is None:
                return  # the agent's start applies them
            devices = {d.uuid: d.index for d in engine.inventory.devices}
            scan = scan_cordons(annotations, self._domain, devices)
            changes = diff_cordons(holds.cordons, scan.cordons)
            holds.cordons = dict(scan.cordons)
            changed = self.apply()
        holds.report_problems(scan.problems, self._agent.warn,
                              self._agent.metrics.cordon_ignored)
        for change in changes:
            report_cordon_change(change, devices.get(change.device), self._agent.event)
        self._changed(changed)

    def hold_for_dra_claims(self, devices: Collection[str]) -> None:
        """Hold back ``devices`` (those of DRA claims left from DRA mode) or, when
        empty, give them back."""
        with self._agent.lock:
            self.state.dra_held = frozenset(devices)
            changed = self.apply()
        self._changed(changed)

    def check_enforcement(self) -> None:
        """Check the pool's enforcement (start, every health pass); on a change, hold
        every device back or give them back, and say so."""
        with self._agent.lock:
            before = self.state.enforcement
        status = (check_enforcement(self._runtime) if self._auto is None
                  else resolve_auto(self._runtime, self._auto, before))
        with self._agent.lock:
            if status == before:
                return
            self.state.enforcement = status
            if status.mode is not self._in_force.enforcement:
                self._in_force = self._runtime.model_copy(update={"enforcement": status.mode})
            changed = self.apply()
        self._agent.metrics.enforcement(status.mode.value, status.ready)
        report_enforcement(before, status, self._agent.warn, self._agent.event)
        if changed:
            self._agent.bump()
        self._agent.inventory_changed()  # the node's annotation and label say it

    def cordons(self) -> dict[str, Cordon]:
        """The cordons honoured now, by device uuid."""
        with self._agent.lock:
            return dict(self.state.cordons)
