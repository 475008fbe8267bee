"""The NVML backend (the only module that touches ``pynvml``, from nvidia-ml-py).

Discovery happens once in ``start()``; the device set is fixed for the life of the
backend (hot-plug is not supported by the kubelet device plugin model either).

Health:
* XID critical errors and double-bit ECC events from an NVML event set.
  XIDs in ``health.ignoredXids`` are the application's fault and change nothing.
  XIDs in ``health.fatalXids`` (and double-bit ECC) mark the device unhealthy for good
  (until the agent restarts). Any other XID is *transient*: the device comes back
  after ``health.recoveryQuietSeconds`` without further XIDs, if NVML then answers a
  handle lookup by uuid and a memory query for it.
* An event NVML cannot attribute to a device marks every device (as NVIDIA's plugin).
* A device answering NVML_ERROR_GPU_IS_LOST is unhealthy with reason "device-lost".
* Devices that do not support events stay healthy; ``notes`` says so.

The ``pynvml`` module and the clock are injectable, for tests.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol, TypedDict, cast

from gpu_share.config.model import DEFAULT_FATAL_XIDS, DEFAULT_IGNORED_XIDS, HealthConfig
from gpu_share.devices.base import Device, DeviceNode, HealthEvent, RuntimeNaming
from gpu_share.errors import DeviceBackendError

log = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
# Always needed by CUDA; the uvm nodes are created on demand by nvidia-modprobe, so
# they are only handed out when present (a device spec for a missing host path
# makes the runtime fail the container).
CTL_NODE = "nvidiactl"
OPTIONAL_SHARED_NODES: tuple[str, ...] = ("nvidia-uvm", "nvidia-uvm-tools")
REASON_DEVICE_LOST = "device-lost"
REASON_RECOVERED = "recovered"
REASON_DBE = "ecc-double-bit"
# Events per poll_health call, drained after the first one arrives.
MAX_EVENTS_PER_POLL = 64


# NVML's opaque ctypes handles (device, event set): only ever passed back to NVML.
NvmlHandle = object


class _NvmlError(Exception):
    value: int  # an NVML_ERROR_* code


class _MemoryInfo(Protocol):
    @property
    def total(self) -> int: ...


class _PciInfo(Protocol):
    @property
    def busId(self) -> str | bytes: ...


class _EventData(Protocol):
    @property
    def device(self) -> NvmlHandle: ...
    @property
    def eventType(self) -> int: ...
    @property
    def eventData(self) -> int: ...


class NvmlApi(Protocol):
    """The part of ``pynvml`` this module uses (nvidia-ml-py ships no type hints)."""

    NVMLError: type[_NvmlError]
    NVML_ERROR_TIMEOUT: int
    NVML_ERROR_GPU_IS_LOST: int
    nvmlEventTypeXidCriticalError: int
    nvmlEventTypeDoubleBitEccError: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> NvmlHandle: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str, /) -> NvmlHandle: ...
    def nvmlDeviceGetUUID(self, handle: NvmlHandle, /) -> str | bytes: ...
    def nvmlDeviceGetMinorNumber(self, handle: NvmlHandle, /) -> int: ...
    def nvmlDeviceGetMemoryInfo(self, handle: NvmlHandle, /) -> _MemoryInfo: ...
    def nvmlDeviceGetName(self, handle: NvmlHandle, /) -> str | bytes: ...
    def nvmlDeviceGetIndex(self, handle: NvmlHandle, /) -> int: ...
    def nvmlDeviceGetPciInfo(self, handle: NvmlHandle, /) -> _PciInfo: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: NvmlHandle, /) -> int: ...
    def nvmlDeviceRegisterEvents(
        self, handle: NvmlHandle, mask: int, event_set: NvmlHandle, /
    ) -> None: ...
    def nvmlEventSetCreate(self) -> NvmlHandle: ...
    def nvmlEventSetFree(self, event_set: NvmlHandle, /) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: NvmlHandle, timeout_ms: int, /) -> _EventData: ...


class DeviceHealth(TypedDict):
    healthy: bool
    reason: str
    transient: bool


@dataclass
class _State:
    handle: NvmlHandle
    healthy: bool = True
    reason: str = ""
    transient: bool = False
    last_error_at: float = 0.0
    events_registered: bool = False


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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
        health = health or HealthConfig()
        self._ignored = frozenset(health.ignored_xids or DEFAULT_IGNORED_XIDS)
        self._fatal = frozenset(health.fatal_xids or DEFAULT_FATAL_XIDS)
        self._quiet_s = health.recovery_quiet_seconds
        self._nvml_module = nvml
        self._clock = clock
        self._dev_root = dev_root
        self._sysfs_root = sysfs_root
        self._lock = threading.Lock()  # guards _devices/_states
        self._nvml_lock = threading.Lock()  # serialises event waits against stop()
        self._stop = threading.Event()
        self._devices: list[Device] = []
        self._states: dict[str, _State] = {}
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
            return _text(self.nvml.nvmlSystemGetDriverVersion())
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
        states: dict[str, _State] = {}
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
            states[dev.uuid] = _State(handle=handle)
        with self._lock:
            self._devices = sorted(devices, key=lambda d: d.index)
            self._states = states

    def _describe(self, index: int, handle: NvmlHandle) -> Device:
        n = self.nvml
        uuid = _text(n.nvmlDeviceGetUUID(handle))
        minor = int(n.nvmlDeviceGetMinorNumber(handle))
        memory_mib = int(n.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
        model = _text(n.nvmlDeviceGetName(handle))
        try:
            nvml_index = int(n.nvmlDeviceGetIndex(handle))
        except n.NVMLError:
            nvml_index = index
        try:
            bus_id = normalize_bus_id(_text(n.nvmlDeviceGetPciInfo(handle).busId))
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
        state = self._states[uuid]
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
            return [replace(d, healthy=self._states[d.uuid].healthy) for d in self._devices]

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
        events += self._check_presence()
        events += self._check_recovery()
        return events

    # ------------------------------------------------------------------ health

    def _wait_events(self, timeout_s: float) -> list[HealthEvent]:
        n = self.nvml
        out: list[HealthEvent] = []
        waited = False
        with self._nvml_lock:
            es = self._event_set if self._started else None
            if es is not None and any(s.events_registered for s in self._states.values()):
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
                    out += self._on_event(data)
                    waited = True
                    timeout_ms = 0  # drain what is queued, do not wait again
        if not waited:
            # Nothing to wait on (or NVML failed fast): pace the caller's loop.
            self._stop.wait(timeout_s)
        return out

    def _uuid_of_event(self, data: _EventData) -> str | None:
        n = self.nvml
        try:
            uuid = _text(n.nvmlDeviceGetUUID(data.device))
        except (n.NVMLError, TypeError, ValueError):
            return None
        return uuid if uuid in self._states else None

    def _on_event(self, data: _EventData) -> list[HealthEvent]:
        n = self.nvml
        etype = int(data.eventType)
        if etype == int(n.nvmlEventTypeXidCriticalError):
            xid = int(data.eventData)
            if xid in self._ignored:
                log.info("ignored application XID", extra={"xid": xid})
                return []
            reason, fatal = f"xid-{xid}", xid in self._fatal
        elif etype == int(n.nvmlEventTypeDoubleBitEccError):
            reason, fatal = REASON_DBE, True
        else:
            return []
        uuid = self._uuid_of_event(data)
        targets = [uuid] if uuid is not None else list(self._states)
        if uuid is None:
            log.warning(
                "NVML event without a known device; marking every device", extra={"reason": reason}
            )
        out = []
        for target in targets:
            event = self._mark_unhealthy(target, reason, transient=not fatal)
            if event is not None:
                out.append(event)
        return out

    def _mark_unhealthy(self, uuid: str, reason: str, *, transient: bool) -> HealthEvent | None:
        transient = transient and self._quiet_s > 0
        with self._lock:
            state = self._states[uuid]
            state.last_error_at = self._clock()  # a new error restarts the quiet period
            if not state.healthy and (state.transient == transient or not state.transient):
                return None  # already unhealthy, and no worse than before
            state.healthy = False
            state.reason = reason
            state.transient = transient
        log.warning(
            "device unhealthy",
            extra={"device": uuid, "reason": reason, "transient": transient},
        )
        return HealthEvent(uuid=uuid, healthy=False, reason=reason, transient=transient)

    def _check_presence(self) -> list[HealthEvent]:
        n = self.nvml
        out: list[HealthEvent] = []
        for uuid, state in self._snapshot():
            if not state.healthy and not state.transient:
                continue  # already unhealthy for good
            try:
                n.nvmlDeviceGetMemoryInfo(state.handle)
            except n.NVMLError as exc:
                if exc.value == n.NVML_ERROR_GPU_IS_LOST:
                    event = self._mark_unhealthy(uuid, REASON_DEVICE_LOST, transient=False)
                    if event is not None:
                        out.append(event)
        return out

    def _check_recovery(self) -> list[HealthEvent]:
        if self._quiet_s <= 0:
            return []
        n = self.nvml
        out: list[HealthEvent] = []
        now = self._clock()
        for uuid, state in self._snapshot():
            if state.healthy or not state.transient:
                continue
            if now - state.last_error_at < self._quiet_s:
                continue
            try:
                handle = n.nvmlDeviceGetHandleByUUID(uuid)
                n.nvmlDeviceGetMemoryInfo(handle)
            except n.NVMLError as exc:
                if exc.value == n.NVML_ERROR_GPU_IS_LOST:
                    event = self._mark_unhealthy(uuid, REASON_DEVICE_LOST, transient=False)
                    if event is not None:
                        out.append(event)
                else:
                    log.info(
                        "device not recovered yet",
                        extra={"device": uuid, "error": str(exc)},
                    )
                continue
            with self._lock:
                if state.healthy or not state.transient or state.last_error_at > now:
                    continue  # changed meanwhile
                state.handle = handle
                state.healthy = True
                state.reason = ""
            log.info("device recovered", extra={"device": uuid})
            out.append(HealthEvent(uuid=uuid, healthy=True, reason=REASON_RECOVERED))
        return out

    def _snapshot(self) -> list[tuple[str, _State]]:
        with self._lock:
            # Live states: only the single health thread mutates them outside the lock.
            return list(self._states.items())

    def health_detail(self) -> dict[str, DeviceHealth]:
        """Per device: healthy, reason, transient; for probes and status output."""
        with self._lock:
            return {
                u: {"healthy": s.healthy, "reason": s.reason, "transient": s.transient}
                for u, s in self._states.items()
            }


# ---------------------------------------------------------------------- init errors

_INIT_HINTS: dict[str, tuple[str, str]] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "NvmlLibraryNotFound",
        "libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed on this node, "
        "or its libraries are not visible in the agent container (run it with the nvidia "
        "runtime class, or mount the driver's lib directory)",
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "NvmlDriverNotLoaded",
        "the NVIDIA kernel driver is not loaded (no /dev/nvidiactl?); check `lsmod | grep "
        "nvidia` and dmesg on the node",
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "NvmlNoPermission",
        "permission denied opening the NVIDIA device nodes; the agent needs access to "
        "/dev/nvidia* (privileged, or the device cgroup allowing them)",
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "NvmlVersionMismatch",
        "the user-space NVML library and the loaded kernel driver have different "
        "versions (driver upgraded without reboot?); reload the driver or reboot the node",
    ),
    "NVML_ERROR_INSUFFICIENT_POWER": (
        "NvmlInitFailed",
        "a GPU reports insufficient external power; check its power cables",
    ),
}


def init_error(nvml: object, exc: BaseException) -> DeviceBackendError:
    """Translate an nvmlInit failure into a DeviceBackendError a person can act on."""
    value = getattr(exc, "value", None)
    for const, (reason, hint) in _INIT_HINTS.items():
        if value is not None and value == getattr(nvml, const, object()):
            return DeviceBackendError(f"NVML init failed: {hint} ({exc})", reason=reason)
    return DeviceBackendError(
        f"NVML init failed: {exc}. Is this a GPU node with the NVIDIA driver installed? "
        "Set failOnInitError: false to run the agent without GPUs.",
        reason="NvmlInitFailed",
    )


def classify_xid(xid: int, ignored: Iterable[int], fatal: Iterable[int]) -> str:
    """'ignored', 'fatal' or 'transient' for one XID (for docs and the probe script)."""
    if xid in set(ignored):
        return "ignored"
    return "fatal" if xid in set(fatal) else "transient"
