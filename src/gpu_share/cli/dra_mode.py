"""The agent's DRA front-end (``dra.enabled``): the kubelet DRA plugin and the node's
ResourceSlice, on the same node agent (backend, health, inventory) as device-plugin mode.

The API server is required here: claims are read from it and the slice is written to it.
Started after the agent; stopped before it. A clean exit removes the slice (the kubelet
also drops a gone driver's slices); prepared claims stay prepared (checkpoint + CDI specs).
"""

from __future__ import annotations

import logging

from gpu_share.agent.dra.claims import DraClaimPreparer
from gpu_share.agent.dra.slices import DraSliceLoop
from gpu_share.agent.node_agent import NodeAgent
from gpu_share.config.model import AgentConfig
from gpu_share.devices.base import DeviceBackend
from gpu_share.dra.server import DraPluginServer
from gpu_share.errors import GpuShareError, KubeAccessError
from gpu_share.kube.resourceclaims import KubeClaimReader
from gpu_share.kube.resourceslices import ResourceSlicePublisher
from gpu_share.kube.rest import make_rest_client
from gpu_share.observability.loops import LoopSupervisor
from gpu_share.observability.metrics import Metrics
from gpu_share.sharing.dra.slices import slice_content
from gpu_share.sharing.inventory import Inventory

log = logging.getLogger("gpu_share.dra_mode")

SLICES_STOP_TIMEOUT_S = 1.5


class DraFrontEnd:
    def __init__(
        self,
        cfg: AgentConfig,
        agent: NodeAgent,
        backend: DeviceBackend,
        metrics: Metrics,
        loops: LoopSupervisor,
    ) -> None:
        if not cfg.node_name:
            raise GpuShareError("DRA mode needs the node name (NODE_NAME)",
                                reason="NodeNameRequired")
        try:
            api = make_rest_client()
        except KubeAccessError as exc:
            raise GpuShareError(f"DRA mode needs the API server: {exc}",
                                reason="ApiServerRequired") from exc
        self._agent = agent
        self._loops = loops
        driver = cfg.dra.driver_name
        self.claims = KubeClaimReader(api)
        preparer = DraClaimPreparer(cfg, self.claims, self._inventory, backend.naming(),
                                    enforcement=lambda: agent.enforcement,
                                    on_refused=lambda reason: metrics.dra_prepare_failures_total
                                    .labels(reason=reason).inc())
        self.server = DraPluginServer(
            driver, preparer,
            plugin_dir=cfg.dra.plugin_dir, registration_dir=cfg.dra.registration_dir,
            on_registration_failure=self._registration_failed,
            on_registered=self._registered,
        )

        def kube_error(op: str) -> None:
            metrics.kube_errors_total.labels(op=op).inc()

        version = backend.driver_version()
        self.slices = DraSliceLoop(
            ResourceSlicePublisher(api, node_name=cfg.node_name, driver=driver),
            lambda: slice_content(self._inventory(), node_name=cfg.node_name, driver=driver,
                                  driver_version=version),
            wait_for_change=agent.feed.wait_for_change,
            on_error=kube_error,
        )

    def _inventory(self) -> Inventory:
        engine = self._agent.engine
        if engine is None:
            raise GpuShareError("agent not started")
        return engine.inventory

    def _registered(self) -> None:
        # A kubelet that (re)starts wipes the node's slices: check ours again.
        self.slices.recheck()

    def _registration_failed(self, error: str) -> None:
        self._agent.warn_node("DraRegistrationFailed",
                              f"the kubelet refused the DRA driver: {error}")

    @property
    def registered(self) -> bool:
        return self.server.registration.registered

    def start(self) -> None:
        """Serve the kubelet sockets, then publish: a slice must not name devices no
        plugin can prepare."""
        self.server.start()
        self.slices.start(self._loops)
        log.info("DRA driver serving", extra={"socket": str(self.server.dra_socket)})

    def stop(self) -> None:
        if not self.slices.stop(remove=True, timeout_s=SLICES_STOP_TIMEOUT_S):
            log.warning("the node's ResourceSlice was not removed on exit")
        self.server.stop()
        self.claims.close()
