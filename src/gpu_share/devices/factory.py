"""Build and start the configured backend (what the composition root calls)."""

from __future__ import annotations

import logging
import threading

from gpu_share.config.model import AgentConfig, BackendKind
from gpu_share.devices.base import Device, DeviceBackend, HealthEvent, RuntimeNaming
from gpu_share.devices.dummy import DummyBackend
from gpu_share.errors import DeviceBackendError

log = logging.getLogger(__name__)


def create_backend(cfg: AgentConfig) -> DeviceBackend:
    """The backend ``cfg.backend`` names, not started yet."""
    if cfg.backend == BackendKind.DUMMY:
        return DummyBackend(cfg.dummy, node_name=cfg.node_name)
    if cfg.backend == BackendKind.NVML:
        # Imported here so nothing else loads pynvml unless NVML is asked for.
        from gpu_share.devices.nvml import NvmlBackend

        return NvmlBackend(cfg.health)
    raise DeviceBackendError(f"unknown backend {cfg.backend!r}", reason="UnknownBackend")


class NoDevicesBackend:
    """Stands in for a backend that failed to start when ``failOnInitError`` is false.

    It offers no devices, so the agent runs (and stays observable) without GPUs.
    """

    def __init__(self, name: str, error: DeviceBackendError, naming: RuntimeNaming) -> None:
        self.name = name
        self.error = error
        self._naming = naming
        self._stop = threading.Event()

    def start(self) -> None:
        self._stop.clear()

    def devices(self) -> list[Device]:
        return []

    def naming(self) -> RuntimeNaming:
        return self._naming

    def driver_version(self) -> str:
        return "unknown"

    def poll_health(self, timeout_s: float) -> list[HealthEvent]:
        self._stop.wait(max(timeout_s, 0.0))
        return []

    def stop(self) -> None:
        self._stop.set()


def start_backend(cfg: AgentConfig, backend: DeviceBackend | None = None) -> DeviceBackend:
    """Create (unless given) and start the backend, honouring ``failOnInitError``.

    Raises DeviceBackendError when start fails and ``cfg.fail_on_init_error`` is true;
    otherwise logs the error and returns a started ``NoDevicesBackend``.
    """
    backend = backend if backend is not None else create_backend(cfg)
    try:
        backend.start()
    except DeviceBackendError as exc:
        if cfg.fail_on_init_error:
            raise
        log.error(
            "device backend failed to start; running without devices (failOnInitError=false)",
            extra={"backend": backend.name, "reason": exc.reason, "error": exc.message},
        )
        fallback = NoDevicesBackend(backend.name, exc, backend.naming())
        fallback.start()
        return fallback
    return backend
