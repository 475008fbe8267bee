"""The agent's API server access, built in the background (``cli/plugin_main.py``): one
object that is the agent's ``PodSource`` and ``Publisher``, the node's cordon watch and
the ResourceClaims reader, each absent until the clients exist and acting as absent when
no API server is configured."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gpu_share.agent.ports import PodSource, Publisher
from gpu_share.config.model import AgentConfig
from gpu_share.errors import KubeAccessError
from gpu_share.observability.loops import LoopSupervisor
from gpu_share.observability.metrics import Metrics
from gpu_share.sharing.model import PodView

if TYPE_CHECKING:  # imported when the API server is wanted, off the path to registration
    from gpu_share.agent.dra.claims import ClaimSource
    from gpu_share.kube.cordon import NodeCordonWatch
    from gpu_share.kube.pods import KubePodSource, NodePodCache
    from gpu_share.kube.rest import RestClient

log = logging.getLogger("gpu_share.plugin_main")

KUBE_INIT_MAX_AGE_S = 120.0  # importing the client and reading its config
CACHE_STOP_TIMEOUT_S = 0.5


class LazyKube:
    """PodSource + Publisher whose real clients are built in a background thread.

    The clients (``kube.rest``, not the generated Kubernetes client) read their config and
    build a TLS context, and the pod cache lists; none of it delays the registration with
    the kubelet. Calls made before
    the clients exist wait for them (bounded); when no API server is configured, they act
    as absent (identity from PodResources, no annotations or Events).
    """

    def __init__(self, cfg: AgentConfig, metrics: Metrics, loops: LoopSupervisor) -> None:
        self._cfg = cfg
        self._metrics = metrics
        self._loops = loops
        self._ready = threading.Event()
        self._closed = threading.Event()
        self.pods: PodSource | None = None
        self._cache: NodePodCache | None = None
        self.publisher: Publisher | None = None
        self.api: RestClient | None = None
        self._claims: ClaimSource | None = None
        self._node_watch: NodeCordonWatch | None = None
        # Supervised: an unexpected failure is logged, counted and retried (callers stop
        # waiting after the first try either way).
        loops.spawn(
            "kube-init", self._build, max_age_s=KUBE_INIT_MAX_AGE_S, stop=self._closed, once=True
        )

    def close(self) -> None:
        """Shutting down: nobody waits for the clients any more."""
        self._closed.set()
        self._ready.set()
        if self._cache is not None:
            self._cache.stop(timeout=CACHE_STOP_TIMEOUT_S)
        if self._node_watch is not None:
            self._node_watch.stop(CACHE_STOP_TIMEOUT_S)

    def claim_reader(self) -> ClaimSource | None:
        """ResourceClaims from the API server once the client exists (bounded wait);
        None without one."""
        from gpu_share.kube.resourceclaims import KubeClaimReader

        self._ready.wait(KUBE_INIT_MAX_AGE_S)
        if self.api is None or self._closed.is_set():
            return None
        if self._claims is None:
            self._claims = KubeClaimReader(self.api)
        return self._claims

    def watch_cordons(self, on_change: Callable[[Mapping[str, str]], None]) -> None:
        """Follow the node's cordon annotations (sharing/cordon.py) once the client
        exists; nothing without an API server or a node name."""
        self._loops.spawn("node-watch-init", lambda: self._start_node_watch(on_change),
                          max_age_s=KUBE_INIT_MAX_AGE_S, stop=self._closed, once=True)

    def _start_node_watch(self, on_change: Callable[[Mapping[str, str]], None]) -> None:
        from gpu_share.kube.cordon import NodeCordonWatch
        from gpu_share.sharing.cordon import cordon_key_prefix

        self._ready.wait()
        if self.api is None or not self._cfg.node_name or self._closed.is_set():
            on_change({})  # no API server: no cordons to wait for
            return
        watch = NodeCordonWatch(
            self.api, self._cfg.node_name, cordon_key_prefix(self._cfg.resources.domain),
            on_change, loops=self._loops,
            on_error=lambda loop: self._metrics.loop_errors_total.labels(loop=loop).inc(),
        )
        watch.start()
        self._node_watch = watch

    def _build(self) -> None:
        try:
            from gpu_share.kube.pods import KubePodSource, NodePodCache
            from gpu_share.kube.publish import KubePublisher
            from gpu_share.kube.rest import make_rest_client

            try:
                api = make_rest_client()
            except KubeAccessError as exc:
                log.warning(
                    "no API server configured; running standalone (identity from"
                    " PodResources, no annotations or Events): %s", exc,
                )
                return
            self.api = api
            if self._cfg.identity.use_api_server:
                source = KubePodSource.from_config(api, self._cfg.resources)
                self.pods = self._node_cache(source, NodePodCache) or source
            self.publisher = KubePublisher(
                api,
                host_node=self._cfg.node_name,
                on_error=lambda kind, _exc: self._metrics.kube_errors_total.labels(
                    op=kind).inc(),
            )
        finally:
            self._ready.set()

    def _node_cache(self, source: KubePodSource, cls: type[NodePodCache]) -> NodePodCache | None:
        """The watch-fed cache of this node's pods: the agent's one pod source (a miss
        is one GET). None without a node name (then every read is a GET)."""
        if not self._cfg.node_name or self._closed.is_set():
            return None
        cache = cls(
            source,
            self._cfg.node_name,
            loops=self._loops,
            on_error=lambda loop: self._metrics.loop_errors_total.labels(loop=loop).inc(),
        )
        cache.start()
        self._cache = cache
        return cache

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
    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None],
                      labels: Mapping[str, str | None] | None = None) -> bool:
        p = self._pub()
        return True if p is None else p.annotate_node(node_name, annotations, labels)

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> bool:
        p = self._pub()
        return True if p is None else p.annotate_pod(namespace, name, annotations)

    def pod_event(
        self, namespace: str, name: str, *, reason: str, message: str, warning: bool
    ) -> None:
        if (p := self._pub()) is not None:
            p.pod_event(namespace, name, reason=reason, message=message, warning=warning)

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None:
        if (p := self._pub()) is not None:
            p.node_event(node_name, reason=reason, message=message, warning=warning)


def kube_clients(cfg: AgentConfig, metrics: Metrics, loops: LoopSupervisor) -> LazyKube | None:
    """API server access (built in the background), or None when not wanted."""
    publishes = any((cfg.publish.node_annotation, cfg.publish.pod_annotation, cfg.publish.events))
    if not (cfg.identity.use_api_server or publishes):
        return None
    return LazyKube(cfg, metrics, loops)
