"""Background publishing: annotations and Events never block the kubelet's calls."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpu_share.agent.ports import Publisher
from gpu_share.observability.loops import LoopSupervisor, describe_error

log = logging.getLogger(__name__)

PUBLISHER_LOOP = "publisher"
# An idle publisher still beats this often.
IDLE_BEAT_S = 1.0
# One API call is bounded by the client's timeouts (connect retries + read, about 30 s);
# the loop beats after each call, so only a call stuck far past them fails liveness.
PUBLISHER_MAX_AGE_S = 120.0
# An annotation that could not be written (API server away) is written again after a
# pause that doubles up to the cap, so state catches up once the server is back.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
# Events about one object: a burst, then one per refill period (the kubelet's event
# recorder's defaults). The log and the metrics keep every occurrence; Events are for a
# person reading ``kubectl describe``, and a fault repeated on every kubelet call must
# not become an API write per call.
EVENT_BURST = 25
EVENT_REFILL_S = 300.0
EVENT_OBJECTS_TRACKED = 4096  # the least recently used object's budget is forgotten
EVENT_QUEUE_MAX = 1000


@dataclass(frozen=True)
class _Event:
    namespace: str | None  # None: node event
    name: str
    reason: str
    message: str
    warning: bool


def _ignore(_what: str) -> None:
    pass


class EventBudget:
    """A token bucket per involved object: ``burst`` Events, then one more per
    ``refill_s``; at most ``max_objects`` buckets are kept."""

    def __init__(self, burst: int = EVENT_BURST, refill_s: float = EVENT_REFILL_S,
                 max_objects: int = EVENT_OBJECTS_TRACKED,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._refill_s = refill_s
        self._max = max_objects
        self._clock = clock
        self._tokens: OrderedDict[tuple[str | None, str], tuple[float, float]] = OrderedDict()

    def take(self, obj: tuple[str | None, str]) -> bool:
        """True when an Event about ``obj`` may be sent now (and counts it)."""
        now = self._clock()
        tokens, since = self._tokens.pop(obj, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - since) / self._refill_s)
        ok = tokens >= 1.0
        self._tokens[obj] = (tokens - 1.0 if ok else tokens, now)
        if len(self._tokens) > self._max:
            self._tokens.popitem(last=False)
        return ok


class BackgroundPublisher:
    """Coalesces work: many inventory changes in a burst become one node patch.

    ``node_annotations`` and ``pod_annotations`` are callables evaluated at publish
    time, so the newest state is what gets written.
    """

    def __init__(
        self,
        target: Publisher,
        node_name: str,
        node_annotations: Callable[[], Mapping[str, str | None]],
        pod_annotations: Callable[[str, str], Mapping[str, str | None] | None],
        *,
        enable_node: bool = True,
        enable_pods: bool = True,
        enable_events: bool = True,
        on_error: Callable[[str], None] | None = None,
        node_labels: Callable[[], Mapping[str, str | None]] | None = None,
        on_event_dropped: Callable[[str], None] | None = None,
        event_budget: EventBudget | None = None,
    ) -> None:
        self._target = target
        self._node_name = node_name
        self._node_annotations = node_annotations
        self._node_labels = node_labels
        self._pod_annotations = pod_annotations
        self._enable = (enable_node, enable_pods, enable_events)
        self._on_error = on_error or _ignore
        self._on_dropped = on_event_dropped or _ignore
        self._budget = event_budget or EventBudget()
        self._cond = threading.Condition()
        self._node_dirty = False
        self._pods: set[tuple[str, str]] = set()
        self._events: list[_Event] = []
        self._stopping = False
        self._idle = True
        self._thread: threading.Thread | None = None
        self._done = threading.Event()  # the loop's stop: set after the last pass
        self._retry_s = 0.0  # current pause after a failed annotation (0: none failed)
        self._retry_at = 0.0  # monotonic time before which failed work waits
        self._supervisor: LoopSupervisor | None = None

    def start(self, supervisor: LoopSupervisor | None = None) -> None:
        """Publish from a supervised thread (a failing pass is logged, counted and
        retried; the loop beats its heartbeat at least every ``IDLE_BEAT_S``)."""
        self._supervisor = supervisor or LoopSupervisor()
        self._thread = self._supervisor.spawn(
            PUBLISHER_LOOP, self._step, max_age_s=PUBLISHER_MAX_AGE_S, stop=self._done
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._done.set()  # ends the loop even when the last pass failed

    def node_changed(self) -> None:
        if self._enable[0]:
            with self._cond:
                self._node_dirty = True
                self._cond.notify_all()

    def pod_changed(self, namespace: str, name: str) -> None:
        if self._enable[1]:
            with self._cond:
                self._pods.add((namespace, name))
                self._cond.notify_all()

    def event(
        self, namespace: str | None, name: str, *, reason: str, message: str, warning: bool
    ) -> None:
        if not self._enable[2]:
            return
        with self._cond:
            if not self._budget.take((namespace, name)):
                dropped = "rate_limited"
            elif len(self._events) >= EVENT_QUEUE_MAX:  # bounded: drop rather than grow
                dropped = "queue_full"
            else:
                self._events.append(_Event(namespace, name, reason, message, warning))
                self._cond.notify_all()
                return
        self._on_dropped(dropped)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything queued so far has been attempted (tests, shutdown)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._idle
                and not (self._node_dirty or self._pods or self._events),
                timeout_s,
            )

    def _step(self) -> None:
        """One pass: wait for work (bounded, so the loop beats), publish it."""
        with self._cond:
            self._idle = True
            self._cond.notify_all()
            self._cond.wait_for(self._has_work, IDLE_BEAT_S)
            if not self._has_work():
                return
            pause = self._retry_at - time.monotonic()
            if pause > 0 and not self._stopping:
                self._cond.wait(min(pause, IDLE_BEAT_S))
                return
            node_dirty, self._node_dirty = self._node_dirty, False
            pods, self._pods = self._pods, set()
            events, self._events = self._events, []
            stopping = self._stopping
            self._idle = False
        try:
            failed_node, failed_pods = self._publish(node_dirty, pods, events)
            self._requeue(failed_node, failed_pods)
        except Exception:
            # Annotations are state: publish them again on the next pass. Events are
            # not retried (a duplicate Event is worse than a lost one).
            with self._cond:
                self._node_dirty |= node_dirty
                self._pods |= pods
                self._idle = True
                self._cond.notify_all()
            raise
        if stopping:
            with self._cond:
                self._idle = True
                self._cond.notify_all()
            self._done.set()

    def _requeue(self, node: bool, pods: set[tuple[str, str]]) -> None:
        """Annotations are state: what failed is written again after a growing pause."""
        with self._cond:
            if not (node or pods):
                self._retry_s = 0.0
                return
            self._retry_s = min(RETRY_MAX_S, max(RETRY_FIRST_S, 2 * self._retry_s))
            self._retry_at = time.monotonic() + self._retry_s
            self._node_dirty |= node
            self._pods |= pods

    def _has_work(self) -> bool:
        return self._stopping or self._node_dirty or bool(self._pods or self._events)

    def _publish(
        self, node_dirty: bool, pods: set[tuple[str, str]], events: list[_Event]
    ) -> tuple[bool, set[tuple[str, str]]]:
        """Publishes; returns what failed of the annotations (node, pods)."""
        t = self._target
        labels = {"labels": self._node_labels()} if self._node_labels is not None else {}
        failed_node = node_dirty and not self._guard(
            "annotate_node", t.annotate_node, self._node_name, self._node_annotations(),
            **labels,
        )
        failed_pods: set[tuple[str, str]] = set()
        for ns, name in sorted(pods):
            ann = self._pod_annotations(ns, name)
            if ann and not self._guard("annotate_pod", t.annotate_pod, ns, name, ann):
                failed_pods.add((ns, name))
        for ev in events:
            kw = {"reason": ev.reason, "message": ev.message, "warning": ev.warning}
            if ev.namespace is None:
                self._guard("event", t.node_event, ev.name, **kw)
            else:
                self._guard("event", t.pod_event, ev.namespace, ev.name, **kw)
        return failed_node, failed_pods

    def _guard(self, what: str, fn: Callable[..., object], *args: object, **kw: object) -> bool:
        """True when ``fn`` succeeded; a failure is logged and counted, never raised."""
        ok = False
        try:
            # A target answers False for a write it could not make (and logged).
            ok = fn(*args, **kw) is not False
        except Exception as exc:  # publishing must never take the agent down
            log.warning("%s failed: %s", what, describe_error(exc))
            self._on_error(what)
        if self._supervisor is not None:
            self._supervisor.beat(PUBLISHER_LOOP)
        return ok
