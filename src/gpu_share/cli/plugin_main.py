"""``gpu-share-plugin``: the node agent's composition root.

Wires config -> logging -> state-dir lock -> device backend -> API server access
(optional) -> node agent -> one gRPC server per resource, and runs until SIGTERM/SIGINT.

Lifecycle: every start step that can block (NVML init, PodResources, the API server)
runs interruptibly, every background loop is supervised, and a SIGTERM in any state
ends the process within ``EXIT_DEADLINE_S`` (the chart grants 30 s): ListAndWatch
streams first send every device unhealthy (no pod is admitted against a dying agent),
then the servers stop, then the agent; a watchdog ends whatever overran.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gpu_share.agent.cdi import CdiSpecWriter
from gpu_share.agent.dra.ports import CHECKPOINT_FILE
from gpu_share.agent.instance_lock import InstanceLock, InstanceLockError
from gpu_share.agent.node_agent import NodeAgent
from gpu_share.agent.ports import AgentMetrics, DeviceRow
from gpu_share.cli.agent_kube import KUBE_INIT_MAX_AGE_S, LazyKube, kube_clients
from gpu_share.config.loader import InvalidConfigError, load_config
from gpu_share.config.model import AgentConfig
from gpu_share.devices.base import Device, DeviceBackend, RuntimeNaming
from gpu_share.devices.factory import start_backend
from gpu_share.errors import ConfigError, DeviceBackendError, GpuShareError
from gpu_share.observability.http import HttpHandle, start_http
from gpu_share.observability.logging import configure_logging
from gpu_share.observability.loops import Interrupted, LoopSupervisor, interruptible
from gpu_share.observability.metrics import MIB, Metrics
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.podresources import PodResourcesClient
from gpu_share.plugin.sizeguard import guard_devices

if TYPE_CHECKING:  # imported when the API server is wanted, off the path to registration
    from gpu_share.agent.dra.leftovers import DraLeftovers
    from gpu_share.cli.dra_mode import DraFrontEnd
    from gpu_share.dra.server import DraPluginServer

log = logging.getLogger("gpu_share.plugin_main")

# SIGTERM to exit, in every state: at most EXIT_DEADLINE_S (the watchdog's bound); the
# steps below normally need much less.
EXIT_DEADLINE_S = 4.5
DRAIN_TIMEOUT_S = 1.0  # ListAndWatch streams hand the all-unhealthy list to the kubelet
PLUGINS_STOP_TIMEOUT_S = 1.0
AGENT_STOP_TIMEOUT_S = 1.5
# How long a starting agent holds every device back waiting for the node's cordons.
CORDONS_FIRST_READ_S = 60.0
# The DRA-leftovers loop beats once per recheck, after a claim read that may wait for
# the API client.
LEFTOVERS_SLACK_S = KUBE_INIT_MAX_AGE_S + 60.0


class PrometheusAgentMetrics(AgentMetrics):
    def __init__(self, m: Metrics) -> None:
        self.m = m
        self._enforcement_mode: str | None = None

    def observe_call(self, call: str, resource: str, seconds: float) -> None:
        h = self.m.allocate_seconds if call == "allocate" else self.m.preferred_allocation_seconds
        h.labels(resource=resource).observe(seconds)

    def allocation(self, resource: str, source: str) -> None:
        self.m.allocations_total.labels(resource=resource, source=source).inc()

    def failure(self, resource: str, reason: str) -> None:
        self.m.allocation_failures_total.labels(resource=resource, reason=reason).inc()

    def degraded(self, reason: str) -> None:
        self.m.degraded_decisions_total.labels(reason=reason).inc()

    def ambiguous(self) -> None:
        self.m.identity_ambiguous_total.inc()

    def kube_error(self, op: str) -> None:
        self.m.kube_errors_total.labels(op=op).inc()

    def ledger_write(self) -> None:
        self.m.ledger_writes_total.inc()

    def ledger_write_failed(self) -> None:
        self.m.ledger_write_failures_total.inc()

    def ledger_quarantined(self, reason: str) -> None:
        self.m.ledger_quarantined_total.labels(reason=reason).inc()

    def ledger_anomaly(self, reason: str) -> None:
        self.m.ledger_anomalies_total.labels(reason=reason).inc()

    def devices(self, rows: Sequence[DeviceRow]) -> None:
        for row in rows:
            self.m.set_device_healthy(row.device, row.healthy)
            self.m.set_device_cordoned(row.device, row.cordoned)
            for resource, used, total in row.units:
                self.m.set_device_units(row.device, resource, used, total - used)

    def loop_error(self, loop: str) -> None:
        self.m.loop_errors_total.labels(loop=loop).inc()

    def cordon_ignored(self, reason: str) -> None:
        self.m.cordon_annotations_ignored_total.labels(reason=reason).inc()

    def event_dropped(self, why: str) -> None:
        self.m.events_dropped_total.labels(why=why).inc()

    def enforcement(self, mode: str, ready: bool) -> None:
        # One series: the mode in force (``auto`` may change it; an old one left at 0
        # would read as a node that cannot enforce).
        if self._enforcement_mode not in (None, mode):
            self.m.enforcement_ready.remove(self._enforcement_mode)
        self._enforcement_mode = mode
        self.m.enforcement_ready.labels(mode=mode).set(1 if ready else 0)

    def memory_unit(self, configured_mib: int, in_use_mib: int) -> None:
        self.m.memory_unit_bytes.labels(unit="configured").set(configured_mib * MIB)
        self.m.memory_unit_bytes.labels(unit="in-use").set(in_use_mib * MIB)


def _guard_sizes(cfg: AgentConfig, devices: Sequence[Device]) -> None:
    """Refuse a config these devices cannot serve (ListAndWatch over 1 MiB, a device
    smaller than one unit), before any list is built: a bad unit size can mean millions
    of ids. The same check as ``gpu-share config validate`` (InvalidConfigError)."""
    guard_devices(cfg, devices)


def run(cfg: AgentConfig, stop: threading.Event) -> int:
    """Run until ``stop`` is set; the exit code. Returns within a few seconds of
    ``stop`` in every state."""
    metrics = Metrics()
    loops = LoopSupervisor(on_error=PrometheusAgentMetrics(metrics).loop_error)
    lock = InstanceLock(cfg.state_dir)
    try:
        # Before the backend, the ledger or any socket: a second agent on this state
        # dir must change nothing of the first's.
        lock.acquire()
    except InstanceLockError as exc:
        log.error("cannot start: %s", exc, extra={"reason": exc.reason})
        return 1
    node = _Node(cfg, metrics, loops, stop)
    try:
        return node.run()
    finally:
        node.shutdown()
        lock.release()


class _Node:
    """What ``run`` started, so that shutdown stops exactly that, in order."""

    def __init__(
        self, cfg: AgentConfig, metrics: Metrics, loops: LoopSupervisor, stop: threading.Event
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.loops = loops
        self.stop = stop
        self.kube: LazyKube | None = None
        self.pr: PodResourcesClient | None = None
        self.agent: NodeAgent | None = None
        self.manager: PluginManager | None = None
        self.cdi: CdiSpecWriter | None = None
        self.dra: DraFrontEnd | None = None
        self.leftovers_server: DraPluginServer | None = None
        self.leftovers: DraLeftovers | None = None
        self.http: HttpHandle | None = None
        self._seen: dict[str, int] = {}
        self._trimmed = False

    def run(self) -> int:
        try:
            self._start()
        except Interrupted as exc:
            log.info("stopped while starting (%s)", exc)
            return 0
        except DeviceBackendError as exc:
            log.error("device backend failed: %s", exc, extra={"reason": exc.reason})
            return 1
        except InvalidConfigError as exc:
            # Same exit code as a config refused at load: the devices make it invalid.
            log.error("cannot start: %s", exc, extra={"reason": exc.reason})
            return 2
        except GpuShareError as exc:
            log.error("cannot start: %s", exc, extra={"reason": exc.reason})
            return 1
        while not self.stop.wait(1.0):
            pass
        return 0

    def _start(self) -> None:
        cfg, stop = self.cfg, self.stop
        backend = interruptible(lambda: start_backend(cfg), stop, name="backend-start")
        self.kube = kube_clients(cfg, self.metrics, self.loops)
        use_api = self.kube is not None and cfg.identity.use_api_server
        publishes = self.kube is not None and any(
            (cfg.publish.node_annotation, cfg.publish.pod_annotation, cfg.publish.events)
        )
        self.pr = PodResourcesClient(
            cfg.kubelet.pod_resources_socket,
            timeout_s=cfg.kubelet.pod_resources_timeout_seconds,
            resource_names=[cfg.resources.memory_resource, cfg.resources.core_resource],
        )
        agent = self.agent = NodeAgent(
            cfg, backend, pod_resources=self.pr,
            pods=self.kube if use_api else None,
            publisher=self.kube if publishes else None,
            metrics=PrometheusAgentMetrics(self.metrics), loops=self.loops,
        )

        if self.kube is not None:
            # A restarted agent offers no device before it has read the node's cordons.
            agent.holds.await_cordons(CORDONS_FIRST_READ_S)

        def start_agent() -> None:
            _guard_sizes(cfg, backend.devices())
            agent.start()

        interruptible(start_agent, stop, name="agent-start")
        if self.kube is not None:
            # Device cordons (kubectl gpu-share cordon) are honoured within seconds.
            self.kube.watch_cordons(agent.holds.on_node_annotations)
        if cfg.dra.enabled:
            self._start_dra(agent, backend)
            return
        # Before any device is advertised: what DRA claims left on this node may hold
        # takes no slice, and CDI names in a response must resolve.
        self._dra_leftovers(agent)
        self._write_cdi_spec(backend.devices(), backend.naming())
        manager = self.manager = PluginManager(agent.handlers(), cfg.kubelet.device_plugin_dir)
        # Not ready while the node cannot enforce its mode (no new slices then).
        self._serve_http(lambda: agent.enforcement.ready
                         and all(p.registered for p in manager.plugins))
        # Serve now, so that a socket the OS refuses (path too long, another live
        # server) ends the start with its cause; registering waits for kubelet.sock in
        # the supervised loop below, where SIGTERM is answered at once.
        manager.serve()
        self._seen = {p.handler.resource_name: p.registrations for p in manager.plugins}
        self.loops.spawn("plugins", self._plugins_step, max_age_s=_plugins_max_age(manager),
                         stop=stop)

    def _dra_leftovers(self, agent: NodeAgent) -> None:
        """Device-plugin mode: the claims a DRA pool prepared on this node before the
        switch hold their devices until they end (agent/dra/leftovers.py)."""
        if not (Path(self.cfg.dra.plugin_dir) / CHECKPOINT_FILE).exists():
            return  # never a DRA pool here, or nothing left: none of its code is loaded
        from gpu_share.agent.dra.leftovers import RECHECK_S, DraLeftovers
        from gpu_share.dra.server import DraPluginServer

        cfg = self.cfg
        left = DraLeftovers(cfg, hold=agent.holds.hold_for_dra_claims, devices=agent.device_ids,
                            event=agent.warn_node)
        if not left.load():
            return
        # Registered while claims are left: the kubelet tears their pods down only after
        # it has unprepared them. No ResourceSlice is published, so no new claim comes.
        server = self.leftovers_server = DraPluginServer(
            cfg.dra.driver_name, left, plugin_dir=cfg.dra.plugin_dir,
            registration_dir=cfg.dra.registration_dir)
        try:
            server.start()
        except (GpuShareError, OSError) as exc:
            log.error("DRA leftovers: cannot serve unprepare to the kubelet (%s); the "
                      "claims' devices stay held until their claims end", exc)
        done, kube, stop = threading.Event(), self.kube, self.stop

        def step() -> None:
            source = kube.claim_reader() if kube is not None else None
            if left.step(source) or stop.is_set():
                done.set()
                server.stop()
                return
            left.wait(RECHECK_S)  # an unprepare or the agent's stop ends it early

        self.leftovers = left

        self.loops.spawn("dra-leftovers", step, max_age_s=RECHECK_S + LEFTOVERS_SLACK_S,
                         stop=done)

    def _start_dra(self, agent: NodeAgent, backend: DeviceBackend) -> None:
        """DRA mode: the kubelet DRA plugin and the node's ResourceSlice instead of the
        device-plugin servers (cli/dra_mode.py)."""
        from gpu_share.cli.dra_mode import DraFrontEnd

        dra = self.dra = interruptible(
            lambda: DraFrontEnd(self.cfg, agent, backend, self.metrics, self.loops),
            self.stop, name="dra-start",
        )
        self._serve_http(lambda: agent.enforcement.ready and dra.registered)
        dra.start()

    def _serve_http(self, ready: Callable[[], bool]) -> None:
        cfg = self.cfg
        if cfg.metrics.enabled:
            # Before any socket is served: a port clash must not leave the kubelet with a
            # plugin that registered and vanished.
            try:
                self.http = start_http(
                    self.metrics.registry,
                    bind_address=cfg.metrics.bind_address,
                    port=cfg.metrics.port,
                    # 503 naming any loop whose heartbeat is too old.
                    liveness=self.loops.check,
                    readiness=ready,
                )
            except OSError as exc:
                raise GpuShareError(
                    f"cannot serve metrics on {cfg.metrics.bind_address}:{cfg.metrics.port}:"
                    f" {exc}", reason="MetricsPortUnavailable",
                ) from exc
            log.info("metrics and probes served", extra={"port": self.http.port})

    def _plugins_step(self) -> None:
        manager = self.manager
        assert manager is not None and self.agent is not None
        manager.reconcile()
        if not self._trimmed and all(p.registered for p in manager.plugins):
            self._trimmed = True
            _release_start_memory()
        for p in manager.plugins:
            name = p.handler.resource_name
            if p.registrations > self._seen[name]:
                self.metrics.registrations_total.labels(resource=name).inc(
                    p.registrations - self._seen[name]
                )
                if self._seen[name] > 0:
                    self.metrics.reregistrations_total.inc()
                    # The kubelet restarted: catch up with what it now knows.
                    self.agent.request_reconcile()
                self._seen[name] = p.registrations
        self.stop.wait(manager.settings.poll_interval_s)

    def _write_cdi_spec(self, devices: Sequence[Device], naming: RuntimeNaming) -> None:
        """The CDI spec of this node's devices (pools with a CDI device-list strategy;
        nothing otherwise). A failure is reported, not fatal: exiting would crash-loop
        the agent, while containers of a CDI pool fail to start with a clear error."""
        self.cdi = CdiSpecWriter(self.cfg, list(devices), naming)
        try:
            self.cdi.write()
        except OSError as exc:
            log.error("cannot write the CDI spec %s: %s", self.cdi.path, exc,
                      extra={"reason": "CdiSpecUnwritable"})
            self.metrics.loop_errors_total.labels(loop="cdi-spec").inc()
            if self.agent is not None:
                self.agent.warn_node(
                    "CdiSpecUnwritable", f"cannot write the CDI spec {self.cdi.path}: {exc}"
                )

    def shutdown(self) -> None:
        log.info("shutting down")
        self.stop.set()
        if self.kube is not None:
            self.kube.close()
        if self.manager is not None:
            # Tell the kubelet the devices are going before the streams end.
            if not self.manager.drain(DRAIN_TIMEOUT_S):
                log.warning("a ListAndWatch stream did not take the unhealthy device list"
                            " within %.1fs", DRAIN_TIMEOUT_S)
            self.manager.stop(PLUGINS_STOP_TIMEOUT_S)
        self._stop_dra()
        if self.cdi is not None:
            # Transient spec: an uninstall leaves none; the next agent writes it again.
            with contextlib.suppress(OSError):
                self.cdi.remove()
        self.loops.stop_event.set()
        if self.agent is not None:
            self.agent.stop(AGENT_STOP_TIMEOUT_S)
        if self.pr is not None:
            self.pr.close()
        if self.http is not None:
            self.http.stop(0.5)
        log.info("stopped")


    def _stop_dra(self) -> None:
        """The DRA front-end, or the plugin kept for claims left from DRA mode."""
        if self.dra is not None:
            self.dra.stop()
        if self.leftovers_server is not None:
            self.leftovers_server.stop()
        if self.leftovers is not None:
            self.leftovers.wake()


M_ARENA_MAX = -8  # glibc's mallopt parameter number


def _few_malloc_arenas() -> None:
    """At most two glibc malloc arenas (as MALLOC_ARENA_MAX=2 would, but for any way the
    agent is started): its ~20 threads otherwise each get an arena whose freed pages stay
    resident. Before any thread starts; a no-op without glibc."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 2)
    except (OSError, AttributeError):  # not glibc
        pass


