"""Around one kubelet call, outside the engine: the facts it is decided with
(PodResources now, and the pod specs the engine names), and what is said after it (a
degraded decision, notes, an ambiguity, a refusal: log, metric, Event)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpu_share.agent.ports import AgentMetrics, PodResourcesSource, PodSource
from gpu_share.agent.publisher import BackgroundPublisher
from gpu_share.errors import AllocationError, KubeAccessError, event_reason_of, metric_label_of
from gpu_share.sharing.model import ContainerRef, PodResourcesView, PodView
from gpu_share.sharing.node.engine import Allocation, CallContext, Preferred
from gpu_share.sharing.node.ledger import EntrySource, PodKey
from gpu_share.sharing.node.notes import NoteKind, degraded_label, texts

log = logging.getLogger(__name__)


class CallFacts:
    """PodResources and pod specs for a call, read without the agent's lock."""

    def __init__(self, pr: PodResourcesSource | None, pods: PodSource | None,
                 metrics: AgentMetrics, clock: Callable[[], float]) -> None:
        self._pr = pr
        self._pods = pods
        self._metrics = metrics
        self._clock = clock

    def pod_resources(self) -> PodResourcesView | None:
        if self._pr is None:
            return None
        try:
            return self._pr.list()
        except KubeAccessError as exc:
            self._metrics.kube_error("podresources_list")
            log.warning("PodResources unreachable: %s", exc)
            return None

    def node_pods(self, node_name: str) -> list[PodView] | None:
        """The node's pods from the API server (the reconcile loop); None when there is
        no API server to ask or it did not answer."""
        if self._pods is None or not node_name:
            return None
        try:
            return self._pods.list_node_pods(node_name)
        except KubeAccessError as exc:
            self._metrics.kube_error("list_node_pods")
            log.warning("reconcile without pod specs: %s", exc)
            return None

    def context(self, needs: Callable[[PodResourcesView], list[PodKey]]) -> CallContext:
        """PodResources now, and the specs of the pods ``needs`` names (from the pod
        source: the node's watch-fed cache, one GET on a miss)."""
        now = self._clock()
        pr = self.pod_resources()
        if pr is None or self._pods is None:
            return CallContext(pr=pr, pods=None, now=now)
        pods: dict[tuple[str, str], PodView] = {}
        for ns, name in needs(pr):
            try:
                view = self._pods.get_pod(ns, name)
            except KubeAccessError as exc:
                self._metrics.kube_error("get_pod")
                log.warning("API server unreachable for pod %s/%s: %s", ns, name, exc)
                return CallContext(pr=pr, pods=None, now=now)
            if view is not None:
                pods[(ns, name)] = view
        return CallContext(pr=pr, pods=pods, now=now)


class CallReports:
    """What is said after a call: to the log, the metrics and (``publisher``) Events."""

    def __init__(self, metrics: AgentMetrics, publisher: BackgroundPublisher | None,
                 node_name: str) -> None:
        self._metrics = metrics
        self._publisher = publisher
        self._node = node_name

    def after(self, resource: str, result: Preferred | Allocation) -> None:
        # Which entry, on which devices: enough to tell afterwards how a container's two
        # resources were decided.
        where = {"entry": str(result.entry.ref),
                 "devices": [sh.device for sh in result.entry.shares]}
        if result.identity_source is EntrySource.DEGRADED:
            reason = "; ".join(texts(result.notes)) or "pod unknown"
            self._metrics.degraded(degraded_label(result.notes))
            log.warning("degraded decision",
                        extra={"resource": resource, "notes": reason, **where})
            self._event(None, self._node, "DegradedAllocation", f"{resource}: {reason}")
        elif result.notes:
            log.info("allocation notes",
                     extra={"resource": resource, "notes": texts(result.notes), **where})
            ref = result.entry.ref
            for note in result.notes:
                if note.kind is NoteKind.EXTENDER_IGNORED:
                    self._event(ref.namespace, ref.pod_name, "ExtenderDecisionIgnored",
                                note.text)
        if result.ambiguity:
            self._metrics.ambiguous()

    def failed(self, resource: str, exc: AllocationError) -> None:
        self._metrics.failure(resource, metric_label_of(exc))
        ref = exc.ref if isinstance(exc.ref, ContainerRef) else None
        log.warning(
            "allocation failed",
            extra={"resource": resource, "reason": exc.reason, "error": exc.message,
                   "container": str(ref) if ref else None},
        )
        if ref is not None and ref.namespace:
            self._event(ref.namespace, ref.pod_name, event_reason_of(exc),
                        f"container {ref.container_name}: {exc.message}")
        else:
            self._event(None, self._node, event_reason_of(exc), f"{resource}: {exc.message}")

    def _event(self, namespace: str | None, name: str, reason: str, message: str) -> None:
        if self._publisher is not None:
            self._publisher.event(namespace, name, reason=reason, message=message, warning=True)
