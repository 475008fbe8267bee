"""Prometheus metrics of the agent (and ``ExtenderMetrics``), each table in its own
``prometheus_client.CollectorRegistry``.

One ``Metrics`` object per process; tests make their own (nothing goes to the client's
global registry). All names start with ``gpu_share_``. Label values are small closed
sets (resource names from the config, device uuids from the backend, enum reasons, our
own operation and loop names), never pod names. Labels fed from error reasons or
operation names are capped anyway (``REASON_CAP`` values, then ``families.OVERFLOW``): a
future caller passing text from a request or the API server must not grow the series
without bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from gpu_share.observability.families import Counter, Gauge, Histogram

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
# Labels that carry such free text; each is capped at REASON_CAP wherever it appears.
FREE_TEXT_LABELS = frozenset({"reason", "source", "op", "loop", "watch"})

Family = Counter | Gauge | Histogram
F = TypeVar("F", bound=Family)


class _Spec(Generic[F]):
    """One row of a metrics table: a family's kind, help text, labels and buckets,
    declared as a class attribute of a ``_Table``; its name is the table's prefix and the
    attribute's name. On an instance the attribute is the family built from it."""

    def __init__(
        self, make: Callable[..., F], help_text: str, labels: tuple[str, ...],
        buckets: tuple[float, ...] | None = None,
    ) -> None:
        self.make = make
        self.help = help_text
        self.labels = labels
        self.buckets = buckets

    @overload
    def __get__(self, obj: None, owner: type) -> _Spec[F]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> F: ...
    def __get__(self, obj: object, owner: type) -> _Spec[F] | F:
        # Reached only before _Table.__init__ put the family in the instance's dict.
        if obj is None:
            return self
        raise AttributeError(f"{owner.__name__} is not built yet")

    def build(self, name: str, registry: CollectorRegistry) -> F:
        # The client exports a counter as <name>_total whatever it is given: declare it so.
        if self.make is Counter and not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must be named *_total")
        extra = {} if self.buckets is None else {"buckets": self.buckets}
        family = self.make(name, self.help, self.labels, registry=registry, **extra)
        family.cap_labels({label: REASON_CAP for label in self.labels
                           if label in FREE_TEXT_LABELS})
        return family


def _counter(help_text: str, *labels: str) -> _Spec[Counter]:
    return _Spec(Counter, help_text, labels)


def _gauge(help_text: str, *labels: str) -> _Spec[Gauge]:
    return _Spec(Gauge, help_text, labels)


def _histogram(help_text: str, *labels: str, buckets: tuple[float, ...]) -> _Spec[Histogram]:
    return _Spec(Histogram, help_text, labels, buckets)


class _Table:
    """A set of families declared as ``_Spec`` class attributes, registered in the order
    they are declared."""

    prefix = ""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        for attr, spec in self.specs():
            self.__dict__[attr] = spec.build(f"{self.prefix}{attr}", registry)

    @classmethod
    def specs(cls) -> list[tuple[str, _Spec[Any]]]:
        """The table: (attribute, row) per family, in registration order."""
        rows: dict[str, _Spec[Any]] = {}
        for klass in reversed(cls.__mro__):
            rows.update((k, v) for k, v in vars(klass).items() if isinstance(v, _Spec))
        return list(rows.items())

    def families(self) -> list[tuple[str, _Spec[Any], Family]]:
        """(exported name, row, family) per family, in registration order."""
        return [(f"{self.prefix}{attr}", spec, self.__dict__[attr])
                for attr, spec in self.specs()]

    def render(self) -> bytes:
        """This table's registry in the text exposition format."""
        return generate_latest(self.registry)