def _release_start_memory() -> None:
    """Hand the heap that imports and start-up freed back to the OS (glibc keeps freed
    memory for reuse; about 2 MiB of RSS here). Once, after the first registration."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass


def _plugins_max_age(manager: PluginManager) -> float:
    """One pass may register every resource (each bounded by its retry policy) and
    re-serve it; the heartbeat allows all of that, with room."""
    st = manager.settings
    reg = st.registration
    per_plugin = reg.max_total_s + 2 * reg.call_timeout_s + reg.max_backoff_s
    return len(manager.plugins) * (per_plugin + st.serve.stop_timeout_s) + 60.0


class _ExitWatchdog:
    """Ends the process when shutdown overruns ``EXIT_DEADLINE_S`` -- a call stuck past
    every timeout, or a worker thread the interpreter would wait for at exit."""

    def __init__(self) -> None:
        self.code = 1  # until run() returned
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        if self._timer is None:
            self._timer = threading.Timer(seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        if self.code != 0:
            log.error("shutdown did not finish within %.1fs; exiting now", EXIT_DEADLINE_S)
        _exit_now(self.code)


def _exit_now(code: int) -> None:
    """Exit without waiting for abandoned threads (a kubelet call stuck in its timeout,
    gRPC workers): everything that matters was stopped or written already."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"gpu-share-plugin: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.logging.level, cfg.logging.format)
    _few_malloc_arenas()
    stop = threading.Event()
    watchdog = _ExitWatchdog()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal received", extra={"signal": signal.Signals(signum).name})
        watchdog.arm(EXIT_DEADLINE_S)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log.info("starting", extra={"node": cfg.node_name, "backend": cfg.backend.value})
    code = run(cfg, stop)
    watchdog.code = code
    _exit_now(code)
    return code  # not reached


if __name__ == "__main__":
    sys.exit(main())
