"""Run every resource's device-plugin server and keep it registered with the kubelet.

Per resource: serve on ``<dir>/<endpoint>``, register once our server answers, then
watch. When ``kubelet.sock`` is re-created (kubelet restart) or our socket vanishes, the
old server is stopped completely first, a fresh one serves, and only then do we register
again: registering while the old server still ran races in the kubelet
(kubernetes/kubernetes#121994).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpu_share.agent.unixsock import SocketId, socket_identity
from gpu_share.errors import KubeAccessError
from gpu_share.plugin.handler import ResourceHandler
from gpu_share.plugin.registration import (
    KUBELET_SOCKET_NAME,
    RegistrationPolicy,
    register_request,
    register_with_retry,
)
from gpu_share.plugin.server import PluginServer, ServeOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginSettings:
    # How often run_until checks kubelet.sock and our sockets.
    poll_interval_s: float = 0.5
    # After a registration gave up, wait this long before the next round of tries.
    retry_pause_s: float = 2.0
    registration: RegistrationPolicy = field(default_factory=RegistrationPolicy)
    serve: ServeOptions = field(default_factory=ServeOptions)


class ResourcePlugin:
    """Server + registration state of one resource."""

    def __init__(
        self, handler: ResourceHandler, device_plugin_dir: Path, settings: PluginSettings
    ) -> None:
        self.handler = handler
        self.dir = device_plugin_dir
        self.settings = settings
        self.socket_path = device_plugin_dir / handler.endpoint
        self.kubelet_socket = device_plugin_dir / KUBELET_SOCKET_NAME
        self.server: PluginServer | None = None
        self.generation = 0  # servers started so far
        self.registrations = 0  # successful registrations so far
        self._registered_with: SocketId | None = None  # kubelet.sock at last success
        self._next_try = 0.0

    @property
    def registered(self) -> bool:
        return self._registered_with is not None

    def serve(self) -> None:
        """Stop the current server (fully), then serve on a fresh socket."""
        old, self.server = self.server, None
        if old is not None:
            old.stop()
        self._registered_with = None
        self._next_try = 0.0
        server = PluginServer(self.handler, self.socket_path, self.settings.serve)
        server.start()
        self.server = server
        self.generation += 1

    def _still_serving(self) -> bool:
        server = self.server
        return (
            server is not None
            and server.running
            and socket_identity(self.socket_path) == server.identity
        )

    def register(self, abort: threading.Event | None = None) -> None:
        """Register now (bounded retries); raises ``KubeAccessError``."""
        kubelet = socket_identity(self.kubelet_socket)
        register_with_retry(
            self.kubelet_socket,
            self.socket_path,
            register_request(self.handler),
            self.settings.registration,
            abort=abort,
            still_serving=self._still_serving,
        )
        # Remember which kubelet.sock we registered with (read before the call: if it
        # changed meanwhile, the next check registers again).
        self._registered_with = kubelet or socket_identity(self.kubelet_socket)
        self.registrations += 1

    def reconcile(self, abort: threading.Event | None = None) -> None:
        """One watch step: re-serve and re-register where needed."""
        if abort is not None and abort.is_set():
            return  # stopping: never serve again
        kubelet = socket_identity(self.kubelet_socket)
        if self.server is None:
            self.serve()  # the first serve, or a retry after serving failed
        elif not self._still_serving():
            log.warning(
                "%s: our socket %s is gone; serving again",
                self.handler.resource_name,
                self.socket_path,
            )
            self.serve()
        elif self._registered_with is not None and kubelet not in (None, self._registered_with):
            log.warning(
                "%s: kubelet.sock was re-created (kubelet restart); serving again",
                self.handler.resource_name,
            )
            self.serve()
        if self._registered_with is None and kubelet is not None:
            if time.monotonic() < self._next_try:
                return
            try:
                self.register(abort)
            except KubeAccessError as exc:
                log.error("%s", exc)
                self._next_try = time.monotonic() + self.settings.retry_pause_s

    def drain(self, timeout_s: float) -> bool:
        server = self.server
        return server.drain(timeout_s) if server is not None else True

    def stop(self, timeout_s: float | None = None) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop(timeout_s)
        self._registered_with = None


class PluginManager:
    """Serves all resources. ``start()`` then ``run_until(event)``; ``stop()`` from
    anywhere (idempotent, returns within about a second)."""

    def __init__(
        self,
        handlers: Sequence[ResourceHandler],
        device_plugin_dir: str | os.PathLike[str],
        settings: PluginSettings | None = None,
    ) -> None:
        endpoints = [h.endpoint for h in handlers]
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"two handlers share one endpoint: {endpoints}")
        if KUBELET_SOCKET_NAME in endpoints:
            raise ValueError(f"endpoint {KUBELET_SOCKET_NAME} is the kubelet's")
        self.settings = settings or PluginSettings()
        self.dir = Path(device_plugin_dir)
        self.plugins = [ResourcePlugin(h, self.dir, self.settings) for h in handlers]
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # serves/stops never interleave

    @property
    def socket_paths(self) -> list[Path]:
        return [p.socket_path for p in self.plugins]

    def start(self, *, require_registration: bool = True) -> None:
        """Serve every resource, then register each.

        ``require_registration``: raise ``KubeAccessError`` when a registration gives up
        (servers keep running; call ``stop()``). False: log it and let ``run_until``
        keep trying.
        """
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("PluginManager was stopped")
            for plugin in self.plugins:
                plugin.serve()
            for plugin in self.plugins:
                try:
                    plugin.register(self._stopping)
                except KubeAccessError as exc:
                    if require_registration:
                        raise
                    log.error("%s", exc)

    def serve(self) -> None:
        """Serve every resource (no registration: ``reconcile`` registers once
        kubelet.sock is there). Raises ``ServeError`` naming the socket that cannot be
        served; those already serving keep serving (call ``stop()``)."""
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("PluginManager was stopped")
            for plugin in self.plugins:
                plugin.serve()

    def reconcile(self) -> None:
        """One watch step for every resource (``run_until`` calls this in a loop). Each
        resource is tried; the first failure is raised after all were."""
        failure: Exception | None = None
        with self._lock:
            for plugin in self.plugins:
                if self._stopping.is_set():
                    return
                try:
                    plugin.reconcile(self._stopping)
                except Exception as exc:  # one resource's failure must not starve the other
                    failure = failure or exc
        if failure is not None:
            raise failure

    def drain(self, timeout_s: float) -> bool:
        """Every open ListAndWatch stream sends its devices as unhealthy (the kubelet
        then admits no pod against them); True when all did within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for p in self.plugins:
            p.drain(0.0)  # every stream starts at once
        return all([p.drain(max(0.0, deadline - time.monotonic())) for p in self.plugins])

    def run_until(self, stop_event: threading.Event) -> None:
        """Watch and repair until ``stop_event`` is set or ``stop()`` is called; then stop."""
        try:
            while not (stop_event.is_set() or self._stopping.is_set()):
                self.reconcile()
                stop_event.wait(self.settings.poll_interval_s)
        finally:
            self.stop()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and remove our sockets within about ``timeout_s``. Idempotent;
        safe from any thread."""
        deadline = time.monotonic() + timeout_s
        self._stopping.set()  # interrupts registration retries first
        # A registration call in flight holds the lock for at most its call timeout;
        # past the deadline the servers are stopped anyway (each has its own lock).
        locked = self._lock.acquire(timeout=max(0.0, deadline - time.monotonic() - 1.0))
        try:
            for plugin in self.plugins:
                # Past the deadline a server still stops at once (no grace, no waiting).
                plugin.stop(max(0.0, deadline - time.monotonic()))
        finally:
            if locked:
                self._lock.release()
