"""The NVML backend (the only module that loads ``pynvml``, from nvidia-ml-py).

Discovery happens once in ``start()``; the device set is fixed for the life of the
backend (hot-plug is not supported by the kubelet device plugin model either).

Health (``nvml_health``): XID and double-bit ECC events from an NVML event set, lost
devices, recovery after a quiet period. Devices that do not support events stay
healthy; ``notes`` says so.

The ``pynvml`` module and the clock are injectable, for tests.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from gpu_share.config.model import HealthConfig
from gpu_share.devices.base import Device, DeviceNode, HealthEvent, RuntimeNaming
from gpu_share.devices.nvml_api import NvmlApi, NvmlHandle, as_text
from gpu_share.devices.nvml_health import DeviceHealth, DeviceState, NvmlHealth
from gpu_share.devices.nvml_init import init_error
from gpu_share.errors import DeviceBackendError

log = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
# Always needed by CUDA; the uvm nodes are created on demand by nvidia-modprobe, so
# they are only handed out when present (a device spec for a missing host path
# makes the runtime fail the container).
CTL_NODE = "nvidiactl"
OPTIONAL_SHARED_NODES: tuple[str, ...] = ("nvidia-uvm", "nvidia-uvm-tools")
# Events per poll_health call, drained after the first one arrives.
MAX_EVENTS_PER_POLL = 64


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` -> Linux's ``0000:3b:00.0``."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"


class NvmlBackend:
    """``DeviceBackend`` over NVML."""

    name = "nvml"

    def __init__(
        self,
        health: HealthConfig | None = None,
        *,
        nvml: NvmlApi | None = None,
        clock: Callable[[], float] = time.monotonic,
        dev_root: str = "/dev",
        sysfs_root: str = "/sys",
    ) -> None:
        self._nvml_module = nvml
        self._dev_root = dev_root
        self._sysfs_root = sysfs_root
        self._lock = threading.Lock()  # guards _devices and the health states
        self._nvml_lock = threading.Lock()  # serialises event waits against stop()
        self._stop = threading.Event()
        self._devices: list[Device] = []
        self._health = NvmlHealth(health or HealthConfig(), lambda: self.nvml, clock, self._lock)
        self._event_set: NvmlHandle | None = None
        self._started = False
        # Human-readable remarks from discovery (unsupported events, skipped devices).
        self.notes: list[str] = []

    @property
    def nvml(self) -> NvmlApi:
        if self._nvml_module is None:
            # Untyped module: NvmlApi states what we rely on from it.
            self._nvml_module = cast(NvmlApi, importlib.import_module("pynvml"))
        return self._nvml_module

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        n = self.nvml
        try:
            n.nvmlInit()
        except Exception as exc:
            raise init_error(n, exc) from exc
        self._started = True
        self._stop.clear()
        try:
            self._discover()
            self._register_events()
        except Exception:
            self.stop()
            raise
        log.info(
            "nvml backend started",
            extra={"devices": len(self._devices), "driver": self.driver_version()},
        )

    def stop(self) -> None:
        self._stop.set()
        with self._nvml_lock:
            if not self._started:
                return
            self._started = False
            n = self.nvml
            if self._event_set is not None:
                try:
                    n.nvmlEventSetFree(self._event_set)
                except Exception as exc:
                    log.debug("nvmlEventSetFree failed", extra={"error": str(exc)})
                self._event_set = None
            try:
                n.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed", extra={"error": str(exc)})

    def driver_version(self) -> str:
        try:
            return as_text(self.nvml.nvmlSystemGetDriverVersion())
        except Exception:
            return "unknown"

    # ------------------------------------------------------------------ discovery

    def _discover(self) -> None:
        n = self.nvml
        try:
            count = int(n.nvmlDeviceGetCount())
        except n.NVMLError as exc:
            raise DeviceBackendError(
                f"NVML could not count GPUs: {exc}", reason="NvmlQueryFailed"
            ) from exc
        devices: list[Device] = []
        states: dict[str, DeviceState] = {}
        for index in range(count):
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
                dev = self._describe(index, handle)
            except n.NVMLError as exc:
                # One broken GPU must not hide the healthy ones; it is simply not offered.
                note = f"GPU index {index} skipped: NVML query failed: {exc}"
                self.notes.append(note)
                log.warning(note)
                continue
            devices.append(dev)
            states[dev.uuid] = DeviceState(handle=handle)
        with self._lock:
            self._devices = sorted(devices, key=lambda d: d.index)
            self._health.states = states

    def _describe(self, index: int, handle: NvmlHandle) -> Device:
        n = self.nvml
        uuid = as_text(n.nvmlDeviceGetUUID(handle))
        minor = int(n.nvmlDeviceGetMinorNumber(handle))
        memory_mib = int(n.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
        model = as_text(n.nvmlDeviceGetName(handle))
        try:
            nvml_index = int(n.nvmlDeviceGetIndex(handle))
        except n.NVMLError:
            nvml_index = index
        try:
            bus_id = normalize_bus_id(as_text(n.nvmlDeviceGetPciInfo(handle).busId))
        except n.NVMLError:
            bus_id = ""
        return Device(
            uuid=uuid,
            index=nvml_index,
            minor=minor,
            memory_mib=memory_mib,
            model=model,
            numa_node=self._numa_node(handle, bus_id),
            pci_bus_id=bus_id,
            nodes=(
                DeviceNode(
                    host_path=f"{self._dev_root}/nvidia{minor}",
                    container_path=f"/dev/nvidia{minor}",
                ),
            ),
        )

    def _numa_node(self, handle: NvmlHandle, bus_id: str) -> int | None:
        n = self.nvml
        getter = getattr(n, "nvmlDeviceGetNumaNodeId", None)
        if getter is not None:
            try:
                node = int(getter(handle))
                return node if node >= 0 else None
            except n.NVMLError:
                pass  # older drivers: fall back to sysfs
        if not bus_id:
            return None
        path = os.path.join(self._sysfs_root, "bus", "pci", "devices", bus_id, "numa_node")
        try:
            with open(path, encoding="ascii") as fh:
                node = int(fh.read().strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def _register_events(self) -> None:
        n = self.nvml
        wanted = int(n.nvmlEventTypeXidCriticalError) | int(n.nvmlEventTypeDoubleBitEccError)
        try:
            self._event_set = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            note = f"NVML event set unavailable ({exc}); XID health checks are off"
            self.notes.append(note)
            log.warning(note)
            return
        for dev in self._devices:
            self._register_device(dev.uuid, wanted)

    def _register_device(self, uuid: str, wanted: int) -> None:
        n = self.nvml
        state = self._health.states[uuid]
        try:
            supported = int(n.nvmlDeviceGetSupportedEventTypes(state.handle))
        except n.NVMLError:
            supported = 0
        mask = supported & wanted
        if not mask & int(n.nvmlEventTypeXidCriticalError):
            self._note_no_events(uuid, "device does not support XID events")
            return
        try:
            n.nvmlDeviceRegisterEvents(state.handle, mask, self._event_set)
        except n.NVMLError as exc:
            self._note_no_events(uuid, f"registering for events failed: {exc}")
            return
        state.events_registered = True

    def _note_no_events(self, uuid: str, why: str) -> None:
        note = f"{uuid}: {why}; it stays healthy without XID monitoring"
        self.notes.append(note)
        log.warning(note)

    # ------------------------------------------------------------------ protocol

    def devices(self) -> list[Device]:
        with self._lock:
            states = self._health.states
            return [replace(d, healthy=states[d.uuid].healthy) for d in self._devices]

    def naming(self) -> RuntimeNaming:
        names = [CTL_NODE]
        names += [x for x in OPTIONAL_SHARED_NODES if os.path.exists(f"{self._dev_root}/{x}")]
        return RuntimeNaming(
            visible_devices_env=VISIBLE_DEVICES_ENV,
            shared_nodes=tuple(
                DeviceNode(host_path=f"{self._dev_root}/{x}", container_path=f"/dev/{x}")
                for x in names
            ),
            volume_mount_root=VOLUME_MOUNT_ROOT,
        )

    def poll_health(self, timeout_s: float) -> list[HealthEvent]:
        events = self._wait_events(max(timeout_s, 0.0))
        events += self._health.check_presence()
        events += self._health.check_recovery()
        return events

    # ------------------------------------------------------------------ health

    def _wait_events(self, timeout_s: float) -> list[HealthEvent]:
        n = self.nvml
        out: list[HealthEvent] = []
        waited = False
        with self._nvml_lock:
            es = self._event_set if self._started else None
            states = self._health.states.values()
            if es is not None and any(s.events_registered for s in states):
                timeout_ms = int(timeout_s * 1000)
                for _ in range(MAX_EVENTS_PER_POLL):
                    try:
                        data = n.nvmlEventSetWait_v2(es, timeout_ms)
                    except n.NVMLError as exc:
                        if exc.value == n.NVML_ERROR_TIMEOUT:
                            waited = True
                        elif exc.value != n.NVML_ERROR_GPU_IS_LOST:
                            log.warning("waiting for NVML events failed", extra={"error": str(exc)})
                        # GPU lost: the presence check finds which one.
                        break
                    out += self._health.on_event(data)
                    waited = True
                    timeout_ms = 0  # drain what is queued, do not wait again
        if not waited:
            # Nothing to wait on (or NVML failed fast): pace the caller's loop.
            self._stop.wait(timeout_s)
        return out

    def health_detail(self) -> dict[str, DeviceHealth]:
        """Per device: healthy, reason, transient; for probes and status output."""
        return self._health.detail()