class Metrics(_Table):
    """Every metric the agent exports, bound to ``self.registry``."""

    prefix = f"{PREFIX}_"

    allocations_total = _counter(
        "Allocate answers given, by resource and by what decided the device.",
        "resource", "source",
    )
    allocation_failures_total = _counter(
        "Allocate or GetPreferredAllocation calls refused, by error reason.", "resource", "reason"
    )
    degraded_decisions_total = _counter(
        "Placements made without full pod knowledge, by why.", "reason"
    )
    identity_ambiguous_total = _counter(
        "Kubelet calls whose pod/container could not be told apart from another."
    )
    device_units = _gauge(
        "Units of a device by resource and state (used|free).", "device", "resource", "state"
    )
    device_healthy = _gauge("1 when the device is healthy, 0 otherwise.", "device")
    device_cordoned = _gauge(
        "1 when the device takes no new slice (running ones stay): an admin cordoned "
        "it, or DRA claims prepared before a switch to device-plugin mode may hold it; "
        "0 otherwise.",
        "device",
    )
    dra_prepare_failures_total = _counter(
        "DRA claims the agent refused to prepare, by reason (ClaimEnforcementLowered, "
        "EnforcementUnavailable, DeviceCordoned, ClaimOverCapacity, ...).",
        "reason",
    )
    enforcement_ready = _gauge(
        "1 while the node can enforce its pool's mode (no new slices otherwise; "
        "the node Event EnforcementUnavailable says what is missing), 0 otherwise.",
        "mode",
    )
    cordon_annotations_ignored_total = _counter(
        "Cordon annotations on the node the agent ignored, by why (Malformed, "
        "UnknownDevice, TooMany).",
        "reason",
    )
    allocate_seconds = _histogram(
        "Time to answer one kubelet Allocate call.", "resource", buckets=LATENCY_BUCKETS
    )
    preferred_allocation_seconds = _histogram(
        "Time to answer one kubelet GetPreferredAllocation call.", "resource",
        buckets=LATENCY_BUCKETS,
    )
    registrations_total = _counter("Successful registrations with the kubelet, by resource.",
                                   "resource")
    reregistrations_total = _counter(
        "Re-registrations after the kubelet restarted or removed our socket."
    )
    ledger_writes_total = _counter("Writes of the persisted allocation ledger.")
    ledger_write_failures_total = _counter(
        "Writes of the ledger file that failed (disk full, EACCES, ...)."
    )
    ledger_quarantined_total = _counter(
        "Unreadable ledger files moved aside at start, by why.", "reason"
    )
    ledger_anomalies_total = _counter(
        "Loaded ledger entries that cannot be true on this node (kept), by why.", "reason"
    )
    kube_errors_total = _counter(
        "Failed calls to the API server or PodResources, by operation.", "op"
    )
    events_dropped_total = _counter(
        "Events not sent, by why (rate_limited: past an object's burst of 25, then one "
        "per 5 minutes; queue_full); the log keeps each occurrence.",
        "why",
    )
    loop_errors_total = _counter(
        "Failed passes of a supervised background loop (it went on after a pause).", "loop"
    )
    memory_unit_bytes = _gauge(
        "Memory unit size in bytes, configured and in use (they differ while slices "
        "cut in an older size run).",
        "unit",
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry if registry is not None else CollectorRegistry())

    def set_device_units(self, device: str, resource: str, used: int, free: int) -> None:
        self.device_units.labels(device=device, resource=resource, state="used").set(used)
        self.device_units.labels(device=device, resource=resource, state="free").set(free)

    def set_device_healthy(self, device: str, healthy: bool) -> None:
        self.device_healthy.labels(device=device).set(1 if healthy else 0)

    def set_device_cordoned(self, device: str, cordoned: bool) -> None:
        self.device_cordoned.labels(device=device).set(1 if cordoned else 0)

    def forget_device(self, device: str, resources: Iterable[str]) -> None:
        """Drop the series of a device that is gone, so it stops being exported."""
        for resource in resources:  # remove() of a series never made does nothing
            for state in UNIT_STATES:
                self.device_units.remove(device, resource, state)
        self.device_healthy.remove(device)
        self.device_cordoned.remove(device)


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


class _CollectingRegistry(CollectorRegistry):
    """A registry that refreshes scrape-time values (the cluster view's counts) before
    each collection."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Callable[[], None]] = []

    def collect(self) -> Iterator[Metric]:
        for refresh in list(self.collectors):
            refresh()
        yield from super().collect()


class ExtenderMetrics(_Table):
    """Every metric the extender exports, bound to ``self.registry`` (served on its own
    listener, ``--metrics-port``). Series of the closed label sets are made up front, so
    the request path only looks one up and bumps it."""

    prefix = f"{PREFIX}_extender_"
    registry: _CollectingRegistry

    requests_total = _counter(
        "Scheduler requests to the extender, by verb (filter|prioritize|bind|other) and "
        "outcome (ok|error: answered with an Error|refused: 4xx|internal: 500).",
        "verb", "outcome",
    )
    request_duration_seconds = _histogram(
        "Time to answer one scheduler request, body read, by verb.", "verb",
        buckets=EXTENDER_LATENCY_BUCKETS,
    )
    filter_nodes_total = _counter(
        "Candidate nodes of filter calls, by result (passed|failed).", "result"
    )
    binds_total = _counter(
        "Bind calls by outcome (bound|no_fit|pod_not_found|invalid_pod|api_error).", "outcome"
    )
    untrusted_annotations_total = _counter(
        "Pod decision/assignment annotations the cluster view ignored, by why.", "reason"
    )
    view_nodes = _gauge("Nodes with a gpu-share inventory in the extender's cluster view.")
    view_pods = _gauge("Pods asking gpu-share resources in the extender's cluster view.")
    view_lists_total = _counter(
        "Full lists (first sync, relists after 410 or errors, resyncs) per watch.", "watch"
    )
    view_watch_errors_total = _counter(
        "Failed list/watch passes of the cluster view (each relists after a pause).", "watch"
    )

    def __init__(self) -> None:
        super().__init__(_CollectingRegistry())
        # What set_view last exported per (family, watch): counters only take deltas.
        self._view_totals: dict[tuple[str, str], float] = {}
        self._view_lock = threading.Lock()
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
        pairs = (("lists", self.view_lists_total, lists),
                 ("errors", self.view_watch_errors_total, errors))
        with self._view_lock:  # two scrapes at once must not both add one delta
            for kind, family, totals in pairs:
                for watch, total in totals.items():
                    series = family.labels(watch)  # made at 0 on first sight
                    last = self._view_totals.get((kind, watch), 0.0)
                    if total > last:  # a counter never goes down
                        series.inc(total - last)
                        self._view_totals[(kind, watch)] = total
