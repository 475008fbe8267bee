"""Prometheus metrics of the agent (and ``ExtenderMetrics``), in dedicated registries
(``observability.prom``).

One ``Metrics`` object per process; tests make their own. All names start with
``gpu_share_``. Label values are small closed sets (resource names from the config,
device uuids from the backend, enum reasons, our own operation and loop names), never
pod names. Labels fed from error reasons or operation names are capped anyway
(``REASON_CAP`` values, then ``prom.OVERFLOW``): a future caller passing text from a
request or the API server must not grow the series without bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping

from gpu_share.observability.prom import Counter, Gauge, Histogram, Registry

PREFIX = "gpu_share"

# Kubelet calls run from ~0.1 ms (cache hit) to ~1 s (API server round trips).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)

UNIT_STATES: tuple[str, ...] = ("used", "free")

MIB = 1024 * 1024  # memory sizes are configured in MiB, exported in bytes (base unit)

# Distinct values kept per free-text label (reason, source, op, loop); each is an enum of
# under 20 values today.
REASON_CAP = 64


class Metrics:
    """Every metric the agent exports, bound to ``self.registry``."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        r = self.registry
        self.allocations_total = Counter(
            f"{PREFIX}_allocations_total",
            "Allocate answers given, by resource and by what decided the device.",
            ["resource", "source"],
            capped={"source": REASON_CAP},
            registry=r,
        )
        self.allocation_failures_total = Counter(
            f"{PREFIX}_allocation_failures_total",
            "Allocate or GetPreferredAllocation calls refused, by error reason.",
            ["resource", "reason"],
            capped={"reason": REASON_CAP},
            registry=r,
        )
        self.degraded_decisions_total = Counter(
            f"{PREFIX}_degraded_decisions_total",
            "Placements made without full pod knowledge, by why.",
            ["reason"],
            capped={"reason": REASON_CAP},
            registry=r,
        )
        self.identity_ambiguous_total = Counter(
            f"{PREFIX}_identity_ambiguous_total",
            "Kubelet calls whose pod/container could not be told apart from another.",
            registry=r,
        )
        self.device_units = Gauge(
            f"{PREFIX}_device_units",
            "Units of a device by resource and state (used|free).",
            ["device", "resource", "state"],
            registry=r,
        )
        self.device_healthy = Gauge(
            f"{PREFIX}_device_healthy",
            "1 when the device is healthy, 0 otherwise.",
            ["device"],
            registry=r,
        )
        self.device_cordoned = Gauge(
            f"{PREFIX}_device_cordoned",
            "1 when the device takes no new slice (running ones stay): an admin cordoned "
            "it, or DRA claims prepared before a switch to device-plugin mode may hold it; "
            "0 otherwise.",
            ["device"],
            registry=r,
        )
        self.dra_prepare_failures_total = Counter(
            f"{PREFIX}_dra_prepare_failures_total",
            "DRA claims the agent refused to prepare, by reason (ClaimEnforcementLowered, "
            "EnforcementUnavailable, DeviceCordoned, ClaimOverCapacity, ...).",
            ["reason"],
            capped={"reason": REASON_CAP},
            registry=r,
        )
        self.enforcement_ready = Gauge(
            f"{PREFIX}_enforcement_ready",
            "1 while the node can enforce its pool's mode (no new slices otherwise; "
            "the node Event EnforcementUnavailable says what is missing), 0 otherwise.",
            ["mode"],
            registry=r,
        )
        self.cordon_annotations_ignored_total = Counter(
            f"{PREFIX}_cordon_annotations_ignored_total",
            "Cordon annotations on the node the agent ignored, by why (Malformed, "
            "UnknownDevice, TooMany).",
            ["reason"],
            capped={"reason": REASON_CAP},
            registry=r,
        )
        self.allocate_seconds = Histogram(
            f"{PREFIX}_allocate_seconds",
            "Time to answer one kubelet Allocate call.",
            ["resource"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.preferred_allocation_seconds = Histogram(
            f"{PREFIX}_preferred_allocation_seconds",
            "Time to answer one kubelet GetPreferredAllocation call.",
            ["resource"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.registrations_total = Counter(
            f"{PREFIX}_registrations_total",
            "Successful registrations with the kubelet, by resource.",
            ["resource"],
            registry=r,
        )
        self.reregistrations_total = Counter(
            f"{PREFIX}_reregistrations_total",
            "Re-registrations after the kubelet restarted or removed our socket.",
            registry=r,
        )
        self.ledger_writes_total = Counter(
            f"{PREFIX}_ledger_writes_total",
            "Writes of the persisted allocation ledger.",
            registry=r,
        )
        self.ledger_write_failures_total = Counter(
            f"{PREFIX}_ledger_write_failures_total",
            "Writes of the ledger file that failed (disk full, EACCES, ...).",
            registry=r,
        )
        self.ledger_quarantined_total = Counter(
            f"{PREFIX}_ledger_quarantined_total",
            "Unreadable ledger files moved aside at start, by why.",
            ["reason"],
            capped={"reason": REASON_CAP},
            registry=r,
        )
        self.ledger_anomalies_total = Counter(
            f"{PREFIX}_ledger_anomalies_total",
            "Loaded ledger entries that cannot be true on this node (kept), by why.",
            ["reason"],
            capped={"reason": REASON_CAP},
            registry=r,
        )
        self.kube_errors_total = Counter(
            f"{PREFIX}_kube_errors_total",
            "Failed calls to the API server or PodResources, by operation.",
            ["op"],
            capped={"op": REASON_CAP},
            registry=r,
        )
        self.loop_errors_total = Counter(
            f"{PREFIX}_loop_errors_total",
            "Failed passes of a supervised background loop (it went on after a pause).",
            ["loop"],
            capped={"loop": REASON_CAP},
            registry=r,
        )
        self.memory_unit_bytes = Gauge(
            f"{PREFIX}_memory_unit_bytes",
            "Memory unit size in bytes, configured and in use (they differ while slices "
            "cut in an older size run).",
            ["unit"],
            registry=r,
        )

    def set_device_units(self, device: str, resource: str, used: int, free: int) -> None:
        self.device_units.labels(device=device, resource=resource, state="used").set(used)
        self.device_units.labels(device=device, resource=resource, state="free").set(free)

    def set_device_healthy(self, device: str, healthy: bool) -> None:
        self.device_healthy.labels(device=device).set(1 if healthy else 0)

    def set_device_cordoned(self, device: str, cordoned: bool) -> None:
        self.device_cordoned.labels(device=device).set(1 if cordoned else 0)

    def forget_device(self, device: str, resources: Iterable[str]) -> None:
        """Drop the series of a device that is gone, so it stops being exported."""
        for resource in resources:
            for state in UNIT_STATES:
                with contextlib.suppress(KeyError):
                    self.device_units.remove(device, resource, state)
        with contextlib.suppress(KeyError):
            self.device_healthy.remove(device)
        with contextlib.suppress(KeyError):
            self.device_cordoned.remove(device)

    def render(self) -> bytes:
        """Text exposition format of this registry."""
        return self.registry.expose()


# -- the extender ----------------------------------------------------------------------

EXTENDER_VERBS: tuple[str, ...] = ("filter", "prioritize", "bind")
OTHER_VERB = "other"  # a request to no route of ours (or one whose line did not parse)
# Outcomes of one extender request: answered (ok), answered with an Error field the
# scheduler acts on (error), refused as malformed (4xx), failed on a bug (internal, 500).
REQUEST_OUTCOMES: tuple[str, ...] = ("ok", "error", "refused", "internal")
BIND_OUTCOMES: tuple[str, ...] = ("bound", "no_fit", "pod_not_found", "invalid_pod", "api_error")
# Filter/prioritize take milliseconds; bind adds API server round trips; the chart's
# scheduler gives up on an extender call after 30 s (httpTimeout).
EXTENDER_LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0,
)


class _CollectingRegistry(Registry):
    """A registry that refreshes scrape-time values (the cluster view's counts) first."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Callable[[], None]] = []

    def expose(self) -> bytes:
        for collect in list(self.collectors):
            collect()
        return super().expose()


class ExtenderMetrics:
    """Every metric the extender exports, bound to ``self.registry`` (served on its own
    listener, ``--metrics-port``). Series of the closed label sets are made up front, so
    the request path only looks one up and bumps it."""

    def __init__(self) -> None:
        self.registry = _CollectingRegistry()
        r = self.registry
        self.requests_total = Counter(
            f"{PREFIX}_extender_requests_total",
            "Scheduler requests to the extender, by verb (filter|prioritize|bind|other) and "
            "outcome (ok|error: answered with an Error|refused: 4xx|internal: 500).",
            ["verb", "outcome"],
            registry=r,
        )
        self.request_duration_seconds = Histogram(
            f"{PREFIX}_extender_request_duration_seconds",
            "Time to answer one scheduler request, body read, by verb.",
            ["verb"],
            buckets=EXTENDER_LATENCY_BUCKETS,
            registry=r,
        )
        self.filter_nodes_total = Counter(
            f"{PREFIX}_extender_filter_nodes_total",
            "Candidate nodes of filter calls, by result (passed|failed).",
            ["result"],
            registry=r,
        )
        self.binds_total = Counter(
            f"{PREFIX}_extender_binds_total",
            "Bind calls by outcome (bound|no_fit|pod_not_found|invalid_pod|api_error).",
            ["outcome"],
            registry=r,
        )
        self.untrusted_annotations_total = Counter(
            f"{PREFIX}_extender_untrusted_annotations_total",
            "Pod decision/assignment annotations the cluster view ignored, by why.",
            ["reason"],
            capped={"reason": REASON_CAP},
            registry=r,
        )
        self.view_nodes = Gauge(
            f"{PREFIX}_extender_view_nodes",
            "Nodes with a gpu-share inventory in the extender's cluster view.",
            registry=r,
        )
        self.view_pods = Gauge(
            f"{PREFIX}_extender_view_pods",
            "Pods asking gpu-share resources in the extender's cluster view.",
            registry=r,
        )
        self.view_lists_total = Counter(
            f"{PREFIX}_extender_view_lists_total",
            "Full lists (first sync, relists after 410 or errors, resyncs) per watch.",
            ["watch"],
            capped={"watch": REASON_CAP},
            registry=r,
        )
        self.view_watch_errors_total = Counter(
            f"{PREFIX}_extender_view_watch_errors_total",
            "Failed list/watch passes of the cluster view (each relists after a pause).",
            ["watch"],
            capped={"watch": REASON_CAP},
            registry=r,
        )
        for verb in (*EXTENDER_VERBS, OTHER_VERB):
            self.request_duration_seconds.labels(verb)
            for outcome in REQUEST_OUTCOMES:
                self.requests_total.labels(verb, outcome)
        for result in ("passed", "failed"):
            self.filter_nodes_total.labels(result)
        for outcome in BIND_OUTCOMES:
            self.binds_total.labels(outcome)

    def observe_request(self, verb: str, outcome: str, seconds: float) -> None:
        self.requests_total.labels(verb, outcome).inc()
        self.request_duration_seconds.labels(verb).observe(seconds)

    def observe_filter(self, passed: int, failed: int) -> None:
        if passed:
            self.filter_nodes_total.labels("passed").inc(passed)
        if failed:
            self.filter_nodes_total.labels("failed").inc(failed)

    def observe_bind(self, outcome: str) -> None:
        self.binds_total.labels(outcome).inc()

    def observe_untrusted(self, reason: str) -> None:
        self.untrusted_annotations_total.labels(reason).inc()

    def set_view(
        self, nodes: int, pods: int, lists: Mapping[str, int], errors: Mapping[str, int]
    ) -> None:
        """The cluster view's counts at scrape time (its own running totals)."""
        self.view_nodes.set(nodes)
        self.view_pods.set(pods)
        pairs = ((self.view_lists_total, lists), (self.view_watch_errors_total, errors))
        for family, totals in pairs:
            for watch, total in totals.items():
                series = family.labels(watch)
                if total > series.get():
                    series.inc(total - series.get())

    def render(self) -> bytes:
        return self.registry.expose()
