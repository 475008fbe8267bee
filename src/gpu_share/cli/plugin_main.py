"""``gpu-share-plugin``: the node agent's composition root.

Wires config -> logging -> device backend -> API server access (optional) -> node agent
-> one gRPC server per resource, and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType

from gpu_share.agent.node_agent import AgentMetrics, DeviceRow, NodeAgent
from gpu_share.agent.ports import PodSource, Publisher
from gpu_share.config.loader import load_config
from gpu_share.config.model import AgentConfig
from gpu_share.devices.base import Device
from gpu_share.devices.factory import start_backend
from gpu_share.errors import ConfigError, DeviceBackendError, GpuShareError, KubeAccessError
from gpu_share.observability.http import Heartbeat, start_http
from gpu_share.observability.logging import configure_logging
from gpu_share.observability.metrics import Metrics
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.podresources import PodResourcesClient
from gpu_share.plugin.sizeguard import UnitGroup, check_unit_lists
from gpu_share.sharing.ids import unit_id
from gpu_share.sharing.model import PodView, ResourceKind

log = logging.getLogger("gpu_share.plugin_main")


class PrometheusAgentMetrics(AgentMetrics):
    def __init__(self, m: Metrics) -> None:
        self.m = m

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

    def devices(self, rows: Sequence[DeviceRow]) -> None:
        for row in rows:
            self.m.set_device_healthy(row.device, row.healthy)
            for resource, used, total in row.units:
                self.m.set_device_units(row.device, resource, used, total - used)


class _LazyKube:
    """PodSource + Publisher whose real clients are built in a background thread.

    Importing the generated Kubernetes client costs most of a second and ~15 MiB; doing it
    off the start path lets the plugin register with the kubelet first. Calls made before
    the clients exist wait for them (bounded); when no API server is configured, they act
    as absent (identity from PodResources, no annotations or Events).
    """

    def __init__(self, cfg: AgentConfig, metrics: Metrics) -> None:
        self._cfg = cfg
        self._metrics = metrics
        self._ready = threading.Event()
        self.pods: PodSource | None = None
        self.publisher: Publisher | None = None
        threading.Thread(target=self._build, name="kube-init", daemon=True).start()

    def _build(self) -> None:
        try:
            from gpu_share.kube.client import make_api_client
            from gpu_share.kube.pods import KubePodSource
            from gpu_share.kube.publish import KubePublisher

            try:
                api = make_api_client()
            except KubeAccessError as exc:
                log.warning(
                    "no API server configured; running standalone (identity from"
                    " PodResources, no annotations or Events): %s", exc,
                )
                return
            if self._cfg.identity.use_api_server:
                self.pods = KubePodSource.from_config(api, self._cfg.resources)
            self.publisher = KubePublisher(
                api,
                host_node=self._cfg.node_name,
                on_error=lambda kind, _exc: self._metrics.kube_errors_total.labels(
                    op=kind).inc(),
            )
        finally:
            self._ready.set()

    def _pods(self) -> PodSource:
        self._ready.wait(30.0)
        if self.pods is None:
            raise KubeAccessError("API server client unavailable")
        return self.pods

    def _pub(self) -> Publisher | None:
        self._ready.wait(30.0)
        return self.publisher

    # PodSource
    def get_pod(self, namespace: str, name: str) -> PodView | None:
        return self._pods().get_pod(namespace, name)

    def list_node_pods(self, node_name: str) -> list[PodView]:
        return self._pods().list_node_pods(node_name)

    # Publisher (the agent publishes from a background thread; waiting there is fine)
    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None]) -> None:
        if (p := self._pub()) is not None:
            p.annotate_node(node_name, annotations)

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        if (p := self._pub()) is not None:
            p.annotate_pod(namespace, name, annotations)

    def pod_event(
        self, namespace: str, name: str, *, reason: str, message: str, warning: bool
    ) -> None:
        if (p := self._pub()) is not None:
            p.pod_event(namespace, name, reason=reason, message=message, warning=warning)

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None:
        if (p := self._pub()) is not None:
            p.node_event(node_name, reason=reason, message=message, warning=warning)


def _kube_clients(cfg: AgentConfig, metrics: Metrics) -> tuple[PodSource | None, Publisher | None]:
    """API server access (built in the background), or (None, None) when not wanted."""
    publishes = any((cfg.publish.node_annotation, cfg.publish.pod_annotation, cfg.publish.events))
    if not (cfg.identity.use_api_server or publishes):
        return None, None
    lazy = _LazyKube(cfg, metrics)
    return (lazy if cfg.identity.use_api_server else None), (lazy if publishes else None)


def _guard_sizes(cfg: AgentConfig, devices: Sequence[Device]) -> None:
    """Refuse a config whose ListAndWatch answer would exceed 1 MiB (before any list is
    built: a bad unit size can mean millions of ids)."""
    for kind, resource in (
        (ResourceKind.MEMORY, cfg.resources.memory_resource),
        (ResourceKind.CORE, cfg.resources.core_resource),
    ):

        def groups(unit: int | None, kind: ResourceKind = kind) -> list[UnitGroup]:
            size = unit or cfg.memory_unit_mib
            return [
                (d.uuid, d.memory_mib // size if kind is ResourceKind.MEMORY else 100,
                 d.numa_node)
                for d in devices
            ]

        check_unit_lists(
            resource,
            lambda uuid, i, kind=kind: unit_id(uuid, kind, i),  # type: ignore[misc]
            groups,
            unit_mib=cfg.memory_unit_mib if kind is ResourceKind.MEMORY else None,
        )


def run(cfg: AgentConfig, stop: threading.Event) -> int:
    metrics = Metrics()
    try:
        backend = start_backend(cfg)
    except DeviceBackendError as exc:
        log.error("device backend failed: %s", exc, extra={"reason": exc.reason})
        return 1
    pods, publisher = _kube_clients(cfg, metrics)
    pr = PodResourcesClient(
        cfg.kubelet.pod_resources_socket,
        timeout_s=cfg.kubelet.pod_resources_timeout_seconds,
        resource_names=[cfg.resources.memory_resource, cfg.resources.core_resource],
    )
    agent = NodeAgent(
        cfg, backend, pod_resources=pr, pods=pods, publisher=publisher,
        metrics=PrometheusAgentMetrics(metrics),
    )
    try:
        _guard_sizes(cfg, backend.devices())
        agent.start()
    except GpuShareError as exc:
        log.error("cannot start: %s", exc, extra={"reason": exc.reason})
        agent.stop()
        return 1

    manager = PluginManager(agent.handlers(), cfg.kubelet.device_plugin_dir)
    heartbeat = Heartbeat(max_age_s=30.0)
    http = None
    if cfg.metrics.enabled:
        # Before any socket is served: a port clash must not leave the kubelet with a
        # plugin that registered and vanished.
        try:
            http = start_http(
                metrics.registry,
                bind_address=cfg.metrics.bind_address,
                port=cfg.metrics.port,
                liveness=heartbeat.alive,
                readiness=lambda: all(p.registered for p in manager.plugins),
            )
        except OSError as exc:
            log.error("cannot serve metrics on %s:%s: %s", cfg.metrics.bind_address,
                      cfg.metrics.port, exc)
            agent.stop()
            return 1
        log.info("metrics and probes served", extra={"port": http.port})
    runner = threading.Thread(target=manager.run_until, args=(stop,), name="plugins", daemon=True)
    try:
        manager.start(require_registration=False)
        runner.start()
        seen = {p.handler.resource_name: p.registrations for p in manager.plugins}
        while not stop.wait(0.5):
            if not runner.is_alive():
                log.error("plugin manager stopped unexpectedly")
                return 1
            heartbeat.beat()
            for p in manager.plugins:
                name = p.handler.resource_name
                if p.registrations > seen[name]:
                    metrics.registrations_total.labels(resource=name).inc(
                        p.registrations - seen[name]
                    )
                    if seen[name] > 0:
                        metrics.reregistrations_total.inc()
                        # The kubelet restarted: catch up with what it now knows.
                        threading.Thread(target=agent.reconcile, daemon=True).start()
                    seen[name] = p.registrations
        return 0
    finally:
        log.info("shutting down")
        manager.stop()
        runner.join(timeout=5.0)
        agent.stop()
        pr.close()
        if http is not None:
            http.stop()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"gpu-share-plugin: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.logging.level, cfg.logging.format)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal received", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log.info("starting", extra={"node": cfg.node_name, "backend": cfg.backend.value})
    return run(cfg, stop)


if __name__ == "__main__":
    sys.exit(main())
